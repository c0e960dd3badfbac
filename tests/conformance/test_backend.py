"""The CPU backend path of ggml's examples/simple/simple-backend.cpp, on the engine and on real ggml.

Weights in a backend buffer (ggml_backend_alloc_ctx_tensors), data moved in with
ggml_backend_tensor_set, the compute graph placed by a gallocr, computed by
ggml_backend_graph_compute, read back with ggml_backend_tensor_get: the offsets of every tensor
in its buffer, the buffer sizes, and the result bytes must equal real ggml's.
"""

from __future__ import annotations

import ctypes

import ggml as real
import numpy as np
import pytest

from engine import ggml_alloc as alloc  # (ggml-alloc.h, as a C program includes it)
from engine import backend as be
from engine import ggml as eng
from engine.core.errors import GGMLAssertionError

F32 = 0
A = np.array([2, 8, 5, 1, 4, 2, 8, 6], dtype=np.float32)  # 4 x 2, as in simple-backend.cpp
B = np.array([10, 5, 9, 9, 5, 4], dtype=np.float32)  # 3 x 2


def run_engine(rows_a=4, cols=2, rows_b=3, seed=0):
    rng = np.random.default_rng(seed)
    a_vals = A if seed == 0 else rng.uniform(-1, 1, rows_a * cols).astype(np.float32)
    b_vals = B if seed == 0 else rng.uniform(-1, 1, rows_b * cols).astype(np.float32)
    backend = be.ggml_backend_cpu_init()
    ctx = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead() * 2, None, True))
    a = eng.ggml_new_tensor_2d(ctx, F32, cols, rows_a)
    b = eng.ggml_new_tensor_2d(ctx, F32, cols, rows_b)
    buf = alloc.ggml_backend_alloc_ctx_tensors(ctx, backend)
    be.ggml_backend_tensor_set(a, a_vals, 0, eng.ggml_nbytes(a))
    be.ggml_backend_tensor_set(b, b_vals, 0, eng.ggml_nbytes(b))
    ctx0 = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead() * 8 + eng.ggml_graph_overhead(),
                                              None, True))
    gf = eng.ggml_new_graph(ctx0)
    result = eng.ggml_mul_mat(ctx0, a, b)
    eng.ggml_build_forward_expand(gf, result)
    galloc = alloc.ggml_gallocr_new(be.ggml_backend_get_default_buffer_type(backend))
    alloc.ggml_gallocr_alloc_graph(galloc, gf)
    assert be.ggml_backend_graph_compute(backend, gf) == 0
    out = np.frombuffer(be.ggml_backend_tensor_get(result, 0, eng.ggml_nbytes(result)), dtype=np.float32)
    cbuf = be.tensor_buffer(result)
    info = dict(a=a.data - buf.base, b=b.data - buf.base, buf_size=be.ggml_backend_buffer_get_size(buf),
                result=result.data - cbuf.base, compute=alloc.ggml_gallocr_get_buffer_size(galloc, 0),
                same_buffer=be.tensor_buffer(a) is be.tensor_buffer(b) is buf)
    return out, info, (backend, ctx, a, b, result, buf, galloc)


