"""The run configuration (torch-free): one ``kw_only`` dataclass per TOML table
(:mod:`~iqtrain.config.sections`) and the root :class:`~iqtrain.config.schema.Config` that reads,
checks, overrides and writes them (:mod:`~iqtrain.config.schema`)."""
