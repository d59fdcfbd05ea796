"""The GPU acceptance run: its Ray-free half, then the Ray half where Ray is importable."""