def run_real(rows_a=4, cols=2, rows_b=3, seed=0):
    rng = np.random.default_rng(seed)
    a_vals = A if seed == 0 else rng.uniform(-1, 1, rows_a * cols).astype(np.float32)
    b_vals = B if seed == 0 else rng.uniform(-1, 1, rows_b * cols).astype(np.float32)
    backend = real.ggml_backend_cpu_init()
    ctx = real.ggml_init(real.ggml_init_params(mem_size=real.ggml_tensor_overhead() * 2, mem_buffer=None,
                                               no_alloc=True))
    a = real.ggml_new_tensor_2d(ctx, F32, cols, rows_a)
    b = real.ggml_new_tensor_2d(ctx, F32, cols, rows_b)
    buf = real.ggml_backend_alloc_ctx_tensors(ctx, backend)
    a_c, b_c = np.ascontiguousarray(a_vals), np.ascontiguousarray(b_vals)
    real.ggml_backend_tensor_set(a, a_c.ctypes.data_as(ctypes.c_void_p), 0, real.ggml_nbytes(a))
    real.ggml_backend_tensor_set(b, b_c.ctypes.data_as(ctypes.c_void_p), 0, real.ggml_nbytes(b))
    ctx0 = real.ggml_init(real.ggml_init_params(
        mem_size=real.ggml_tensor_overhead() * 8 + real.ggml_graph_overhead(), mem_buffer=None, no_alloc=True))
    gf = real.ggml_new_graph(ctx0)
    result = real.ggml_mul_mat(ctx0, a, b)
    real.ggml_build_forward_expand(gf, result)
    galloc = real.ggml_gallocr_new(real.ggml_backend_get_default_buffer_type(backend))
    assert real.ggml_gallocr_alloc_graph(galloc, gf)
    assert real.ggml_backend_graph_compute(backend, gf) == 0
    out = np.zeros(real.ggml_nelements(result), dtype=np.float32)
    real.ggml_backend_tensor_get(result, out.ctypes.data_as(ctypes.c_void_p), 0, real.ggml_nbytes(result))
    base = real.ggml_backend_buffer_get_base(buf)
    rc = result.contents
    info = dict(a=a.contents.data - base, b=b.contents.data - base, buf_size=real.ggml_backend_buffer_get_size(buf),
                result=rc.data - real.ggml_backend_buffer_get_base(rc.buffer),
                compute=real.ggml_gallocr_get_buffer_size(galloc, 0),
                same_buffer=a.contents.buffer == b.contents.buffer == buf)
    real.ggml_gallocr_free(galloc)
    real.ggml_free(ctx0)
    real.ggml_free(ctx)
    real.ggml_backend_buffer_free(buf)
    real.ggml_backend_free(backend)
    return out, info


@pytest.mark.parametrize("shape,seed", [((4, 2, 3), 0), ((5, 7, 3), 1), ((33, 17, 9), 2), ((1, 64, 1), 3)])
def test_simple_backend_equals_real_ggml(shape, seed):
    out_e, info_e, _ = run_engine(*shape, seed=seed)
    out_r, info_r = run_real(*shape, seed=seed)
    assert info_e == info_r
    assert out_e.tobytes() == out_r.tobytes()
    if seed == 0:  # simple-backend.cpp prints this matrix
        assert out_e.reshape(3, 4).tolist() == [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]


def test_tensor_data_and_buffer_fields():
    _, _, (backend, ctx, a, b, result, buf, galloc) = run_engine()
    assert be.buffer_field(a) == buf.address != 0
    assert a.data == buf.base and be.ggml_backend_buffer_is_host(buf)
    assert be.ggml_backend_buffer_name(buf) == "CPU"
    assert be.tensor_buffer(result).usage == be.GGML_BACKEND_BUFFER_USAGE_COMPUTE
    be.ggml_backend_buffer_clear(buf, 0)
    assert be.ggml_backend_tensor_get(a, 0, 8) == bytes(8)


def test_misuse_names_ggml_assertions():
    _, _, (backend, ctx, a, b, result, buf, galloc) = run_engine()
    with pytest.raises(GGMLAssertionError, match=r"offset \+ size <= ggml_nbytes\(tensor\)"):
        be.ggml_backend_tensor_set(a, np.zeros(9, np.float32), 0, 36)
    with pytest.raises(GGMLAssertionError, match=r"tensor read out of bounds"):
        be.ggml_backend_tensor_get(a, 4, 32)
    with pytest.raises(GGMLAssertionError, match=r"tensor->buffer == NULL"):
        be.ggml_backend_tensor_alloc(buf, a, buf.base)
    ctx2 = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead(), None, True))
    c = eng.ggml_new_tensor_1d(ctx2, F32, 4)
    with pytest.raises(GGMLAssertionError, match="tensor buffer not set"):
        be.ggml_backend_tensor_set(c, np.zeros(4, np.float32), 0, 16)
    with pytest.raises(GGMLAssertionError, match=r"ggml_backend_buffer_get_alloc_size"):
        be.ggml_backend_tensor_alloc(buf, c, buf.base + buf.size - 8)


