"""Benchmarks of what a user waits for: first contact, the demo's start-up, profiling's
wall, a user's own model."""
