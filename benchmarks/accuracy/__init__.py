"""Benchmarks of time to accuracy and of the gradient noise scale it rests on."""
