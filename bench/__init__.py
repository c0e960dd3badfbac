"""Benchmarks against real ggml and gguf-py, printed as ratios (`make bench`)."""
