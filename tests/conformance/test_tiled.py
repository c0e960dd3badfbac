"""llama.cpp's tiled K-quant products (engine/compute/kernels/tiled.py) against llama.cpp's own ggml
(tests/support/llamacpp_ggml.py), the engine planning and computing inside tiled_build().

Every type the AVX2 build tiles, with src1 rows around the gate (8): below it the engine keeps the
stock path (as llama.cpp does: its tiled=True and tiled=False results agree there), at and above
it the engine's dst has the bits of llama.cpp's tiled dst; 16 to 256 weight rows, K of 256 to
2048, 1 to 3 threads, on the engine's general path (watched, thread by thread) and on its prepared
one. Also: matrices broadcast over dims 2 and 3, Q8_K activations given as they are (with bytes
of -128, where IQ4_XS's sign trick wraps), MUL_MAT_ID (each expert tiled or not by its own rows),
and the plan's work sizes against ggml_graph_plan's.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine import ggml as eng
from engine.compute.kernels.tiled import FORMATS, TILED_MIN_BATCH
from engine.compute.kernels.vecdot import EXACT_QUANT
from engine.compute.plan import tiled_build
from engine.core.types import GGMLType as T
from engine.quants import QUANT_KINDS, quantize
from tests.support.llamacpp_ggml import MulMat, engine_product, mul_mat_many

TYPES = list(FORMATS)
NE11 = (1, 9, 16, 64, 100)  # src1 rows besides 7, 8 and 33, one per type in turn
KS, ROWS, THREADS = (256, 512, 1024, 2048), (16, 48, 100, 256), (1, 2, 3)


def weights(t: T, rng: np.random.Generator, ne_w: tuple[int, ...]) -> np.ndarray:
    """Weight bytes of type t and ggml shape ne_w: the engine's quantizer of random floats for
    the K-quants and IQ4_XS; random blocks with an ordinary fp16 super-scale for the IQ grid
    types (three of which only quantize with an importance matrix)."""
    k, n = ne_w[0], int(np.prod(ne_w[1:]))
    kind = QUANT_KINDS[t]
    if t in (T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_XS):
        return quantize(t, rng.standard_normal((n, k)).astype(np.float32)).view(np.uint8).reshape(-1)
    raw = rng.integers(0, 256, n * k // 256 * kind.type_size, dtype=np.uint8)
    b = raw.view(kind.dtype)
    scale = int(np.float16(0.01).view(np.uint16))
    if "d" in kind.dtype.names:
        b["d"] = scale
    else:  # IQ1_M: the fp16 scale in the top nibbles of its four uint16 scale words
        sc = b["scales"].view("<u2")
        sc &= 0x0FFF
        sc |= ((scale >> (4 * np.arange(4))) & 0xF).astype(np.uint16) << 12
    return raw


def engine_mul_mat(job: MulMat, watched: bool, tiled: bool = True) -> np.ndarray:
    """The engine's ggml_mul_mat of a job, planned and computed inside tiled_build() (or not)."""
    return engine_product(job, watched, *([tiled_build()] if tiled else []))


def jobs_of(rng: np.random.Generator) -> list[MulMat]:
    """Per type: src1 rows 7, 8, 33 and one of NE11, each with its own K, weight rows and threads."""
    jobs = []
    for i, t in enumerate(TYPES):
        for j, ne11 in enumerate((7, 8, 33, NE11[i % len(NE11)])):
            k, rows, n_threads = KS[(i + j) % 4], ROWS[(3 * i + 2 * j) % 4], THREADS[(i + 2 * j) % 3]
            x = rng.standard_normal((ne11, k)).astype(np.float32)
            jobs.append(MulMat(int(t), weights(t, rng, (k, rows)), (k, rows), x, n_threads))
    # broadcast: 2 x 1 weight matrices under 4 x 3 of src1 (r2 = 2, r3 = 3); the gate reads ne[1]
    # alone (48 rows of 4 stay on the stock path)
    for t, ne11 in ((T.Q4_K, 9), (T.IQ3_S, 20), (T.Q5_K, 4)):
        ne_w = (512, 40, 2, 1)
        x = rng.standard_normal((3, 4, ne11, 512)).astype(np.float32)
        jobs.append(MulMat(int(t), weights(t, rng, ne_w), ne_w, x, 2))
    return jobs


