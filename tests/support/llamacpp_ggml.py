"""llama.cpp's own ggml computing mul_mat, in a child process: the oracle for the products
llama.cpp's build sends to llamafile's sgemm (tinyBLAS), which ggml-python's build (no
GGML_USE_LLAMAFILE) never runs.

The child loads the libggml-base and libggml-cpu that llama-cpp-python ships (AVX2, FMA, F16C,
llamafile: checked there) through ctypes, without importing llama_cpp or ggml-python (one ggml
library per process, as tests/support/llamacpp_run.py explains); for each job it builds
dst = ggml_mul_mat(w, x) in a context of its own and computes it with
ggml_graph_compute_with_ctx. The arrays go both ways in .npz files.

    [dst] = mul_mat_many([MulMat(GGMLType.BF16, w_bytes, (k, rows), x, n_threads=3)], tmp)
"""

from __future__ import annotations

import ctypes
import importlib.util
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TIMEOUT = 120


@dataclass(frozen=True)
class MulMat:
    """One ggml_mul_mat(w, x) to compute."""

    wtype: int
    w: np.ndarray  # w's raw bytes (uint8)
    ne_w: tuple[int, ...]  # w's ggml shape
    x: np.ndarray  # x's elements of xtype, numpy order (its shape the reversed ggml shape)
    n_threads: int
    xtype: int = 0  # F32


def mul_mat_many(jobs: list[MulMat], tmp: Path) -> list[np.ndarray]:
    """llama.cpp's dst of each job (float32, numpy order), all computed in one child process."""
    arrays = {}
    for i, j in enumerate(jobs):
        ne_x = tuple(reversed(j.x.shape))
        arrays[f"w{i}"] = np.frombuffer(np.ascontiguousarray(j.w).tobytes(), np.uint8)
        arrays[f"x{i}"] = np.frombuffer(np.ascontiguousarray(j.x).tobytes(), np.uint8)
        arrays[f"h{i}"] = np.array([j.wtype, j.xtype, j.n_threads, len(j.ne_w), *j.ne_w,
                                    len(ne_x), *ne_x], np.int64)
    np.savez(tmp / "jobs.npz", **arrays)
    done = subprocess.run([sys.executable, "-m", "tests.support.llamacpp_ggml", str(tmp)],
                          capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp's ggml failed: {done.stderr[-2000:]}")
    with np.load(tmp / "dst.npz") as got:
        return [got[f"d{i}"] for i in range(len(jobs))]


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def _libs():
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
    vp, i64p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64)
    for fn, res, args in [(base.ggml_init, vp, [_InitParams]),
                          (base.ggml_new_tensor, vp, [vp, ctypes.c_int, ctypes.c_int, i64p]),
                          (base.ggml_mul_mat, vp, [vp, vp, vp]),
                          (base.ggml_new_graph, vp, [vp]),
                          (base.ggml_build_forward_expand, None, [vp, vp]),
                          (base.ggml_get_data, vp, [vp]),
                          (base.ggml_nbytes, ctypes.c_size_t, [vp]),
                          (base.ggml_free, None, [vp]),
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
        for i in range(len(jobs.files) // 3):
            out[f"d{i}"] = _compute(base, cpu, jobs[f"w{i}"], jobs[f"x{i}"],
                                    [int(v) for v in jobs[f"h{i}"]])
    np.savez(tmp / "dst.npz", **out)


def _compute(base, cpu, w: np.ndarray, x: np.ndarray, head: list[int]) -> np.ndarray:
    wtype, xtype, n_threads, nw = head[:4]
    ne_w, nx = head[4:4 + nw], head[4 + nw]
    ne_x = head[5 + nw:5 + nw + nx]
    ctx = base.ggml_init(_InitParams(2 * (w.nbytes + x.nbytes) + (16 << 20), None, False))

    def leaf(type_: int, ne: list[int], data: np.ndarray) -> int:
        t = base.ggml_new_tensor(ctx, type_, len(ne), (ctypes.c_int64 * len(ne))(*ne))
        assert base.ggml_nbytes(t) == data.nbytes
        ctypes.memmove(base.ggml_get_data(t), data.ctypes.data, data.nbytes)
        return t

    dst = base.ggml_mul_mat(ctx, leaf(wtype, ne_w, w), leaf(xtype, ne_x, x))
    gf = base.ggml_new_graph(ctx)
    base.ggml_build_forward_expand(gf, dst)
    assert cpu.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
    d = np.frombuffer(ctypes.string_at(base.ggml_get_data(dst), base.ggml_nbytes(dst)),
                      np.float32).copy()
    base.ggml_free(ctx)
    ne = ne_x + [1] * (4 - nx)
    return d.reshape(ne[3], ne[2], ne[1], ne_w[1])


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