def test_ctx_tensors_split_past_max_size():
    # ggml-python cannot make a buffer type with a small max size, so this follows ggml's rule by
    # hand: a new buffer starts when the running size plus the next padded tensor passes max_size
    ctx = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead() * 4, None, True))
    ts = [eng.ggml_new_tensor_1d(ctx, F32, n) for n in (10, 20, 30, 5)]
    small = be.BufferType("CPU", 32, 128)
    assert alloc.ggml_backend_alloc_ctx_tensors_from_buft_size(ctx, small) == 64 + 96 + 128 + 32
    multi = alloc.ggml_backend_alloc_ctx_tensors_from_buft(ctx, small)
    assert be.ggml_backend_buffer_is_multi_buffer(multi) and be.ggml_backend_buffer_get_size(multi) == 320
    bufs = multi.buffers
    assert [b.size for b in bufs] == [64, 96, 128, 32]
    assert [be.tensor_buffer(t) for t in ts] == bufs
    assert all(t.data == b.base for t, b in zip(ts, bufs))
    be.ggml_backend_buffer_set_usage(multi, be.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    assert all(b.usage == be.GGML_BACKEND_BUFFER_USAGE_WEIGHTS for b in bufs)


def test_cpu_backend_identity_equals_real_ggml():
    rb = real.ggml_backend_cpu_init()
    try:
        guid = bytes(ctypes.cast(real.ggml_backend_guid(rb), ctypes.POINTER(ctypes.c_uint8 * 16)).contents)
        rbuft = real.ggml_backend_get_default_buffer_type(rb)
        eb = be.ggml_backend_cpu_init()
        ebuft = be.ggml_backend_get_default_buffer_type(eb)
        assert be.ggml_backend_guid(eb) == guid
        assert be.ggml_backend_name(eb) == real.ggml_backend_name(rb).decode()
        assert be.ggml_backend_buft_name(ebuft) == real.ggml_backend_buft_name(rbuft).decode()
        assert be.ggml_backend_buft_get_alignment(ebuft) == real.ggml_backend_buft_get_alignment(rbuft)
        assert be.ggml_backend_get_alignment(eb) == real.ggml_backend_get_alignment(rb)
        assert be.ggml_backend_buft_get_max_size(ebuft) == real.ggml_backend_buft_get_max_size(rbuft)
        assert be.ggml_backend_get_max_size(eb) == real.ggml_backend_get_max_size(rb)
        assert be.ggml_backend_buft_is_host(ebuft) == real.ggml_backend_buft_is_host(rbuft)
    finally:
        real.ggml_backend_free(rb)


def test_tensor_copy_and_memset():
    _, _, (backend, ctx, a, b, result, buf, galloc) = run_engine()
    ctx2 = eng.ggml_init(eng.ggml_init_params(eng.ggml_tensor_overhead(), None, True))
    c = eng.ggml_new_tensor_2d(ctx2, F32, 2, 4)
    buf2 = alloc.ggml_backend_alloc_ctx_tensors(ctx2, backend)
    be.ggml_backend_tensor_copy(a, c)
    assert be.ggml_backend_tensor_get(c, 0, 32) == A.tobytes()
    be.ggml_backend_tensor_memset(c, 0, 4, 8)
    assert np.frombuffer(be.ggml_backend_tensor_get(c, 0, 32), np.float32).tolist() == [2, 0, 0, 1, 4, 2, 8, 6]
    with pytest.raises(GGMLAssertionError, match="cannot copy tensors with different layouts"):
        be.ggml_backend_tensor_copy(a, b)
    be.ggml_backend_buffer_free(buf2)


def _real_regs():
    """The oracle's registries but RPC's: the oracle is built with ggml's RPC backend (a second
    backend for the scheduler tests, tests/support/rpc_server.py); the engine's own second
    device is a simulated accelerator that a program registers when it wants one."""
    regs = [real.ggml_backend_reg_get(i) for i in range(real.ggml_backend_reg_count())]
    return [r for r in regs if real.ggml_backend_reg_name(r) != b"RPC"]


def test_registry_and_device_equal_real_ggml():
    regs = _real_regs()
    assert [real.ggml_backend_reg_name(r) for r in regs] == [b"CPU"]
    assert be.ggml_backend_reg_count() == len(regs)
    devs = [real.ggml_backend_reg_dev_get(r, j) for r in regs for j in range(real.ggml_backend_reg_dev_count(r))]
    assert be.ggml_backend_dev_count() == len(devs)
    for i, rr in enumerate(regs):
        er = be.ggml_backend_reg_get(i)
        assert be.ggml_backend_reg_name(er) == real.ggml_backend_reg_name(rr).decode()
        assert be.ggml_backend_reg_dev_count(er) == real.ggml_backend_reg_dev_count(rr)
    for i, rd in enumerate(devs):
        ed = be.ggml_backend_dev_get(i)
        assert be.ggml_backend_dev_name(ed) == real.ggml_backend_dev_name(rd).decode()
        assert be.ggml_backend_dev_description(ed) == real.ggml_backend_dev_description(rd).decode()
        assert be.ggml_backend_dev_type(ed) == real.ggml_backend_dev_type(rd)
        assert be.ggml_backend_buft_name(be.ggml_backend_dev_buffer_type(ed)) == \
            real.ggml_backend_buft_name(real.ggml_backend_dev_buffer_type(rd)).decode()
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        real.ggml_backend_dev_memory(rd, ctypes.byref(free), ctypes.byref(total))
        assert be.ggml_backend_dev_memory(ed) == (free.value, total.value)
    for t in (be.GGML_BACKEND_DEVICE_TYPE_CPU, be.GGML_BACKEND_DEVICE_TYPE_GPU):
        assert (be.ggml_backend_dev_by_type(t) is None) == (not real.ggml_backend_dev_by_type(t))
    for name in ("CPU", "cpu", "CUDA0"):
        assert (be.ggml_backend_dev_by_name(name) is None) == (not real.ggml_backend_dev_by_name(name.encode()))
        assert (be.ggml_backend_init_by_name(name, None) is None) == \
            (not real.ggml_backend_init_by_name(name.encode(), None))
    rb = real.ggml_backend_init_best()
    assert be.ggml_backend_name(be.ggml_backend_init_best()) == real.ggml_backend_name(rb).decode()
    assert be.ggml_backend_supports_buft(be.ggml_backend_cpu_init(), be.ggml_backend_cpu_buffer_type()) == \
        real.ggml_backend_supports_buft(rb, real.ggml_backend_get_default_buffer_type(rb))
    real.ggml_backend_free(rb)


def test_graph_plan_compute_equals_graph_compute():
    out_e, _, (backend, ctx, a, b, result, buf, galloc) = run_engine(33, 17, 9, seed=2)
    be.ggml_backend_tensor_memset(result, 0, 0, eng.ggml_nbytes(result))
    gf = eng.ggml_new_graph(eng.ggml_init(eng.ggml_init_params(eng.ggml_graph_overhead(), None, True)))
    eng.ggml_build_forward_expand(gf, result)
    plan = be.ggml_backend_graph_plan_create(backend, gf)
    assert be.ggml_backend_graph_plan_compute(backend, plan) == 0
    be.ggml_backend_graph_plan_free(backend, plan)
    out_r, _ = run_real(33, 17, 9, seed=2)
    assert be.ggml_backend_tensor_get(result, 0, eng.ggml_nbytes(result)) == out_r.tobytes() == out_e.tobytes()