def test_tiled_mul_mat_matches_llama_cpp(tmp_path):
    rng = np.random.default_rng(2024)
    jobs = jobs_of(rng)
    tiled = mul_mat_many(jobs, tmp_path, tiled=True)
    stock = mul_mat_many(jobs, tmp_path, tiled=False)
    seen = set()
    for job, theirs, plain in zip(jobs, tiled, stock):
        what = f"{T(job.wtype).name} {job.ne_w} x {job.x.shape} src1 {T(job.xtype).name}, {job.n_threads} threads"
        below = job.x.shape[-2] < TILED_MIN_BATCH
        for watched in (False, True):
            ours = engine_mul_mat(job, watched)
            if not below or T(job.wtype) in EXACT_QUANT:  # (the engine's stock products of the
                # others are BLAS's: llama.cpp's to rounding)
                np.testing.assert_array_equal(ours.view(np.uint32), theirs.reshape(ours.shape).view(np.uint32),
                                              err_msg=f"{what}, watched={watched}")
        if below:  # the gate is shut: llama.cpp's stock path, and the engine's
            np.testing.assert_array_equal(theirs.view(np.uint32), plain.view(np.uint32), err_msg=what)
            np.testing.assert_array_equal(ours.view(np.uint32), engine_mul_mat(job, False, False)
                                          .view(np.uint32), err_msg=what)
        else:  # the tiled path: llama.cpp's stock products differ in their last bits
            assert (theirs != plain).any(), what
            seen.add(T(job.wtype))
    assert seen == set(TYPES)


def test_tiled_path_is_off_outside_tiled_build(tmp_path):
    """Outside tiled_build() the engine keeps ggml's stock vec_dot path (ggml-python's build, and
    llama.cpp's with GGML_CPU_TILED_MM=0) at any batch."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((33, 512)).astype(np.float32)
    job = MulMat(int(T.Q6_K), weights(T.Q6_K, rng, (512, 48)), (512, 48), x, 2)
    [plain] = mul_mat_many([job], tmp_path, tiled=False)
    ours = engine_mul_mat(job, False, tiled=False)
    np.testing.assert_array_equal(ours.view(np.uint32), plain.reshape(ours.shape).view(np.uint32))
    assert (ours != engine_mul_mat(job, False)).any()


def q8_k_activations(rng: np.random.Generator, n: int) -> np.ndarray:
    """n random Q8_K blocks (n, 292): random quants (-128 among them), an ordinary d, their sums."""
    y = rng.integers(0, 256, (n, 292), dtype=np.uint8)
    y[:, :4] = np.abs(rng.standard_normal(n) * 0.01).astype(np.float32).view(np.uint8).reshape(-1, 4)
    y[:, 260:] = y[:, 4:260].view(np.int8).reshape(-1, 16, 16).sum(-1, dtype=np.int16).view(np.uint8) \
        .reshape(-1, 32)
    return y


def engine_q8_k_mul_mat(wtype: int, w: np.ndarray, k: int, rows: int, y: np.ndarray, ne11: int,
                        n_threads: int, watched: bool) -> np.ndarray:
    """The engine's ggml_mul_mat of weights w by a Q8_K src1 of bytes y, inside tiled_build()."""
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 24))
    a = eng.ggml_new_tensor_2d(ctx, wtype, k, rows)
    b = eng.ggml_new_tensor_2d(ctx, int(T.Q8_K), k, ne11)
    eng.data_bytes(a)[:] = w
    eng.data_bytes(b)[:] = y.reshape(-1)
    out = eng.ggml_mul_mat(ctx, a, b)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    with tiled_build():
        assert eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads, (lambda *_: True) if watched else None) == 0
    d = np.array(eng.to_numpy(out)).reshape(ne11, rows)
    eng.ggml_free(ctx)
    return d


