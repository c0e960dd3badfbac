"""The block structs of the IQ grid types, field for field like ggml-common.h (super-blocks of
256 elements). Their own module, below both the dequantizers (iqgrid.py) and the quantizers
(iqsearch.py), so neither imports the other's module for them."""

from __future__ import annotations

from engine.quants.common import block_dtype

BLOCK_IQ2_XXS = block_dtype(("d", "<u2"), ("qs", "<u2", 32))
BLOCK_IQ2_XS = block_dtype(("d", "<u2"), ("qs", "<u2", 32), ("scales", "u1", 8))
BLOCK_IQ2_S = block_dtype(("d", "<u2"), ("qs", "u1", 64), ("qh", "u1", 8), ("scales", "u1", 8))
BLOCK_IQ3_XXS = block_dtype(("d", "<u2"), ("qs", "u1", 96))
BLOCK_IQ3_S = block_dtype(("d", "<u2"), ("qs", "u1", 64), ("qh", "u1", 8), ("signs", "u1", 32),
                          ("scales", "u1", 4))
BLOCK_IQ1_S = block_dtype(("d", "<u2"), ("qs", "u1", 32), ("qh", "<u2", 8))
BLOCK_IQ1_M = block_dtype(("qs", "u1", 32), ("qh", "u1", 16), ("scales", "u1", 8))
