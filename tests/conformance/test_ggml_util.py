"""ggml.h's small functions (engine/ggml_util.py) against real ggml: conversions, version and
status, op descriptions, index arithmetic, file types, sizes, GUIDs, hints, row validation."""

from __future__ import annotations

import ctypes

import ggml as real
import numpy as np
import pytest

from engine import ggml as eng
from engine.core.errors import GGMLAbortError, GGMLAssertionError
from engine.quants import QUANT_KINDS
from engine.core.types import GGMLType, TYPE_TRAITS

SPECIAL = np.array([0.0, -0.0, 1.0, -2.5, 65504.0, 65520.0, 1e-8, 6e-8, -1e-5, 3.0e38, np.inf, -np.inf,
                    np.nan, 1.00048828125, 2.0 ** -24, 0.1], dtype=np.float32)


def floats(n=2000):
    rng = np.random.default_rng(3)
    return np.concatenate([SPECIAL, (rng.standard_normal(n) * 10.0 ** rng.integers(-6, 6, n)).astype(np.float32)])


def test_half_and_bfloat_conversions():
    x = floats()
    for v in x:
        h = eng.ggml_fp32_to_fp16(float(v))
        assert h == real.ggml_fp32_to_fp16(float(v))
        assert np.array_equal(np.float32(eng.ggml_fp16_to_fp32(h)), np.float32(real.ggml_fp16_to_fp32(h)),
                              equal_nan=True)
        b = eng.ggml_fp32_to_bf16(float(v))
        assert b == real.ggml_fp32_to_bf16(float(v)).bits
        assert np.array_equal(np.float32(eng.ggml_bf16_to_fp32(b)),
                              np.float32(real.ggml_bf16_to_fp32(real.ggml_bf16_t(b))), equal_nan=True)


def test_row_conversions():
    x = floats()
    n = x.size
    h, b = (ctypes.c_uint16 * n)(), (real.ggml_bf16_t * n)()
    xs = x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    real.ggml_fp32_to_fp16_row(xs, h, n)
    real.ggml_fp32_to_bf16_row(xs, b, n)
    theirs_h = np.frombuffer(h, np.uint16)
    theirs_b = np.frombuffer(b, np.uint16)
    assert np.array_equal(eng.ggml_fp32_to_fp16_row(x, n), theirs_h)
    assert np.array_equal(eng.ggml_fp32_to_bf16_row(x, n), theirs_b)
    real.ggml_fp32_to_bf16_row_ref(xs, b, n)
    assert np.array_equal(eng.ggml_fp32_to_bf16_row_ref(x, n), np.frombuffer(b, np.uint16))
    back = (ctypes.c_float * n)()
    real.ggml_fp16_to_fp32_row(h, back, n)
    assert np.array_equal(eng.ggml_fp16_to_fp32_row(theirs_h, n), np.frombuffer(back, np.float32), equal_nan=True)
    real.ggml_bf16_to_fp32_row(b, back, n)
    assert np.array_equal(eng.ggml_bf16_to_fp32_row(theirs_b, n), np.frombuffer(back, np.float32), equal_nan=True)


def test_version_status_and_clocks():
    assert eng.ggml_version() == real.ggml_version().decode()
    assert eng.ggml_commit() == real.ggml_commit().decode()
    for s in (-2, -1, 0, 1):
        assert eng.ggml_status_to_string(s) == real.ggml_status_to_string(s).decode()
    assert eng.ggml_cycles_per_ms() == real.ggml_cycles_per_ms()
    eng.ggml_time_init()
    t0, u0 = eng.ggml_time_ms(), eng.ggml_time_us()
    sum(range(200_000))
    assert eng.ggml_time_us() > u0 and abs(eng.ggml_time_ms() * 1000 - eng.ggml_time_us()) < 5_000 + (u0 - t0 * 1000)


def test_file_types_and_sizes():
    for name in dir(real):
        if name.startswith("GGML_FTYPE_"):
            ftype = getattr(real, name)
            assert getattr(eng, name) == ftype, name
            if name in ("GGML_FTYPE_UNKNOWN", "GGML_FTYPE_MOSTLY_Q4_1_SOME_F16"):
                with pytest.raises(GGMLAssertionError, match="wtype != GGML_TYPE_COUNT"):
                    eng.ggml_ftype_to_ggml_type(ftype)
            else:
                assert eng.ggml_ftype_to_ggml_type(ftype) == real.ggml_ftype_to_ggml_type(ftype), name
    for t in GGMLType:
        if TYPE_TRAITS[t].blck_size:
            assert eng.ggml_type_sizef(t) == real.ggml_type_sizef(int(t)), t.name