def engine_mul_mat_id(wtype: int, w: np.ndarray, k: int, rows: int, n_as: int, b: np.ndarray,
                      ids: np.ndarray, n_threads: int, watched: bool) -> np.ndarray:
    """The engine's ggml_mul_mat_id of experts w (k, rows, n_as) by b (n_tokens, n_b, k) with
    ids (n_tokens, n_used), inside tiled_build()."""
    ctx = eng.ggml_init(eng.ggml_init_params(1 << 24))
    a = eng.ggml_new_tensor_3d(ctx, wtype, k, rows, n_as)
    x = eng.ggml_new_tensor_3d(ctx, int(T.F32), k, b.shape[1], b.shape[0])
    i = eng.ggml_new_tensor_2d(ctx, int(T.I32), ids.shape[1], ids.shape[0])
    for t, data in ((a, w), (x, b), (i, ids)):
        eng.data_bytes(t)[:] = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    out = eng.ggml_mul_mat_id(ctx, a, x, i)
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    with tiled_build():
        assert eng.ggml_graph_compute_with_ctx(ctx, gf, n_threads, (lambda *_: True) if watched else None) == 0
    d = np.array(eng.to_numpy(out)).reshape(ids.shape[0], ids.shape[1], rows)
    eng.ggml_free(ctx)
    return d


# (type, K, weight rows, src1 rows, threads)
PLAN_CASES = [(int(T.Q6_K), 512, 48, 1, 1), (int(T.Q6_K), 512, 48, 33, 3), (int(T.IQ2_XXS), 256, 16, 2, 4),
              (int(T.Q8_0), 512, 48, 33, 3), (int(T.Q4_K), 1024, 32, 8, 2)]
Q8_K_CASES = [(int(T.IQ4_XS), 1024, 32, 12, 3), (int(T.Q5_K), 512, 48, 9, 2), (int(T.IQ2_XS), 768, 16, 16, 1)]
# MUL_MAT_ID: (type, K, weight rows, experts, experts a token, tokens, threads); of the 24 (token,
# slot) rows the experts get 12, 3, 8 and 1: tiled, stock, tiled (at the gate), stock
MMID_CASES = [(int(T.Q4_K), 512, 150, 4, 2, 12, 3), (int(T.Q6_K), 256, 64, 4, 2, 12, 2)]
MMID_IDS = np.array([[0, 2]] * 8 + [[1, 0]] * 3 + [[0, 3]], np.int32)  # (tokens, slots)


