"""llama.cpp's own ggml computing mul_mat, in a child process: the oracle for the products
only llama.cpp's build runs -- llamafile's sgemm (tinyBLAS; ggml-python's build has no
GGML_USE_LLAMAFILE), the repacked weights of the CPU_REPACK buffer type, the tiled K-quant
products -- and for the repacked bytes themselves.

The child loads the libggml-base and libggml-cpu that llama-cpp-python ships (AVX2, FMA, F16C,
llamafile: checked there) through ctypes, without importing llama_cpp or ggml-python (one ggml
library per process, as tests/support/llamacpp_run.py explains); for each job it builds
dst = ggml_mul_mat(w, x) in a context of its own and computes it with
ggml_graph_compute_with_ctx, or, with `repack`, places w in a CPU_REPACK buffer (its set_tensor
repacks the bytes; the job also returns them as they lie there) and x and dst in a CPU buffer,
and computes the graph on the CPU backend. A job with `ids` is dst = ggml_mul_mat_id(w, x, ids)
instead: w the experts (k, rows, n_as), x (tokens, n_b, k), ids (tokens, n_used) int32, dst
(tokens, n_used, rows); with `repack`, the 3-D w in CPU_REPACK as llama.cpp places a MoE layer's
experts. `work_sizes` gives each job's ggml_graph_plan work size instead of its dst (the graph
as computed: w in its buffer). `tiled=False` runs the child with GGML_CPU_TILED_MM=0 (ggml reads
it once a process), so every job of one call shares it. The arrays go both ways in .npz files.

    [dst] = mul_mat_many([MulMat(GGMLType.BF16, w_bytes, (k, rows), x, n_threads=3)], tmp)
    [(dst, packed)] = mul_mat_many([MulMat(GGMLType.Q4_K, w, (k, rows), x, 2, repack=True)], tmp)
    [(dst, packed)] = mul_mat_many([MulMat(GGMLType.Q4_K, w, (k, rows, n_as), x, 2, repack=True,
                                           ids=ids)], tmp)
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIMEOUT = 120
GGML_TYPE_I32 = 26


@dataclass(frozen=True)
class MulMat:
    """One ggml_mul_mat(w, x) to compute."""

    wtype: int
    w: np.ndarray  # w's raw bytes (uint8)
    ne_w: tuple[int, ...]  # w's ggml shape
    x: np.ndarray  # x's elements of xtype, numpy order (its shape the reversed ggml shape)
    n_threads: int
    xtype: int = 0  # F32
    repack: bool = False  # w in the CPU_REPACK buffer type (the result is then (dst, packed))
    ids: np.ndarray | None = None  # ggml_mul_mat_id's ids (tokens, n_used) int32: w 3-D, x 3-D


def mul_mat_many(jobs: list[MulMat], tmp: Path, tiled: bool = True) -> list:
    """llama.cpp's dst of each job (float32, numpy order), all computed in one child process;
    for a repack job, (dst, the repacked bytes of w as they lie in the CPU_REPACK buffer)."""
    got = _run(jobs, tmp, tiled)
    return [(got[f"d{i}"], got[f"p{i}"]) if j.repack else got[f"d{i}"] for i, j in enumerate(jobs)]


def work_sizes(jobs: list[MulMat], tmp: Path, tiled: bool = True) -> list[int]:
    """llama.cpp's ggml_graph_plan(graph, n_threads).work_size of each job's graph, w in its
    buffer (CPU_REPACK for a repack job: its traits' work_size)."""
    got = _run(jobs, tmp, tiled)
    return [int(got[f"s{i}"]) for i in range(len(jobs))]


def _run(jobs: list[MulMat], tmp: Path, tiled: bool) -> dict:
    arrays = {}
    for i, j in enumerate(jobs):
        ne_x = tuple(reversed(j.x.shape))
        arrays[f"w{i}"] = np.frombuffer(np.ascontiguousarray(j.w).tobytes(), np.uint8)
        arrays[f"x{i}"] = np.frombuffer(np.ascontiguousarray(j.x).tobytes(), np.uint8)
        arrays[f"h{i}"] = np.array([j.wtype, j.xtype, j.n_threads, int(j.repack), len(j.ne_w),
                                    *j.ne_w, len(ne_x), *ne_x], np.int64)
        if j.ids is not None:
            arrays[f"i{i}"] = np.ascontiguousarray(j.ids, np.int32)
    np.savez(tmp / "jobs.npz", **arrays)
    env = dict(os.environ, GGML_CPU_TILED_MM="1" if tiled else "0")
    done = subprocess.run([sys.executable, "-m", "tests.support.llamacpp_ggml", str(tmp)],
                          capture_output=True, text=True, timeout=TIMEOUT, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's ggml failed: {done.stderr[-2000:]}")
    with np.load(tmp / "dst.npz") as got:
        return dict(got)


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


class _CPlan(ctypes.Structure):  # struct ggml_cplan
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p),
                ("n_threads", ctypes.c_int), ("threadpool", ctypes.c_void_p),
                ("abort_callback", ctypes.c_void_p), ("abort_callback_data", ctypes.c_void_p),
                ("use_ref", ctypes.c_bool)]