def test_guids():
    a = (ctypes.c_ubyte * 16)(*range(16))
    b = (ctypes.c_ubyte * 16)(*range(16))
    c = (ctypes.c_ubyte * 16)(*([0] * 15 + [1]))
    assert real.ggml_guid_matches(ctypes.pointer(a), ctypes.pointer(b)) == eng.ggml_guid_matches(bytes(a), bytes(b))
    assert real.ggml_guid_matches(ctypes.pointer(a), ctypes.pointer(c)) == eng.ggml_guid_matches(bytes(a), bytes(c))


def _both(build):
    """build(api, ctx) on both engines; the results."""
    rctx = real.ggml_init(real.ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    ectx = eng.ggml_init(eng.ggml_init_params(1 << 20))
    try:
        yield build(eng, ectx), build(real, rctx)
    finally:
        real.ggml_free(rctx)


def test_op_descriptions_views_and_hints():
    def build(g, ctx):
        a = g.ggml_new_tensor_2d(ctx, 0, 8, 3)
        b = g.ggml_new_tensor_2d(ctx, 0, 8, 5)
        return [g.ggml_gelu(ctx, a), g.ggml_swiglu(ctx, a), g.ggml_mul_mat(ctx, a, b), g.ggml_view_1d(ctx, a, 4, 0),
                g.ggml_add(ctx, a, a), a]
    for ours, theirs in _both(build):
        for e, r in zip(ours, theirs):
            assert eng.ggml_op_desc(e) == real.ggml_op_desc(r).decode()
            assert eng.ggml_is_view(e) == real.ggml_is_view(r)
        assert eng.ggml_get_unary_op(ours[0]) == real.ggml_get_unary_op(theirs[0])
        assert eng.ggml_get_glu_op(ours[1]) == real.ggml_get_glu_op(theirs[1])
        with pytest.raises(GGMLAssertionError, match="tensor->op == GGML_OP_UNARY"):
            eng.ggml_get_unary_op(ours[4])
        eng.ggml_mul_mat_set_hint(ours[2], eng.GGML_HINT_SRC0_IS_HADAMARD)
        real.ggml_mul_mat_set_hint(theirs[2], real.GGML_HINT_SRC0_IS_HADAMARD)
        assert list(ours[2].op_params) == list(theirs[2].contents.op_params)
        with pytest.raises(GGMLAssertionError, match="a->op == GGML_OP_MUL_MAT"):
            eng.ggml_mul_mat_set_hint(ours[4], 1)


def test_unravel_index_and_graph_nodes():
    def build(g, ctx):
        t = g.ggml_new_tensor_4d(ctx, 0, 5, 4, 3, 2)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, g.ggml_sqr(ctx, g.ggml_add(ctx, t, t)))
        return t, gf
    for (et, egf), (rt, rgf) in _both(build):
        idx = [ctypes.c_int64() for _ in range(4)]
        for i in (0, 1, 4, 5, 19, 20, 59, 60, 119):
            real.ggml_unravel_index(rt, i, *[ctypes.byref(x) for x in idx])
            assert eng.ggml_unravel_index(et, i) == tuple(x.value for x in idx), i
        nodes = real.ggml_graph_nodes(rgf)
        ours = eng.ggml_graph_nodes(egf)
        assert [eng.ggml_op_desc(n) for n in ours] == [real.ggml_op_desc(nodes[i]).decode() for i in range(len(ours))]
        assert len(ours) == real.ggml_graph_n_nodes(rgf)
        assert eng.ggml_get_data(et) == et.data and eng.ggml_get_data(et) is not None


def _rows(t: GGMLType, rng, n_blocks=6):
    tr = TYPE_TRAITS[t]
    return rng.integers(0, 256, n_blocks * tr.type_size, dtype=np.uint8)


BAD_HALVES = {"inf": 0x7C00, "-inf": 0xFC00, "nan": 0x7E01}
VALIDATED = [t for t in GGMLType if TYPE_TRAITS[t].blck_size and t not in (GGMLType.Q8_1,)
             and hasattr(real, f"GGML_TYPE_{t.name}")]


