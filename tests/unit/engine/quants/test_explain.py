"""engine.quants without the oracle: block dtypes, the explainer, scalar refs, bad input."""

from __future__ import annotations

import numpy as np
import pytest

from engine.core.errors import GGMLAssertionError
from engine.quants import QUANT_KINDS, dequantize, ggml_quantize_chunk, quantize
from engine.quants.explain import dequantize_block_ref, explain_block
from engine.core.types import GGMLType as T, traits

REF_TYPES = [T.Q4_0, T.Q4_1, T.Q5_0, T.Q8_0, T.IQ4_NL, T.MXFP4, T.TQ2_0, T.Q2_K, T.Q4_K, T.Q6_K]
X = np.random.default_rng(5).standard_normal((2, 512)).astype(np.float32)


def test_block_dtypes_have_the_c_sizes():
    for t, kind in QUANT_KINDS.items():
        assert kind.dtype.itemsize == traits(t).type_size, t.name


@pytest.mark.parametrize("t", REF_TYPES, ids=lambda t: t.name)
def test_fast_dequantize_equals_scalar_ref(t):
    row = quantize(t, X)[0]
    size, blck = traits(t).type_size, traits(t).blck_size
    fast = dequantize(t, row, 512).reshape(-1, blck)
    for i in range(len(fast)):
        ref = np.array(dequantize_block_ref(t, row[i * size:(i + 1) * size].tobytes()), np.float32)
        assert np.array_equal(ref.view(np.uint32), fast[i].view(np.uint32)), (t.name, i)


def test_explain_q4_k_block():
    row = quantize(T.Q4_K, X)[0].tobytes()
    e = explain_block(T.Q4_K, row, 1)
    assert e.byte_range == (144, 288) and e.element_range == (256, 512)
    names = [f.name for f in e.fields]
    assert names == ["d", "dmin", "scales", "qs"]
    d = e.fields[0]
    assert d.offset == 0 and d.size == 2 and len(d.hex.split()) == 2
    assert isinstance(d.value, float) and d.meaning
    assert len(e.sub_scales.scales) == 8 and len(e.sub_scales.mins) == 8 and len(e.quants) == 256
    assert all(0 <= q <= 15 for q in e.quants)
    assert list(e.values) == dequantize(T.Q4_K, row, 512)[256:].tolist()
    # the values really are d*sc*q - dmin*m from the decoded parts
    dmin = e.fields[1].value
    v = np.float32(d.value) * np.float32(e.sub_scales.scales[0]) * np.float32(e.quants[0]) \
        - np.float32(dmin) * np.float32(e.sub_scales.mins[0])
    assert v == np.float32(e.values[0])


@pytest.mark.parametrize("t", [T.Q4_0, T.Q5_1, T.Q3_K, T.Q5_K, T.Q6_K, T.IQ4_XS, T.TQ1_0,
                               T.NVFP4, T.Q1_0], ids=lambda t: t.name)
def test_explain_quants_rebuild_values(t):
    row = quantize(t, X[:, :512])[0].tobytes()
    e = explain_block(t, row, 0)
    assert len(e.values) == traits(t).blck_size == len(e.quants)
    assert sum(f.size for f in e.fields) == traits(t).type_size


def test_explain_rejects_block_outside_row():
    with pytest.raises(ValueError, match="outside"):
        explain_block(T.Q8_0, bytes(34 * 2), 2)


def test_row_not_multiple_of_block_size():
    with pytest.raises(GGMLAssertionError, match="q4_K"):
        quantize(T.Q4_K, np.zeros((1, 300), np.float32))
    with pytest.raises(GGMLAssertionError, match="k % qk == 0"):
        dequantize(T.Q4_0, bytes(18), 31)


def test_quantize_chunk_asserts_like_ggml():
    dst = np.zeros(4096, np.uint8)
    with pytest.raises(GGMLAssertionError, match=r"start % type_traits\[type\].blck_size == 0"):
        ggml_quantize_chunk(T.Q4_0, X, dst, 16, 1, 512)
    with pytest.raises(GGMLAssertionError, match="start % n_per_row == 0"):
        ggml_quantize_chunk(T.Q4_0, X, dst, 256, 1, 512)
    with pytest.raises(GGMLAssertionError, match="imatrix != NULL"):
        ggml_quantize_chunk(T.IQ2_XXS, X, dst, 0, 1, 512)
    with pytest.raises(ValueError, match="imatrix"):
        ggml_quantize_chunk(T.Q4_K, X, dst, 0, 1, 512, imatrix=np.ones(512, np.float32))
    with pytest.raises(ValueError, match="i32"):
        ggml_quantize_chunk(T.I32, X, dst, 0, 1, 512)


def test_types_without_quantizer_or_to_float():
    with pytest.raises(ValueError, match="iq2_xxs.*importance matrix"):
        quantize(T.IQ2_XXS, X)
    with pytest.raises(ValueError, match="iq1_s.*importance matrix"):
        quantize(T.IQ1_S, X)
    with pytest.raises(ValueError, match="q8_1"):
        dequantize(T.Q8_1, bytes(36), 32)
    with pytest.raises(ValueError, match="i8"):
        dequantize(T.I8, bytes(32), 32)
