"""ggml-cpu's repacked weights: the interleaved layouts of the CPU_REPACK buffer type (repack.cpp).

On llama.cpp's default CPU path a 2-D weight of a type the build repacks lives in the CPU_REPACK
buffer type, whose set_tensor rewrites its bytes: the blocks of `rows` consecutive rows are
interleaved into one wider block (block_q4_Kx8, block_q4_0x8, ...), `interleave` bytes of quants
from each row in turn, the rows' scales gathered at the front, so that the products
(engine/compute/kernels/repack_*.py: gemv for one activation row, gemm for four at a time) load
the quants of 8 rows at once. The activations are quantized 4 rows at a time into interleaved
blocks of the layout's `vec_dot_type` (ggml_quantize_mat_t).

Which layout a tensor gets is ggml_repack_get_optimal_repack_type's rule for the build the engine
reproduces (the oracle's: AVX2, FMA, F16C, no AVX-512): `optimal_layout`. Each family module
registers its layouts here (LAYOUTS) when the package imports it (engine/quants/__init__.py: a
family imports this module, never the reverse); the bytes are equal to real ggml's (tested against
llama.cpp's ggml, tests/support/llamacpp_ggml.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.core.types import GGMLType


@dataclass(frozen=True, slots=True)
class RepackLayout:
    """One interleaved layout of a quantized type (ggml's tensor_traits<block, INTER_SIZE,
    NB_COLS, PARAM_TYPE>)."""

    name: str  # ggml's own name, as llama.cpp's log prints it: "q4_K_8x8"
    type: GGMLType  # the weights' type
    rows: int  # NB_COLS: the rows interleaved into one block
    interleave: int  # INTER_SIZE: the bytes of quants taken from one row at a time
    vec_dot_type: GGMLType  # the activations' type (Q8_0 or Q8_K), quantized 4 rows at a time
    # (nrows, row_bytes) uint8 -> the buffer's bytes (into out's contiguous bytes, when given)
    pack: Callable[..., np.ndarray]
    unpack: Callable[[np.ndarray], np.ndarray]  # the buffer's bytes -> (nrows, row_bytes) uint8


# every layout the build repacks into, by weight type (filled from the family modules below)
LAYOUTS: dict[GGMLType, RepackLayout] = {}


def register(layout: RepackLayout) -> RepackLayout:
    """Add a family's layout to LAYOUTS (one layout a type: the AVX2 build's choice)."""
    assert layout.type not in LAYOUTS, f"two layouts for {layout.type.name}"
    LAYOUTS[layout.type] = layout
    return layout


def optimal_layout(type_: int, ne: tuple[int, ...] | list[int] | np.ndarray) -> RepackLayout | None:
    """ggml_repack_get_optimal_repack_type for the AVX2 build: the type's layout where its rows
    come in whole groups (ne[1] % rows == 0), else None (the tensor keeps its plain blocks)."""
    layout = LAYOUTS.get(GGMLType(type_))
    if layout is None or ne[1] % layout.rows != 0:
        return None
    return layout
