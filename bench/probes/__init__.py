"""One-off studies: each answers one question about a measurement (bench/README.md lists them); not part of
bench/run_all.py's suite."""