def _libs():
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
    vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    for fn, res, args in [(base.ggml_init, vp, [_InitParams]),
                          (base.ggml_new_tensor, vp, [vp, ctypes.c_int, ctypes.c_int, i64p]),
                          (base.ggml_mul_mat, vp, [vp, vp, vp]),
                          (base.ggml_mul_mat_id, vp, [vp, vp, vp, vp]),
                          (base.ggml_new_graph, vp, [vp]),
                          (base.ggml_build_forward_expand, None, [vp, vp]),
                          (base.ggml_get_data, vp, [vp]),
                          (base.ggml_nbytes, ctypes.c_size_t, [vp]),
                          (base.ggml_free, None, [vp]),
                          (base.ggml_backend_alloc_ctx_tensors_from_buft, vp, [vp, vp]),
                          (base.ggml_backend_buffer_free, None, [vp]),
                          (base.ggml_backend_buft_name, ctypes.c_char_p, [vp]),
                          (base.ggml_backend_tensor_set, None, [vp, vp, ctypes.c_size_t, ctypes.c_size_t]),
                          (base.ggml_backend_graph_compute, ctypes.c_int, [vp, vp]),
                          (base.ggml_backend_free, None, [vp]),
                          (base.ggml_backend_reg_dev_get, vp, [vp, ctypes.c_size_t]),
                          (base.ggml_backend_reg_get_proc_address, vp, [vp, ctypes.c_char_p]),
                          (cpu.ggml_backend_cpu_reg, vp, []),
                          (cpu.ggml_backend_cpu_init, vp, []),
                          (cpu.ggml_backend_cpu_set_n_threads, None, [vp, ctypes.c_int]),
                          (cpu.ggml_backend_cpu_buffer_type, vp, []),
                          (cpu.ggml_graph_plan, _CPlan, [vp, ctypes.c_int, vp]),
                          (cpu.ggml_graph_compute_with_ctx, ctypes.c_int, [vp, vp, ctypes.c_int])]:
        fn.restype, fn.argtypes = res, args
    return base, cpu


def _child(tmp: Path) -> None:
    base, cpu = _libs()
    assert cpu.ggml_cpu_has_llamafile() and cpu.ggml_cpu_has_avx2() and cpu.ggml_cpu_has_fma() \
        and cpu.ggml_cpu_has_f16c() and not cpu.ggml_cpu_has_avx512(), "not the oracle's build"
    cpu.ggml_cpu_init()
    out = {}
    with np.load(tmp / "jobs.npz") as jobs:
        for i in range(sum(f.startswith("h") for f in jobs.files)):
            head = [int(v) for v in jobs[f"h{i}"]]
            ids = jobs[f"i{i}"] if f"i{i}" in jobs.files else None
            if head[3]:
                out[f"d{i}"], out[f"p{i}"], out[f"s{i}"] = _compute_repacked(
                    base, cpu, jobs[f"w{i}"], jobs[f"x{i}"], ids, head)
            else:
                out[f"d{i}"], out[f"s{i}"] = _compute(base, cpu, jobs[f"w{i}"], jobs[f"x{i}"], ids, head)
    np.savez(tmp / "dst.npz", **out)


