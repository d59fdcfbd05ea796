"""Benchmarks of the plan's predictions (step and training time, memory, the
search strategies) against what was measured."""
