"""attnlab benchmarks: run `python -m benchmarks --help` (or `attnlab bench`)."""