def _shapes(head: list[int]) -> tuple[int, int, int, list[int], list[int]]:
    wtype, xtype, n_threads, _, nw = head[:5]
    ne_w, nx = head[5:5 + nw], head[5 + nw]
    return wtype, xtype, n_threads, ne_w, head[6 + nw:6 + nw + nx]


def _shaped(d: np.ndarray, ne_w: list[int], ne_x: list[int], ids: np.ndarray | None) -> np.ndarray:
    if ids is not None:  # mul_mat_id's dst: (tokens, n_used, rows)
        return d.reshape(*ids.shape, ne_w[1])
    ne = ne_x + [1] * (4 - len(ne_x))
    return d.reshape(ne[3], ne[2], ne[1], ne_w[1])


def _product(base, ctx, wt: int, xt: int, ids: np.ndarray | None) -> tuple[int, int | None]:
    """dst = ggml_mul_mat(w, x), or ggml_mul_mat_id(w, x, ids) with ids a new I32 tensor of ctx."""
    if ids is None:
        return base.ggml_mul_mat(ctx, wt, xt), None
    it = base.ggml_new_tensor(ctx, GGML_TYPE_I32, 2, (ctypes.c_int64 * 2)(ids.shape[1], ids.shape[0]))
    return base.ggml_mul_mat_id(ctx, wt, xt, it), it


def _work_size(cpu, gf: int, n_threads: int) -> int:
    return cpu.ggml_graph_plan(gf, n_threads, None).work_size


def _repack_buffer_type(base, cpu) -> int:
    """ggml-cpu's CPU_REPACK buffer type, found among the CPU device's extra buffer types."""
    reg = cpu.ggml_backend_cpu_reg()
    get = base.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts")
    bufts = ctypes.CFUNCTYPE(ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)(get)(
        base.ggml_backend_reg_dev_get(reg, 0))
    i = 0
    while bufts[i]:
        if base.ggml_backend_buft_name(bufts[i]) == b"CPU_REPACK":
            return bufts[i]
        i += 1
    raise RuntimeError("this ggml-cpu has no CPU_REPACK buffer type")


def _compute_repacked(base, cpu, w: np.ndarray, x: np.ndarray, ids: np.ndarray | None, head: list[int]):
    """w in a CPU_REPACK buffer (repacked by its set_tensor), x (ids) and dst in a CPU buffer, the
    graph computed by the CPU backend: dst, w's bytes as they lie in the buffer, the work size."""
    wtype, xtype, n_threads, ne_w, ne_x = _shapes(head)
    wctx = base.ggml_init(_InitParams(1 << 16, None, True))
    ctx = base.ggml_init(_InitParams(1 << 20, None, True))
    wt = base.ggml_new_tensor(wctx, wtype, len(ne_w), (ctypes.c_int64 * len(ne_w))(*ne_w))
    xt = base.ggml_new_tensor(ctx, xtype, len(ne_x), (ctypes.c_int64 * len(ne_x))(*ne_x))
    dst, it = _product(base, ctx, wt, xt, ids)
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, dst)
    wbuf = base.ggml_backend_alloc_ctx_tensors_from_buft(wctx, _repack_buffer_type(base, cpu))
    buf = base.ggml_backend_alloc_ctx_tensors_from_buft(ctx, cpu.ggml_backend_cpu_buffer_type())
    assert wbuf and buf and base.ggml_nbytes(wt) == w.nbytes and base.ggml_nbytes(xt) == x.nbytes
    base.ggml_backend_tensor_set(wt, w.ctypes.data, 0, w.nbytes)
    base.ggml_backend_tensor_set(xt, x.ctypes.data, 0, x.nbytes)
    if it is not None:
        assert base.ggml_nbytes(it) == ids.nbytes
        base.ggml_backend_tensor_set(it, ids.ctypes.data, 0, ids.nbytes)
    packed = np.frombuffer(ctypes.string_at(base.ggml_get_data(wt), w.nbytes), np.uint8).copy()
    size = _work_size(cpu, gf, n_threads)
    backend = cpu.ggml_backend_cpu_init()
    cpu.ggml_backend_cpu_set_n_threads(backend, n_threads)
    assert base.ggml_backend_graph_compute(backend, gf) == 0
    d = np.frombuffer(ctypes.string_at(base.ggml_get_data(dst), base.ggml_nbytes(dst)),
                      np.float32).copy()
    base.ggml_backend_free(backend)
    base.ggml_backend_buffer_free(buf)
    base.ggml_backend_buffer_free(wbuf)
    base.ggml_free(ctx)
    base.ggml_free(wctx)
    return _shaped(d, ne_w, ne_x, ids), packed, size


