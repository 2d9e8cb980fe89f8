"""Benchmarks: see docs/benchmarks.md and bench/run_all.py."""
