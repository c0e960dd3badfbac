"""ggml-lens' engine: ggml's semantics in Python and numpy (see engine/ggml.py)."""

import os

# The engine runs its own compute threads (as ggml does); numpy's BLAS must not start more of its
# own inside each of them. This only takes effect if numpy has not been imported yet.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
