"""The ``iqtrain`` command (torch-free at import): parse, build, run, exit codes."""
