"""Benchmarks against real ggml and gguf-py, printed as ratios (`make bench`)."""

import os

# The engine runs its own compute threads, as ggml does: numpy's BLAS must stay single-threaded
# inside them. Set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
