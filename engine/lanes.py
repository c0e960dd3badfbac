"""ggml's inner loops, compiled or in numpy: the same bits either way.

The hottest loops of ggml's CPU kernels (the quantized and float dot products, ggml_v_expf and
ggml_v_silu, the soft_max and norm rows, a few block converters, fused multiply-adds) run in C,
`engine._lanes` (engine/c/*.c), because numpy can only do them a block at a time. Each of them
has a numpy twin written for reading, beside the kernel that calls it and registered here with
`@twin("name")`; the twin computes the same bits (tests/unit/engine/test_twins.py holds every C
function against its twin).

`lanes.<name>(...)` is the C function, or its twin when the engine runs in pure-numpy mode: set
GGML_LENS_PURE_NUMPY=1 (or call `use_numpy(True)`), or install without a C compiler, in which case
the extension is absent and the engine says so once.
"""

from __future__ import annotations

import os
import sys
from typing import Callable

try:
    from engine import _lanes as _compiled  # type: ignore[attr-defined]  # (a C extension: mypy reads no .so)
except ImportError:  # installed without a C compiler: the twins do the work
    _compiled = None
    print("ggml-lens: engine._lanes is not built (no C compiler at install): the engine runs "
          "its numpy twins, the same bits, slower", file=sys.stderr)

# the names engine._lanes exports (the method table in engine/c/lanes.c), each a twin's name
NAMES = ("v_expf", "v_silu", "gelu_lookup", "soft_max", "norm_rows", "quant_dot", "quantize_q8_0",
         "quantize_q8_k", "dequantize", "float_dot", "dot_f32", "fmaf", "rope_pairs", "rms_norm_rows",
         "round_floats", "set_rows", "soft_max_heads", "gemv_q4_b32_8x8", "gemm_q4_b32_8x8",
         "quantize_mat_q8_k_4x8", "gemv_q4_k_8x8", "gemm_q4_k_8x8", "pack_q4_k_8x8",
         "tiled_mul_mat", "fa_online", "fa_gemm", "fa_rows")
TWINS: dict[str, Callable] = {}
_pure = os.environ.get("GGML_LENS_PURE_NUMPY", "") not in ("", "0")


def twin(name: str) -> Callable[[Callable], Callable]:
    """Register fn as the numpy twin of engine._lanes.<name>: the same arguments (buffers written
    in place), the same bits."""
    assert name in NAMES, f"engine._lanes exports no {name}"

    def register(fn: Callable) -> Callable:
        assert name not in TWINS, f"two twins of {name}"
        TWINS[name] = fn
        return fn
    return register


def use_numpy(flag: bool = True) -> None:
    """Run the numpy twins (True) or the C loops where they are built (False)."""
    global _pure
    _pure = flag


def pure_numpy() -> bool:
    """Does the engine run the numpy twins?"""
    return _pure or _compiled is None


def compiled():
    """The C module, built or None."""
    return _compiled


class _Lanes:
    """`lanes.quant_dot(...)`: the C loop, or its twin in pure-numpy mode."""

    def __getattr__(self, name: str) -> Callable:
        if name not in NAMES:
            raise AttributeError(name)
        if _compiled is not None and not _pure:
            return getattr(_compiled, name)
        return TWINS[name]


lanes = _Lanes()