def _compute(base, cpu, w: np.ndarray, x: np.ndarray, ids: np.ndarray | None,
             head: list[int]) -> tuple[np.ndarray, int]:
    wtype, xtype, n_threads, ne_w, ne_x = _shapes(head)
    ctx = base.ggml_init(_InitParams(2 * (w.nbytes + x.nbytes) + (16 << 20), None, False))

    def leaf(type_: int, ne: list[int], data: np.ndarray) -> int:
        t = base.ggml_new_tensor(ctx, type_, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        assert base.ggml_nbytes(t) == data.nbytes
        ctypes.memmove(base.ggml_get_data(t), data.ctypes.data, data.nbytes)
        return t

    dst, it = _product(base, ctx, leaf(wtype, ne_w, w), leaf(xtype, ne_x, x), ids)
    if it is not None:
        assert base.ggml_nbytes(it) == ids.nbytes
        ctypes.memmove(base.ggml_get_data(it), ids.ctypes.data, ids.nbytes)
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, dst)
    size = _work_size(cpu, gf, n_threads)
    assert cpu.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
    d = np.frombuffer(ctypes.string_at(base.ggml_get_data(dst), base.ggml_nbytes(dst)),
                      np.float32).copy()
    base.ggml_free(ctx)
    return _shaped(d, ne_w, ne_x, ids), size


def engine_product(job: MulMat, watched: bool, *builds) -> np.ndarray:
    """The engine's dst of the same job (numpy order): ggml_mul_mat planned and computed inside
    the given build context managers (llamafile_build(), tiled_build(): llama.cpp's build);
    watched: with an observer, which takes the kernels' general path."""
    import contextlib

    from engine import ggml as eng

    ctx = eng.ggml_init(eng.ggml_init_params(2 * (job.w.nbytes + job.x.nbytes) + (16 << 20)))
    ne_x = tuple(reversed(job.x.shape))
    w = getattr(eng, f"ggml_new_tensor_{len(job.ne_w)}d")(ctx, job.wtype, *job.ne_w)
    x = getattr(eng, f"ggml_new_tensor_{len(ne_x)}d")(ctx, job.xtype, *ne_x)
    eng.data_bytes(w)[:] = job.w.reshape(-1)
    eng.data_bytes(x)[:] = job.x.reshape(-1).view(np.uint8)
    out = eng.ggml_mul_mat(ctx, w, x)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    observer = (lambda node, ask, shares: True) if watched else None
    with contextlib.ExitStack() as stack:
        for build in builds:
            stack.enter_context(build)
        assert eng.ggml_graph_compute_with_ctx(ctx, gf, job.n_threads, observer) == 0
    d = np.array(eng.to_numpy(out)).reshape([int(n) for n in reversed(out.ne)])
    eng.ggml_free(ctx)
    return d


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
