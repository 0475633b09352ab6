"""Evidence (torch-free): attempt directories, their lock and status, the metric stream, lineage
(parents and what a resume may change), the manifest and the verification behind
``iqtrain verify``."""