@pytest.fixture(scope="module")
def asked(tmp_path_factory) -> tuple[dict, dict]:
    """What llama.cpp's ggml (GGML_CPU_TILED_MM on) answers, in a child of this module's own:
    the inputs of Q8_K_CASES and MMID_CASES, and its dsts and work sizes (_child)."""
    tmp = tmp_path_factory.mktemp("tiled")
    rng = np.random.default_rng(11)
    arrays = {}
    for i, (wtype, k, rows, ne11, _) in enumerate(Q8_K_CASES):
        arrays[f"w{i}"] = weights(T(wtype), rng, (k, rows))
        arrays[f"y{i}"] = q8_k_activations(rng, ne11 * k // 256)
    for i, (wtype, k, rows, n_as, n_used, n_tok, _) in enumerate(MMID_CASES):
        arrays[f"as{i}"] = weights(T(wtype), rng, (k, rows, n_as))
        arrays[f"b{i}"] = rng.standard_normal((n_tok, n_used, k)).astype(np.float32)
    np.savez(tmp / "in.npz", **arrays)
    env = dict(os.environ, GGML_CPU_TILED_MM="1")
    done = subprocess.run([sys.executable, "-m", "tests.conformance.test_tiled", str(tmp)],
                          capture_output=True, text=True, timeout=120, env=env,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(tmp / "out.npz") as got:
        return arrays, dict(got)


def test_q8_k_activations(asked):
    """ggml_mul_mat by a Q8_K src1 given as it is (its quants random, -128 among them: IQ4_XS's
    sign trick counts +128 times a negative weight there): the engine's dst bit for bit on both
    its paths."""
    arrays, got = asked
    for i, (wtype, k, rows, ne11, n_threads) in enumerate(Q8_K_CASES):
        for watched in (False, True):
            ours = engine_q8_k_mul_mat(wtype, arrays[f"w{i}"], k, rows, arrays[f"y{i}"], ne11,
                                       n_threads, watched)
            np.testing.assert_array_equal(ours.view(np.uint32), got[f"d{i}"].view(np.uint32),
                                          err_msg=f"{T(wtype).name} by Q8_K, watched={watched}")


def test_mul_mat_id(asked):
    """ggml_mul_mat_id: each expert with 8 or more routed rows tiled, the others by vec_dot, and
    the thread shares say which: the tiled experts' groups of 64 weight rows."""
    arrays, got = asked
    for i, (wtype, k, rows, n_as, _, _, n_threads) in enumerate(MMID_CASES):
        for watched in (False, True):
            ours = engine_mul_mat_id(wtype, arrays[f"as{i}"], k, rows, n_as, arrays[f"b{i}"], MMID_IDS,
                                     n_threads, watched)
            np.testing.assert_array_equal(ours.view(np.uint32), got[f"mmid{i}"].view(np.uint32),
                                          err_msg=f"{T(wtype).name} mul_mat_id, watched={watched}")


def test_work_size(asked):
    """ggml_graph_plan's work size with GGML_CPU_TILED_MM on (MUL_MAT: src1's conversion padded
    to 64, then 64 + 512 KiB a thread for a tiled type at any batch; MUL_MAT_ID likewise after
    its row lists), the engine's inside tiled_build()."""
    _, got = asked
    ours = []
    for wtype, k, rows, ne11, n_threads in PLAN_CASES:
        ctx = eng.ggml_init(eng.ggml_init_params(1 << 20, no_alloc=True))
        out = eng.ggml_mul_mat(ctx, eng.ggml_new_tensor_2d(ctx, wtype, k, rows),
                               eng.ggml_new_tensor_2d(ctx, int(T.F32), k, ne11))
        ours.append(_plan(ctx, out, n_threads))
    for wtype, k, rows, n_as, n_used, n_tok, n_threads in MMID_CASES:
        ctx = eng.ggml_init(eng.ggml_init_params(1 << 20, no_alloc=True))
        out = eng.ggml_mul_mat_id(ctx, eng.ggml_new_tensor_3d(ctx, wtype, k, rows, n_as),
                                  eng.ggml_new_tensor_3d(ctx, int(T.F32), k, n_used, n_tok),
                                  eng.ggml_new_tensor_2d(ctx, int(T.I32), n_used, n_tok))
        ours.append(_plan(ctx, out, n_threads))
    assert ours == got["plans"].tolist()


def _plan(ctx, out, n_threads: int) -> int:
    gf = eng.ggml_new_graph(ctx)
    eng.ggml_build_forward_expand(gf, out)
    with tiled_build():
        size = eng.ggml_graph_plan(gf, n_threads).work_size
    eng.ggml_free(ctx)
    return size


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


class _CPlan(ctypes.Structure):
    _fields_ = [("work_size", ctypes.c_size_t), ("work_data", ctypes.c_void_p), ("n_threads", ctypes.c_int),
                ("threadpool", ctypes.c_void_p), ("abort_callback", ctypes.c_void_p),
                ("abort_callback_data", ctypes.c_void_p), ("use_ref", ctypes.c_bool)]


def _child(tmp: Path) -> None:
    """In a child of its own (one ggml per process, tests/support/llamacpp_ggml.py says why):
    llama.cpp's ggml computes Q8_K_CASES and MMID_CASES (the bytes from in.npz) and plans
    PLAN_CASES and MMID_CASES' graphs; out.npz."""
    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))
    vp = ctypes.c_void_p
    i64 = ctypes.c_int64
    for fn, res, args in [(base.ggml_init, vp, [_InitParams]),
                          (base.ggml_new_tensor_2d, vp, [vp, ctypes.c_int, i64, i64]),
                          (base.ggml_new_tensor_3d, vp, [vp, ctypes.c_int, i64, i64, i64]),
                          (base.ggml_mul_mat_id, vp, [vp, vp, vp, vp]),
                          (base.ggml_mul_mat, vp, [vp, vp, vp]), (base.ggml_new_graph, vp, [vp]),
                          (base.ggml_build_forward_expand, None, [vp, vp]), (base.ggml_get_data, vp, [vp]),
                          (base.ggml_free, None, [vp]), (cpu.ggml_graph_plan, _CPlan, [vp, ctypes.c_int, vp]),
                          (cpu.ggml_graph_compute_with_ctx, ctypes.c_int, [vp, vp, ctypes.c_int])]:
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()

    def graph(ctx, wtype, k, rows, xtype, ne11):
        a, b = base.ggml_new_tensor_2d(ctx, wtype, k, rows), base.ggml_new_tensor_2d(ctx, xtype, k, ne11)
        return [a, b], base.ggml_mul_mat(ctx, a, b)

    def graph_id(ctx, wtype, k, rows, n_as, n_used, n_tok):
        a = base.ggml_new_tensor_3d(ctx, wtype, k, rows, n_as)
        b = base.ggml_new_tensor_3d(ctx, int(T.F32), k, n_used, n_tok)
        ids = base.ggml_new_tensor_2d(ctx, int(T.I32), n_used, n_tok)
        return [a, b, ids], base.ggml_mul_mat_id(ctx, a, b, ids)

    def compute(leaves, data, dst, n_threads, n_out):
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, dst)
        for t, d in zip(leaves, data):
            d = np.ascontiguousarray(d)
            ctypes.memmove(base.ggml_get_data(t), d.ctypes.data, d.nbytes)
        assert cpu.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
        return np.frombuffer(ctypes.string_at(base.ggml_get_data(dst), 4 * n_out), np.float32).copy()

    def plan(dst, n_threads):
        gf = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(gf, dst)
        return cpu.ggml_graph_plan(gf, n_threads, None).work_size

    out, plans = {}, []
    with np.load(tmp / "in.npz") as arrays:
        for i, (wtype, k, rows, ne11, n_threads) in enumerate(Q8_K_CASES):
            ctx = base.ggml_init(_InitParams(64 << 20, None, False))
            leaves, dst = graph(ctx, wtype, k, rows, int(T.Q8_K), ne11)
            out[f"d{i}"] = compute(leaves, (arrays[f"w{i}"], arrays[f"y{i}"]), dst, n_threads,
                                   rows * ne11).reshape(ne11, rows)
            base.ggml_free(ctx)
        for i, (wtype, k, rows, n_as, n_used, n_tok, n_threads) in enumerate(MMID_CASES):
            ctx = base.ggml_init(_InitParams(64 << 20, None, False))
            leaves, dst = graph_id(ctx, wtype, k, rows, n_as, n_used, n_tok)
            out[f"mmid{i}"] = compute(leaves, (arrays[f"as{i}"], arrays[f"b{i}"], MMID_IDS), dst, n_threads,
                                      rows * n_used * n_tok).reshape(n_tok, n_used, rows)
            base.ggml_free(ctx)
    for wtype, k, rows, ne11, n_threads in PLAN_CASES:
        ctx = base.ggml_init(_InitParams(1 << 20, None, True))
        plans.append(plan(graph(ctx, wtype, k, rows, int(T.F32), ne11)[1], n_threads))
        base.ggml_free(ctx)
    for wtype, k, rows, n_as, n_used, n_tok, n_threads in MMID_CASES:
        ctx = base.ggml_init(_InitParams(1 << 20, None, True))
        plans.append(plan(graph_id(ctx, wtype, k, rows, n_as, n_used, n_tok)[1], n_threads))
        base.ggml_free(ctx)
    np.savez(tmp / "out.npz", plans=np.array(plans, np.int64), **out)


if __name__ == "__main__":
    _child(Path(sys.argv[1]))
