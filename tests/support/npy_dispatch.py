"""numpy's SIMD dispatch: which run-time-dispatched CPU features this machine gives numpy.

`python -m tests.support.npy_dispatch` prints them, space-separated: the value of
NPY_DISABLE_CPU_FEATURES that lowers numpy to its baseline build (`make test` runs the
exactness-sensitive tests a second time that way).
"""

from __future__ import annotations

import numpy as np


def _umath():
    core = getattr(np, "_core", None) or np.core  # numpy 2 / numpy 1.26
    return core._multiarray_umath


def dispatched_features() -> list[str]:
    """The dispatch targets numpy was built with that it uses on this CPU (beyond the baseline);
    none once NPY_DISABLE_CPU_FEATURES has disabled them."""
    m = _umath()
    return [k for k in m.__cpu_dispatch__ if m.__cpu_features__.get(k)]


if __name__ == "__main__":
    print(" ".join(dispatched_features()))
