"""Benchmarks that regenerate the figures in BENCHMARKS.md (`python -m benchmarks --help`)."""
