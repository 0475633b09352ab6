"""The data path (torch-free): SigMF recordings and their windows, the Rust-backed dataset and
training stream, where the recordings come from (globs or the synthetic default), the synthetic
generator, and data identity (fingerprints, content digests, the resume comparison,
``verify --data``)."""
