"""Test set-up shared by every tier."""

import os

# numpy's BLAS must not start threads of its own inside the engine's compute threads
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
