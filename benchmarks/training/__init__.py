"""Benchmarks of the training strategies: AGS's overhead, Table I, tuning."""
