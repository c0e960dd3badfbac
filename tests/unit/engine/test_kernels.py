"""The kernel table tells the truth: every op of ggml's enum is computed, is a view (nothing to
compute), or is listed as not supported with a reason — exactly one of the three."""

from __future__ import annotations

import pytest

from engine.compute.kernels import KERNELS, NOT_SUPPORTED, compute_forward
from engine.errors import GGMLNotSupportedError
from engine.optable import VIEW_OPS, GGMLOp


def test_every_op_has_a_kernel_or_a_reason():
    for op in GGMLOp:
        if op.name == "COUNT":
            continue
        homes = [op in KERNELS, op in VIEW_OPS, op in NOT_SUPPORTED]
        assert sum(homes) == 1, f"{op.name}: kernel {homes[0]}, view {homes[1]}, not supported {homes[2]}"
    assert all(reason.strip() for reason in NOT_SUPPORTED.values())


def test_a_node_without_a_kernel_raises_its_reason():
    class Node:  # the fields compute_forward reads of a tensor
        op, type, src = GGMLOp.FLASH_ATTN_BACK, 0, [None] * 10

    with pytest.raises(GGMLNotSupportedError, match="FLASH_ATTN_BACK is not supported.*ggml_flash_attn_back aborts in ggml 0.15.3"):
        compute_forward(None, Node())