@pytest.mark.parametrize("t", VALIDATED, ids=lambda t: t.name)
def test_validate_row_data(t, capfd):
    rng = np.random.default_rng(int(t))
    rows = []
    clean = _rows(t, rng)
    if t in QUANT_KINDS:  # finite scales first, then break one field of one block at a time
        blocks = clean.view(QUANT_KINDS[t].dtype)
        for f in blocks.dtype.names:
            if blocks.dtype[f] == np.uint16:
                blocks[f] = 0x3C00
            if blocks.dtype[f] == np.float32:
                blocks[f] = 1.0
            if f == "e":
                blocks[f] = 127
        rows.append(clean.copy())
        for f in blocks.dtype.names:
            for bad in ([0x7C00, 0x7E01] if blocks.dtype[f] == np.uint16 else [0xFF] if f == "e" else []):
                for i in (0, 3):
                    b = clean.copy().view(QUANT_KINDS[t].dtype)
                    b[f][i] = bad
                    rows.append(b.view(np.uint8))
            if blocks.dtype[f] == np.float32:
                for bad in (np.inf, np.nan):
                    b = clean.copy().view(QUANT_KINDS[t].dtype)
                    b[f][2] = bad
                    rows.append(b.view(np.uint8))
        if t == GGMLType.IQ1_M:  # its fp16 scale is the top nibbles of the 4 scale words
            for top in ((0x0, 0x0, 0xC, 0x7), (0x1, 0x0, 0xE, 0xF), (0x0, 0x0, 0x0, 0x3)):
                b = clean.copy().view(QUANT_KINDS[t].dtype)
                words = b["scales"][4].copy().view("<u2")
                words[:] = (words & 0x0FFF) | (np.array(top, np.uint16) << 12)
                b["scales"][4] = words.view(np.uint8)
                rows.append(b.view(np.uint8))
        rows.append(rng.integers(0, 256, clean.size, dtype=np.uint8))  # anything goes
    elif t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.F64):
        dt = {GGMLType.F32: np.float32, GGMLType.F16: np.float16, GGMLType.F64: np.float64}.get(t)
        for bad_at in (None, 0, 7, 20, 31):
            for bad in (np.inf, -np.inf, np.nan):
                v = np.linspace(-3, 3, 40).astype(np.float32)
                if bad_at is not None:
                    v[bad_at] = bad
                if t == GGMLType.BF16:
                    rows.append(eng.ggml_fp32_to_bf16_row(v, v.size).view(np.uint8))
                else:
                    rows.append(v.astype(dt).view(np.uint8))
    else:
        rows.append(clean)
    if TYPE_TRAITS[t].type_size > 1:
        rows.append(clean[:-1])  # a size that is not whole blocks
    results = []
    for row in rows:
        buf = np.ascontiguousarray(row)
        theirs = real.ggml_validate_row_data(int(t), buf.ctypes.data, buf.size)
        said_theirs = capfd.readouterr().err
        ours = eng.ggml_validate_row_data(t, buf, buf.size)
        said_ours = capfd.readouterr().err
        assert ours == theirs and said_ours == said_theirs, (t.name, said_ours, said_theirs)
        results.append(ours)
    assert False in results or TYPE_TRAITS[t].type_size == 1  # the uneven size at least
    if t in QUANT_KINDS and t != GGMLType.NVFP4 or t in (GGMLType.F32, GGMLType.F16, GGMLType.BF16):
        assert results.count(False) >= 3 and True in results


def test_abort_and_its_callback():
    heard = []
    old = eng.ggml_set_abort_callback(heard.append)
    try:
        with pytest.raises(GGMLAbortError, match="bad thing 7"):
            eng.ggml_abort("ggml.c", 42, "bad thing %d", 7)
        assert heard == ["ggml.c:42: bad thing 7"]
    finally:
        assert eng.ggml_set_abort_callback(old) == heard.append


def test_log_callback_round_trip():
    lines = []
    old = eng.ggml_log_get()

    def cb(level, text, user):
        lines.append((level, text, user))

    eng.ggml_log_set(cb, "me")
    try:
        assert eng.ggml_log_get() == (cb, "me")
        from engine.ggml_util import log_line
        log_line(eng.GGML_LOG_LEVEL_WARN, "hello\n")
        assert lines == [(eng.GGML_LOG_LEVEL_WARN, "hello\n", "me")]
    finally:
        eng.ggml_log_set(*old)


def test_quantize_init_checks_the_type():
    eng.ggml_quantize_init(GGMLType.IQ2_XXS)
    eng.ggml_quantize_free()
    with pytest.raises(GGMLAssertionError):
        eng.ggml_quantize_init(999)


def test_print_objects_says_what_ggml_logs():
    import re

    from tests.support.gguf_oracle import ggml_log

    def build(g, ctx):
        a = g.ggml_new_tensor_2d(ctx, 0, 4, 3)
        gf = g.ggml_new_graph(ctx)
        g.ggml_build_forward_expand(gf, g.ggml_add(ctx, a, a))
        return ctx

    for ectx, rctx in _both(build):
        with ggml_log() as lines:
            real.ggml_print_objects(rctx)
        ours = eng.ggml_print_objects(ectx).splitlines()
        theirs = "".join(lines).splitlines()
        strip = lambda line: re.sub(r"next = 0x[0-9a-f]+", "next = P", line)  # noqa: E731 - addresses differ
        assert [strip(x) for x in ours[1:]] == [strip(x) for x in theirs[1:]]
        assert ours[-2].endswith("next = (nil)")
        obj = next(iter(ectx.objects()))
        assert eng.ggml_print_object(obj) == ours[1]
