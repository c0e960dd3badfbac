"""Every C loop of engine._lanes against its numpy twin (engine/lanes.py): the same bits on
random values and on random bit patterns (NaN with any payload, infinities, subnormals, ±0, huge
values), one test per exported function, and a test that every export has its twin.

The C side is the compiled module itself (engine.lanes.compiled()); the twin is what the engine
runs in pure-numpy mode. A C module that is not built is a failure here, not a skip: `make test`
builds it."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import signal
import threading

import numpy as np
import pytest

import engine.compute.kernels  # noqa: F401 (registers the kernels' twins)
import engine.quants  # noqa: F401 (registers the block converters' twins)
from engine import libm
from engine.compute.kernels.floatmath import fmaf, fmaf_steps, widened_table
from engine.lanes import NAMES, TWINS, compiled
from engine.quants import QUANT_KINDS
from engine.core.types import GGMLType, bf16_bits_to_fp32, fp32_to_bf16_bits, fp32_to_fp16_bits

F32 = np.float32
C = compiled()
OUT = object()  # marks where the output buffer goes in an argument list
# the types quant_dot multiplies (those whose record has a bit-exact vec_dot): the bytes of a
# weight block, and the activations' type (Q8_0, Q8_1 or Q8_K), from their records
QUANT_DOT = {t: kind.type_size for t, kind in QUANT_KINDS.items() if kind.exact}
ACTIVATION = {t: QUANT_KINDS[t].vec_dot_type for t in QUANT_DOT}
NIBBLE_D_AT = {GGMLType.IQ1_M: 48}  # the 4 uint16 words whose top nibbles make an fp16 d
DEQUANTIZE = (GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.TQ1_0)  # lanes.dequantize's


def fields_at(type_: GGMLType, names: set[str], dtype: str) -> tuple[int, ...]:
    """The byte offsets in the type's block struct of its fields of these names and this dtype:
    ("d", "dmin", "m", "s"; "<u2") its fp16 scales, ("e"; "u1") MXFP4's E8M0 exponent."""
    struct = QUANT_KINDS[type_].dtype
    return tuple(struct.fields[n][1] for n in struct.names
                 if n in names and struct.fields[n][0] == np.dtype(dtype))


def d_at(type_: GGMLType) -> tuple[int, ...]:
    """Where a block's fp16 scales lie: d, and dmin, m or s where it has them."""
    return fields_at(type_, {"d", "dmin", "m", "s"}, "<u2")


K_VALUES = (1, 3, 4, 7, 8, 9, 31, 32, 33, 63, 64, 100, 257)


# --- helpers (reusable for the other twins) ----------------------------------------------------

def run_both(name: str, args: tuple, n_out: int) -> tuple[np.ndarray, np.ndarray]:
    """Call engine._lanes.<name> and its twin with args, OUT replaced by a fresh float32 buffer of
    n_out elements (prefilled with a pattern, so an element left unwritten shows) -> both."""
    assert C is not None, "engine._lanes is not built"
    got = []
    for fn in (getattr(C, name), TWINS[name]):
        out = np.full(n_out, 0xA5A5A5A5, np.uint32).view(np.float32)
        with np.errstate(all="ignore"):
            fn(*(out if a is OUT else a for a in args))
        got.append(out)
    return got[0], got[1]


def assert_same_bits(c: np.ndarray, t: np.ndarray, what: str) -> None:
    """The twin's float32 result t has the bits of C's c; where c is a NaN, t only has to be a
    NaN. When two NaNs meet in an operation, the payload (and sign) that comes out is the machine
    code's choice, not the formula's: x86 returns the first operand's, gcc orders the operands of
    a commutative operation as it likes (engine/c/quant.c's AVX2 and portable quant_dot
    loops give different NaNs for `y.d * x.d`), and numpy's AVX-512 loops return the first
    operand's in whole vectors but the second's in an array's remainder (measured)."""
    cb, tb = c.view(np.uint32), t.view(np.uint32)
    same = (cb == tb) | (np.isnan(c) & np.isnan(t))
    bad = np.flatnonzero(~same)
    assert not bad.size, (f"{what}: {bad.size} of {c.size} differ, first at {bad[0]}: "
                          f"C {cb[bad[0]]:#010x}, twin {tb[bad[0]]:#010x}")


def ordinary_floats(rng: np.random.Generator, n: int) -> np.ndarray:
    """float32 values as activations and weights have them, of mixed magnitudes."""
    return (rng.standard_normal(n) * 10.0 ** rng.integers(-3, 3, n)).astype(np.float32)


def wild_floats(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """float32 rows (n, k): ordinary values, and in each row, at a rate of its own (none to a
    half), random bit patterns (NaN payloads of both signs, infinities, subnormals, huge values)
    and NaN, ±inf, subnormals, ±0 and huge values; rows of many products mostly stay finite."""
    x = ordinary_floats(rng, n * k).reshape(n, k)
    bits = rng.integers(0, 1 << 32, (n, k), dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([np.nan, -np.nan, np.inf, -np.inf, 1e-40, -3e-42, 0.0, -0.0, 3e38, -2e38,
                        1e30, 65504.0], np.float32)
    rate = rng.choice([0.0, 0.005, 0.02, 0.1, 0.5], (n, 1))
    pick = rng.random((n, k))
    x = np.where(pick < rate / 2, bits, x)
    return np.where(pick > 1 - rate / 2, special[rng.integers(0, len(special), (n, k))], x)


def halves(rng: np.random.Generator, shape, wild: bool) -> np.ndarray:
    """fp16 bit patterns (uint16) of ordinary values; wild: in each row (the last axis), at a rate
    of its own, any 16 bits (NaN, infinities, subnormals)."""
    shape = tuple(np.atleast_1d(shape))
    h = fp32_to_fp16_bits(ordinary_floats(rng, int(np.prod(shape))) * np.float32(0.01))
    h = h.reshape(shape)
    if wild:
        bits = rng.integers(0, 1 << 16, shape, dtype=np.uint32).astype(np.uint16)
        rate = rng.choice([0.0, 0.01, 0.05, 0.5, 1.0], (*shape[:-1], 1))
        h = np.where(rng.random(shape) < rate, bits, h)
    return h


def quant_blocks(rng: np.random.Generator, n: int, size: int, d_at: tuple[int, ...],
                 wild: bool, e_at: tuple[int, ...] = (),
                 nibble_d_at: int | None = None) -> np.ndarray:
    """n random weight (or Q8_0) blocks of `size` bytes (n, size): random bytes throughout; unless
    wild, the fp16 scales at the bytes d_at hold ordinary values, the E8M0 exponents at the
    bytes e_at scales of 2^-10 .. 2^10, and the top nibbles of the 4 uint16 words at byte
    nibble_d_at (IQ1_M's d) an ordinary half."""
    b = rng.integers(0, 256, (n, size), dtype=np.uint8)
    if wild:
        return b
    for at in d_at:
        b[:, at:at + 2] = halves(rng, n, False).view(np.uint8).reshape(n, 2)
    for at in e_at:
        b[:, at] = rng.integers(118, 139, n)
    if nibble_d_at is not None:
        h = halves(rng, n, False).astype(np.uint16)
        for i in range(4):  # byte 2i + 1 of the words: the top nibble holds bits 4i..4i+3 of d
            at = nibble_d_at + 2 * i + 1
            b[:, at] = (b[:, at] & 0x0F) | ((h >> (4 * i)) & 0x0F).astype(np.uint8) << 4
    return b


def q8_k_blocks(rng: np.random.Generator, n: int, wild: bool) -> np.ndarray:
    """n Q8_K activation blocks (n, 292): random bytes; unless wild, an ordinary float d and the
    16 bsums the sums of their 16 quants (as quantize_row_q8_K makes them)."""
    b = rng.integers(0, 256, (n, 292), dtype=np.uint8)
    if not wild:
        b[:, :4] = np.abs(ordinary_floats(rng, n)).view(np.uint8).reshape(n, 4)
        sums = b[:, 4:260].view(np.int8).reshape(n, 16, 16).sum(-1, dtype=np.int16)
        b[:, 260:] = sums.view(np.uint8).reshape(n, 32)
    return b


def activation_blocks(rng: np.random.Generator, type_: GGMLType, n: int,
                      wild: bool) -> np.ndarray:
    """n activation blocks for weights of type_: Q8_K (n, 292) for the K-quants, Q8_1 (n, 36;
    d and s ordinary halves unless wild) for Q4_1 and Q5_1, else Q8_0 (n, 34)."""
    vdt = ACTIVATION[type_]
    if vdt == GGMLType.Q8_K:
        return q8_k_blocks(rng, n, wild)
    return quant_blocks(rng, n, QUANT_KINDS[vdt].type_size, d_at(vdt), wild)


def padded_rows(blocks: np.ndarray, n: int, nb: int, pad: int) -> np.ndarray:
    """The blocks (n * nb, size) as n rows of nb blocks, each followed by pad zero bytes: rows
    lying more than a row apart, as in a tensor's view -> (n, nb * size + pad)."""
    row = nb * blocks.shape[1]
    rows = np.zeros((n, row + pad), np.uint8)
    rows[:, :row] = blocks.reshape(n, row)
    return rows


def weight_rows(rng: np.random.Generator, type_: GGMLType, n: int, nb: int,
                wild: bool) -> np.ndarray:
    """n rows of nb random weight blocks of type_ (quant_blocks, its scales where the type has
    them), 5 bytes apart."""
    blocks = quant_blocks(rng, n * nb, QUANT_DOT[type_], d_at(type_), wild,
                          fields_at(type_, {"e"}, "u1"), NIBBLE_D_AT.get(type_))
    return padded_rows(blocks, n, nb, 5)


# --- quant_dot ---------------------------------------------------------------------------------

@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("type_", list(QUANT_DOT), ids=lambda t: t.name)
def test_quant_dot(type_: GGMLType, wild: bool):
    """Every pair of weight rows (nb blocks, rows ldw bytes apart, more than a row) and activation
    rows (ldx apart); C's loops alike: the best the CPU has (portable=0; the legacy types by
    AVX-512 VNNI's tiles where it has them), the portable one (1), AVX2 without AVX-512 (2).
    The last case's activation quants are all 127: the largest products, whose last bits each
    fma rounds."""
    rng = np.random.default_rng([int(type_), wild])
    for n0, n1, nb in ((1, 1, 1), (37, 3, 4), (5, 9, 2), (64, 1, 3), (10, 8, 5), (0, 2, 1),
                       (40, 2, 5)):
        w = weight_rows(rng, type_, n0, nb, wild)
        y = activation_blocks(rng, type_, n1 * nb, wild)
        if n0 == 40:
            at = 4 if y.shape[1] != 34 else 2  # where a block's quants start
            y[:, at:at + (256 if y.shape[1] == 292 else 32)] = 127
        x = padded_rows(y, n1, nb, 3)
        for portable in (0, 1, 2):  # none changes a bit
            args = (int(type_), w.reshape(-1), w.shape[1], x.reshape(-1), x.shape[1], OUT, n0, n1,
                    nb, portable, 2)
            c, t = run_both("quant_dot", args, n0 * n1)
            assert_same_bits(c, t, f"quant_dot {type_.name} {n0}x{n1}x{nb} portable={portable}")


def test_iq_grids_header():
    """engine/c/iq.c's grids (engine/c/iq_grids.h) are the engine's tables, as
    engine/quants/grids_c.py writes them."""
    from engine.quants import grids_c
    assert grids_c.HEADER.read_text() == grids_c.header(), "run python -m engine.quants.grids_c"


def test_quant_dot_tiny():
    """IQ4_NL in llamafile's tinyBLAS order (tiny=True: one accumulator, no scalar last block):
    C's AVX2 and portable loops against the twin, on values and bit patterns."""
    rng = np.random.default_rng(20)
    for wild in (False, True):
        for n0, n1, nb in ((1, 2, 1), (37, 3, 4), (5, 9, 3), (64, 2, 5)):
            args = quant_dot_case(rng, GGMLType.IQ4_NL, n0, n1, nb, wild)
            c, t = run_both("quant_dot", args + (n0 % 2 == 1, 2, True), n0 * n1)
            assert_same_bits(c, t, f"quant_dot IQ4_NL tiny {n0}x{n1}x{nb}")


# --- float_dot, dot_f32 ------------------------------------------------------------------------

def float_rows(rng: np.random.Generator, n: int, k: int, wild: bool) -> np.ndarray:
    return wild_floats(rng, n, k) if wild else ordinary_floats(rng, n * k).reshape(n, k)


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("tiny", [False, True], ids=["f16", "tiny"])
def test_float_dot(tiny: bool, wild: bool):
    """float32 weights (n0, k), and halves whose rows lie ldw > k elements apart: every pair,
    the halves by the vector loop and the portable one (CPUs without FMA and F16C) alike."""
    rng = np.random.default_rng([tiny, wild])
    for k in (8, 16, 32, 64, 96, 264) if tiny else K_VALUES:
        n0, n1 = 9, 7
        w, x = float_rows(rng, n0, k, wild), float_rows(rng, n1, k, wild)
        c, t = run_both("float_dot", (w, x, OUT, n0, n1, k, tiny), n0 * n1)
        assert_same_bits(c, t, f"float_dot tiny={tiny} k={k}")
        ldw = k + 3
        h = halves(rng, (n0, ldw), wild).reshape(-1)[:(n0 - 1) * ldw + k]
        c, t = run_both("float_dot", (h, x, OUT, n0, n1, k, tiny, ldw), n0 * n1)
        assert_same_bits(c, t, f"float_dot halves tiny={tiny} k={k} ldw={ldw}")
        p = run_c("float_dot", (h, x, OUT, n0, n1, k, tiny, ldw), n0 * n1, portable=True)
        assert_same_bits(p, t, f"float_dot halves portable tiny={tiny} k={k} ldw={ldw}")


def bf16s(rng: np.random.Generator, shape, wild: bool) -> np.ndarray:
    """bf16 bit patterns (uint16) of ordinary values (rounded as ggml rounds); wild: in each row,
    at a rate of its own, any 16 bits (NaN payloads, infinities, subnormals, huge values)."""
    shape = tuple(np.atleast_1d(shape))
    h = fp32_to_bf16_bits(ordinary_floats(rng, int(np.prod(shape)))).reshape(shape)
    if wild:
        bits = rng.integers(0, 1 << 16, shape, dtype=np.uint32).astype(np.uint16)
        rate = rng.choice([0.0, 0.01, 0.05, 0.5, 1.0], (*shape[:-1], 1))
        h = np.where(rng.random(shape) < rate, bits, h)
    return h


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("tiny", [False, True], ids=["bf16", "tiny"])
def test_float_dot_bf16(tiny: bool, wild: bool):
    """bf16 weights whose rows lie ldw >= k elements apart (ggml_vec_dot_bf16's row, or
    tinyBLAS's) by activations that are bf16 values (src1 converted) or any floats: every pair,
    the vector loop and the portable one (CPUs without FMA) both the twin's bits."""
    rng = np.random.default_rng([tiny, wild, 5])
    for k in (8, 16, 32, 64, 96, 264) if tiny else K_VALUES:
        n0, n1 = 9, 7
        for ldw in (k, k + 3):
            w = bf16s(rng, (n0, ldw), wild).reshape(-1)[:(n0 - 1) * ldw + k]
            x = bf16_bits_to_fp32(bf16s(rng, (n1, k), wild))
            if ldw > k:  # any floats too
                x = float_rows(rng, n1, k, wild)
            args = (w, x, OUT, n0, n1, k, tiny, ldw)
            c, t = run_both("float_dot", args + (1, True), n0 * n1)
            assert_same_bits(c, t, f"float_dot bf16 tiny={tiny} k={k} ldw={ldw}")
            p = run_c("float_dot", args, n0 * n1, bf16=True, portable=True)
            assert_same_bits(p, t, f"float_dot bf16 portable tiny={tiny} k={k} ldw={ldw}")


def test_float_dot_bf16_needs_rows():
    """bf16 weights come as bits with a row stride (ldw >= 0): asked without one, both sides
    refuse."""
    for fn in (C.float_dot, TWINS["float_dot"]):
        with pytest.raises(ValueError):
            fn(np.zeros(8, np.uint16), np.zeros(8, F32), np.zeros(1, F32), 1, 1, 8, False,
               bf16=True)


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
def test_dot_f32(wild: bool):
    """Every pair of rows, and rows paired one to one (pairs=True)."""
    rng = np.random.default_rng([3, wild])
    for k in K_VALUES + (0,):
        n0, n1 = 8, 6
        w, x = float_rows(rng, n0, k, wild), float_rows(rng, n1, k, wild)
        c, t = run_both("dot_f32", (w, x, OUT, n0, n1, k), n0 * n1)
        assert_same_bits(c, t, f"dot_f32 k={k}")
        b = float_rows(rng, n0, k, wild)
        c, t = run_both("dot_f32", (w, b, OUT, n0, n0, k, True), n0)
        assert_same_bits(c, t, f"dot_f32 pairs k={k}")


# --- the pool: rows shared out between threads ------------------------------------------------

THREADS = (2, 3, 7)


def pool_workers() -> int:
    """The pool's worker threads in this process (engine/c/pool.c names them)."""
    tasks, n = "/proc/self/task", 0
    for t in os.listdir(tasks):
        try:
            with open(f"{tasks}/{t}/comm") as f:
                n += f.read().strip() == "lanes-pool"
        except FileNotFoundError:  # a thread (not the pool's: those are parked) ended meanwhile
            pass
    return n


def quant_dot_case(rng: np.random.Generator, type_: GGMLType, n0: int, n1: int, nb: int,
                   wild: bool = False) -> tuple:
    """quant_dot's arguments (OUT for the output) for n0 weight rows and n1 activation rows."""
    w = weight_rows(rng, type_, n0, nb, wild)
    x = padded_rows(activation_blocks(rng, type_, n1 * nb, wild), n1, nb, 3)
    return (int(type_), w.reshape(-1), w.shape[1], x.reshape(-1), x.shape[1], OUT, n0, n1, nb)


def run_c(name: str, args: tuple, n_out: int, **kwargs) -> np.ndarray:
    """engine._lanes.<name>(*args) with OUT a fresh buffer of n_out floats -> that buffer."""
    out = np.full(n_out, 0xA5A5A5A5, np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        getattr(C, name)(*(out if a is OUT else a for a in args), **kwargs)
    return out


# (n0, n1, nb) big enough for 7 threads' shares, and 3 weight rows, fewer than the threads
QUANT_SPLITS = {32: ((301, 4, 48), (3, 64, 128)), 256: ((301, 2, 12), (3, 32, 16))}


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("type_", list(QUANT_DOT), ids=lambda t: t.name)
def test_quant_dot_threads(type_: GGMLType, wild: bool):
    """The rows shared out between 2, 3 and 7 threads (the pool's workers do start): the bytes
    of one thread, and the twin's bits; the portable loop likewise."""
    rng = np.random.default_rng([int(type_), wild, 11])
    elems = QUANT_KINDS[type_].blck_size
    for n0, n1, nb in QUANT_SPLITS[elems]:
        args = quant_dot_case(rng, type_, n0, n1, nb, wild)
        for portable in (0, 1, 2):
            one = run_c("quant_dot", args + (portable, 1), n0 * n1)
            for threads in THREADS:
                many = run_c("quant_dot", args + (portable, threads), n0 * n1)
                assert one.tobytes() == many.tobytes(), f"{type_.name} {n0}x{n1}x{nb} {threads}"
        c, t = run_both("quant_dot", args, n0 * n1)
        assert_same_bits(c, t, f"quant_dot {type_.name} {n0}x{n1}x{nb}")
    assert pool_workers() >= max(THREADS) - 1


@pytest.mark.parametrize("weights", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("tiny", [False, True], ids=["f16", "tiny"])
def test_float_dot_threads(tiny: bool, weights: str):
    """float_dot's weight rows shared out between 2, 3 and 7 threads: one thread's bytes, the
    twin's bits; also 3 rows for 7 threads, and threads by keyword."""
    rng = np.random.default_rng([tiny, ("f32", "f16", "bf16").index(weights), 12])
    for n0, n1, k in ((301, 3, 2048), (3, 64, 4096), (67, 2, 4096 if tiny else 4101)):
        x = float_rows(rng, n1, k, True)
        kw = {"bf16": True} if weights == "bf16" else {}
        if weights == "f32":
            args = (float_rows(rng, n0, k, True), x, OUT, n0, n1, k, tiny)
        else:
            ldw = k + 5
            bits = bf16s if weights == "bf16" else halves
            w = bits(rng, (n0, ldw), True).reshape(-1)[:(n0 - 1) * ldw + k]
            args = (w, x, OUT, n0, n1, k, tiny, ldw)
        one = run_c("float_dot", args, n0 * n1, **kw)
        for threads in THREADS:
            many = run_c("float_dot", args, n0 * n1, threads=threads, **kw)
            assert one.tobytes() == many.tobytes(), f"float_dot {n0}x{n1}x{k} {threads}"
        c, t = run_both("float_dot", args + ((1, True) if kw else ()), n0 * n1)
        assert_same_bits(c, t, f"float_dot {weights} {n0}x{n1}x{k}")
    assert pool_workers() >= max(THREADS) - 1


def test_pool_busy():
    """Products asked from several Python threads at once: the pool runs one, the others run on
    their own threads, all with one thread's bytes."""
    args = quant_dot_case(np.random.default_rng(13), GGMLType.Q4_0, 301, 4, 48)
    want = run_c("quant_dot", args + (False, 1), 301 * 4)
    got = [None] * 6

    def product(i: int) -> None:
        got[i] = [run_c("quant_dot", args + (False, 3), 301 * 4).tobytes() for _ in range(5)]

    threads = [threading.Thread(target=product, args=(i,)) for i in range(len(got))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(g == [want.tobytes()] * 5 for g in got)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork")
def test_pool_after_fork():
    """A forked child has none of its parent's workers: its pool starts again, the products
    finish (not waiting on threads that are not there) with the parent's bytes."""
    args = quant_dot_case(np.random.default_rng(14), GGMLType.Q4_0, 301, 4, 48)
    want = run_c("quant_dot", args + (False, 7), 301 * 4).tobytes()
    assert pool_workers() >= 6
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: only this thread
        try:
            ok = pool_workers() == 0
            ok &= all(run_c("quant_dot", args + (False, 3), 301 * 4).tobytes() == want
                      for _ in range(3))
            ok &= pool_workers() == 2
            os.write(write, b"ok" if ok else b"no")
        finally:
            os._exit(0)
    os.close(write)
    ready = select.select([read], [], [], 30)[0]
    answer = os.read(read, 2) if ready else b"hung"
    os.close(read)
    if not ready:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert answer == b"ok"


# --- dequantize --------------------------------------------------------------------------------

@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("type_", list(DEQUANTIZE), ids=lambda t: t.name)
def test_dequantize(type_: GGMLType, wild: bool):
    rng = np.random.default_rng([int(type_), wild, 7])
    size, elems = QUANT_KINDS[type_].type_size, QUANT_KINDS[type_].blck_size
    for nb in (1, 3, 200):
        raw = quant_blocks(rng, nb, size, d_at(type_), wild)
        c, t = run_both("dequantize", (int(type_), raw, OUT), nb * elems)
        assert_same_bits(c, t, f"dequantize {type_.name} nb={nb}")


# --- the vector ops, soft_max, quantize_q8_0; fmaf and libm --------------------------------------

SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, 1.17549435e-38, 3.4e38,
                    -3.4e38, 88.72, -87.33, -103.97, 89.0, -89.0, 126 * 0.6931, 127 * 0.6932, -150.0,
                    -200.0, 1.0, -1.0], F32)


def bit_patterns(rng: np.random.Generator, n: int) -> np.ndarray:
    """n floats: a third random bit patterns, a third normal values of every size, and SPECIAL."""
    raw = rng.integers(0, 1 << 32, n // 3, dtype=np.uint64).astype(np.uint32).view(F32)
    wide = (rng.standard_normal(n // 3) * 10.0 ** rng.integers(-3, 4, n // 3)).astype(F32)
    normal = rng.standard_normal(n - 2 * (n // 3) - len(SPECIAL)).astype(F32)
    return np.concatenate([raw, wide, normal, SPECIAL])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def test_every_c_function_has_a_twin():
    c = compiled()
    assert c is not None, "engine._lanes is not built: `make setup` compiles it"
    exported = {n for n in dir(c) if not n.startswith("_") and callable(getattr(c, n))}
    assert exported == set(NAMES), "engine.lanes.NAMES lists what engine._lanes exports"
    assert set(TWINS) == set(NAMES), f"no twin for {set(NAMES) - set(TWINS)}"


@pytest.mark.parametrize("name", ["v_expf", "v_silu"])
def test_lanes_of_a_vector_op(name):
    x = bit_patterns(np.random.default_rng(1), 300_000)
    want, got = np.empty_like(x), np.empty_like(x)
    getattr(compiled(), name)(x, want)
    TWINS[name](x, got)
    assert same_bits(want, got)


def test_geglu_on_threads():
    """gelu_lookup times g (geglu): on 1 and 3 threads, C and the twin give the same bits."""
    rng = np.random.default_rng(6)
    x, g = bit_patterns(rng, 300_001), rng.permutation(bit_patterns(rng, 300_001))
    table = widened_table("gelu")
    got = []
    for fn, threads in ((compiled().gelu_lookup, 1), (compiled().gelu_lookup, 3),
                        (TWINS["gelu_lookup"], 1)):
        out = np.empty_like(x)
        with np.errstate(all="ignore"):
            fn(x, table, out, True, g, threads)
        got.append(out)
    assert same_bits(got[0], got[1])
    assert_same_bits(got[0], got[2], "geglu: C and the twin")  # (x times g: two NaNs may meet)


def test_silu_times_g_on_threads():
    """v_silu times g (swiglu): on 1 and 3 threads, C and the twin give the same bits."""
    rng = np.random.default_rng(4)
    x, g = bit_patterns(rng, 300_001), rng.permutation(bit_patterns(rng, 300_001))
    got = []
    for fn, threads in ((compiled().v_silu, 1), (compiled().v_silu, 3), (TWINS["v_silu"], 1)):
        out = np.empty_like(x)
        with np.errstate(all="ignore"):
            fn(x, out, g, threads)
        got.append(out)
    assert same_bits(got[0], got[1])
    assert_same_bits(got[0], got[2], "swiglu: C and the twin")  # (silu(x) times g: NaNs may meet)


@pytest.mark.parametrize("table,clamp", [("gelu", True), ("gelu_quick", False)])
def test_gelu_lookup(table, clamp):
    """Bit patterns, values around ±10, and fp16's halfway points (ties to even)."""
    rng = np.random.default_rng(3)
    halfway = (np.arange(0x3000, 0x4A00, 7, dtype=np.uint32) << 13 | 0x1000).view(F32)
    x = np.concatenate([bit_patterns(rng, 300_000), rng.uniform(-11, 11, 10_000).astype(F32),
                        halfway, -halfway, np.array([10, -10, 9.9999995, -9.9999995], F32)])
    t = widened_table(table)
    want, got = np.empty_like(x), np.empty_like(x)
    compiled().gelu_lookup(x, t, want, clamp)
    TWINS["gelu_lookup"](x, t, got, clamp)
    assert same_bits(want, got)


@pytest.mark.parametrize("rows,n", [(3, 1), (5, 8), (4, 37), (2, 1000), (7, 4096 + 3), (1, 0), (0, 5)])
def test_soft_max(rows, n):
    rng = np.random.default_rng(rows * 1000 + n)
    w = (rng.standard_normal(rows * n) * 8).astype(F32)
    if w.size > 4:
        w[[1, 3]] = -np.inf, np.nan  # a masked position; a NaN spreads through its row
    mx = w.reshape(rows, n).max(axis=1, initial=-np.inf).astype(F32)
    out = [(np.empty(rows * n, F32), np.empty(rows)) for _ in range(2)]
    compiled().soft_max(w, mx, out[0][0], out[0][1], rows, n)
    TWINS["soft_max"](w, mx, out[1][0], out[1][1], rows, n)
    assert same_bits(out[0][0], out[1][0]) and same_bits(out[0][1], out[1][1])


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (5, 8), (4, 37), (1, 4096), (9, 4099),
                                    (130, 67), (2, 0), (0, 5), (97, 4099)])
def test_norm_rows(rows, n, wild):
    """Rows packed, and rows further apart than a row (ldx, ldy bytes), in place and not: C's
    AVX2 and portable loops and the twin give the same bits; rows of -0.0, of one value, of
    values a mean's sum straddles a rounding boundary with."""
    rng = np.random.default_rng([rows, n, wild])
    x = float_rows(rng, rows, n, wild)
    if rows >= 3 and n:
        x[0] = -0.0  # the sum starts at +0.0: the mean is +0.0
        x[1] = F32(3.5)  # no variance: y = 0 * 1/sqrtf(eps)
        x[2, :2], x[2, 2:] = (F32(1), F32(2 ** -24)), F32(2 ** -60)  # 1 + 2^-24 is a tie
    for ldx, ldy in ((4 * n, 4 * n), (4 * n + 12, 4 * n + 20)):
        xb = np.zeros((rows, ldx // 4), F32)
        xb[:, :n] = x
        xb = xb.reshape(-1)[:max(0, (rows - 1) * ldx // 4 + n)]
        got = []
        for fn, extra in ((C.norm_rows, (False,)), (C.norm_rows, (True,)),
                          (C.norm_rows, (False, 3)), (TWINS["norm_rows"], ())):
            for inplace in (False, True):
                y = xb.copy() if inplace else np.full(max(0, (rows - 1) * ldy // 4 + n),
                                                      0xA5A5A5A5, np.uint32).view(F32)
                with np.errstate(all="ignore"):
                    fn(y if inplace else xb, y, rows, n, ldx, ldx if inplace else ldy, 1e-5,
                       *extra)
                got.append(y)
        for i, g in enumerate(got[2:], 2):  # each against C's AVX2 loop, in place or not
            assert_same_bits(got[i % 2], g, f"norm_rows {rows}x{n} ld={ldx},{ldy} run {i}")
        if ldx == ldy:
            assert_same_bits(got[0], got[1], f"norm_rows {rows}x{n} in place")


@pytest.mark.parametrize("wild", [False, True], ids=["values", "bits"])
@pytest.mark.parametrize("rows,n", [(1, 1), (3, 7), (4, 37), (1, 4096), (9, 4099), (130, 67),
                                    (2, 0), (0, 5), (97, 4099)])
def test_rms_norm_rows(rows, n, wild):
    """rms_norm_rows: C and the twin give the same bits, rows packed or spaced, in place or not;
    a row whose squares' left-to-right sum is a tie a pairwise sum would break."""
    rng = np.random.default_rng([rows, n, wild, 1])
    x = float_rows(rng, rows, n, wild)
    if rows >= 3 and n >= 3:
        x[2, :2], x[2, 2:] = (F32(1), F32(2 ** -12)), F32(2 ** -30)
    for ldx, ldy in ((4 * n, 4 * n), (4 * n + 12, 4 * n + 20)):
        xb = np.zeros((rows, ldx // 4), F32)
        xb[:, :n] = x
        xb = xb.reshape(-1)[:max(0, (rows - 1) * ldx // 4 + n)]
        got = []
        for fn, extra in ((C.rms_norm_rows, ()), (TWINS["rms_norm_rows"], ()),
                          (C.rms_norm_rows, (3,))):  # (3 threads: the same bits)
            for inplace in (False, True):
                y = xb.copy() if inplace else np.full(max(0, (rows - 1) * ldy // 4 + n),
                                                      0xA5A5A5A5, np.uint32).view(F32)
                with np.errstate(all="ignore"):
                    fn(y if inplace else xb, y, rows, n, ldx, ldx if inplace else ldy, 1e-6,
                       *extra)
                got.append(y)
        for i in (2, 4):
            assert_same_bits(got[0], got[i], f"rms_norm_rows {rows}x{n} ld={ldx},{ldy} run {i}")
            assert_same_bits(got[1], got[i + 1], f"rms_norm_rows {rows}x{n} ld={ldx} in place")


def test_quantize_q8_0():
    x = bit_patterns(np.random.default_rng(2), 32 * 3000)
    x = x[: len(x) // 32 * 32]
    want, got = np.empty(len(x) // 32 * 34, np.uint8), np.empty(len(x) // 32 * 34, np.uint8)
    compiled().quantize_q8_0(x, want)
    TWINS["quantize_q8_0"](x, got)
    assert same_bits(want, got)


@pytest.mark.parametrize("rows,n,ldx,ldy,h,step,off", [
    (3, 64, 64, 70, 16, 2, 1),  # NORMAL: pairs (2k, 2k+1) over the first 32 dims, rows spaced
    (4, 128, 130, 128, 32, 1, 32),  # NEOX: pairs (k, k + 32) over the first 64
    (2, 256, 256, 256, 128, 1, 128),  # every dim rotated (vision: pairs (k, k + ne0/2))
    (1, 10, 10, 10, 5, 1, 5), (5, 8, 8, 8, 0, 1, 1),  # a short row; nothing rotated (a copy)
])
def test_rope_pairs(rows, n, ldx, ldy, h, step, off):
    """The rope rotation: every bit pattern in x and in the angles' cos and sin."""
    rng = np.random.default_rng(rows * n + h)

    def floats(k: int) -> np.ndarray:  # k of every kind of float, shuffled
        return rng.permutation(bit_patterns(rng, max(k, 300)))[:k]
    x = floats((rows - 1) * ldx + n)
    cs, sn = floats(max(h, 1)), floats(max(h, 1))
    want = np.zeros((rows - 1) * ldy + n, F32)
    got = want.copy()
    compiled().rope_pairs(x, want, cs, sn, rows, n, ldx, ldy, h, step, off)
    TWINS["rope_pairs"](x, got, cs, sn, rows, n, ldx, ldy, h, step, off)
    assert same_bits(want, got)
    inplace = x.copy()  # y may be x: each pair is read before it is written
    compiled().rope_pairs(inplace, inplace, cs, sn, rows, n, ldx, ldx, h, step, off)
    assert same_bits(inplace[:n], want[:n])


def test_quantize_q8_k():
    """Bit patterns of every kind (NaN and infinity among them), ordinary rows of every scale,
    and blocks that are all zero or zero but for one value."""
    rng = np.random.default_rng(5)
    x = bit_patterns(rng, 256 * 400)
    x = np.concatenate([x[: len(x) // 256 * 256],
                        (rng.standard_normal((64, 256)) * rng.uniform(1e-3, 1e3, (64, 1))).astype(F32).reshape(-1),
                        np.zeros(512, F32)])
    x[-100] = F32(-3)
    n = len(x) // 256
    want, got = np.empty(n * 292, np.uint8), np.empty(n * 292, np.uint8)
    compiled().quantize_q8_k(x, want)
    TWINS["quantize_q8_k"](x, got)
    assert same_bits(want, got)


def _libm_function(name: str, nargs: int):
    fn = getattr(ctypes.CDLL(ctypes.util.find_library("m")), name)
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float] * nargs
    return fn


def test_fmaf_is_the_c_library_s():
    """The twins' fused multiply-add is correctly rounded: equal to libm's fmaf, also where the
    double sum lands on a float's rounding midpoint."""
    rng = np.random.default_rng(3)
    n = 20_000
    a, b, c = (bit_patterns(rng, n) for _ in range(3))
    # products whose sum with c is a float midpoint plus a tiny remainder
    a2 = (1 + rng.integers(0, 1 << 23, n) / 2 ** 23).astype(F32)
    b2 = np.full(n, 1 + 2 ** -23, F32)
    c2 = (rng.standard_normal(n) * 1e-30).astype(F32)
    with np.errstate(all="ignore"):
        cancel = (-(a.astype(np.float64) * b)).astype(F32)  # c close to -(a * b)
    c_fmaf = _libm_function("fmaf", 3)
    for x, y, z in ((a, b, c), (a2, b2, c2), (a, b, cancel)):
        with np.errstate(all="ignore"):
            got = fmaf(x, y, z)
        want = np.array([c_fmaf(*v) for v in zip(x.tolist(), y.tolist(), z.tolist())], F32)
        assert same_bits(want, got)
    # as quant_dot's twin calls it: integer lanes times a broadcast scale plus a strided
    # accumulator, sums that often sit exactly on a midpoint between two floats
    lanes = rng.integers(-3000, 3000, (8, 500)).astype(F32)
    scale = (rng.integers(1, 1 << 11, 500) * 2.0 ** -20).astype(F32)[None, :]
    acc = (rng.integers(-(1 << 22), 1 << 22, (500, 8)) * 2.0 ** -24).astype(F32).T
    got = fmaf(lanes, scale, acc)
    x, y, z = np.broadcast_arrays(lanes, scale, acc)
    want = np.array([c_fmaf(*v) for v in zip(x.ravel().tolist(), y.ravel().tolist(),
                                              z.ravel().tolist())], F32).reshape(got.shape)
    assert same_bits(want, got)


def test_fmaf_over_buffers():
    """The C loop and its twin on random bit patterns and ordinary values: the same bits, NaN
    payloads included (both give an operand's NaN, b's, a's, then c's, quiet)."""
    rng = np.random.default_rng(5)
    for make in (bit_patterns, ordinary_floats):
        a, b, c = (make(rng, 30_000) for _ in range(3))
        got_c, got_twin = run_both("fmaf", (a, b, c, OUT), a.size)
        assert same_bits(got_c, got_twin)
        # step after step: a and b hold 6 steps of 5,000, each accumulated into the last
        got_c, got_twin = run_both("fmaf", (a, b, c[:5000], OUT), 5000)
        assert same_bits(got_c, got_twin)
    acc = c[:5000]
    for k in range(6):
        acc = fmaf(a[k * 5000:(k + 1) * 5000], b[k * 5000:(k + 1) * 5000], acc)
    assert same_bits(fmaf_steps(a.reshape(6, 5000), b.reshape(6, 5000), c[:5000]), acc)


def test_libm_without_the_extension():
    """The ctypes fallback of an install without a compiler calls the same C functions."""
    each = libm._EachByCtypes()
    x = bit_patterns(np.random.default_rng(4), 6000)
    for name in ("expf", "logf", "tanhf", "sinf", "erff"):
        want, got = np.empty_like(x), np.empty_like(x)
        getattr(libm._libm, name)(x, want)
        getattr(each, name)(x, got)
        assert same_bits(want, got), name
    want, got = np.empty_like(x), np.empty_like(x)
    libm._libm.powf(x, x[::-1].copy(), want)
    each.powf(x, x[::-1].copy(), got)
    assert same_bits(want, got)


@pytest.mark.parametrize("bf16", [False, True])
def test_round_floats(bf16):
    """Floats to halves (bf16) and back: every bit pattern, with and without the widened copy."""
    x = bit_patterns(np.random.default_rng(5), 100_003)
    want = [np.empty(len(x), np.uint16), np.empty(len(x), np.float32)]
    got = [np.empty(len(x), np.uint16), np.empty(len(x), np.float32)]
    compiled().round_floats(x, want[0], want[1], bf16)
    TWINS["round_floats"](x, got[0], got[1], bf16)
    assert same_bits(want[0], got[0]) and same_bits(want[1], got[1])
    bits = np.empty(len(x), np.uint16)
    compiled().round_floats(x, bits, None, bf16)
    assert same_bits(bits, want[0])


@pytest.mark.parametrize("kind,wide", [(0, False), (1, True), (2, False), (1, False)])
def test_set_rows(kind, wide):
    """Rows scattered by index, rows and indices spaced, an index repeated (the last row stays);
    an index outside the destination names the first such row and writes nothing."""
    rng = np.random.default_rng(kind * 2 + wide)
    rows, n, ne1, ldx, ldo = 9, 37, 12, 37 * 4 + 12, (37 + 3) * (4 if kind == 0 else 2)
    x = bit_patterns(rng, rows * ldx // 4).view(np.uint8)
    at = rng.integers(0, ne1, (rows, 3)).astype(np.int64 if wide else np.int32)
    at[5, 0] = at[2, 0]  # (a repeat)
    idx = at.view(np.uint8).reshape(-1)
    ldi = at.strides[0]
    outs = []
    for fn in (getattr(compiled(), "set_rows"), TWINS["set_rows"]):
        out = np.full(ne1 * ldo, 0xA5, np.uint8)
        assert fn(x, ldx, idx, ldi, wide, out, ldo, ne1, rows, n, kind) == -1
        outs.append(out)
    assert same_bits(*outs)
    at[4, 0], at[7, 0] = ne1, -1
    for fn in (getattr(compiled(), "set_rows"), TWINS["set_rows"]):
        out = np.full(ne1 * ldo, 0xA5, np.uint8)
        assert fn(x, ldx, idx, ldi, wide, out, ldo, ne1, rows, n, kind) == 4
        assert (out == 0xA5).all()


@pytest.mark.parametrize("mask,slopes,sinks,rows", [
    (None, "unit", False, 3), ("f32", "unit", False, 3), ("f16", "alibi", True, 3),
    ("f32", "alibi", False, 3), (None, "unit", True, 3), ("f16", "alibi", True, 1500)])
def test_soft_max_heads(mask, slopes, sinks, rows):
    """soft_max's whole row: heads and rows spaced, a mask shared by two heads, wild scores; on
    one thread and on three (the same bits)."""
    rng = np.random.default_rng(len(str((mask, slopes, sinks))))
    heads, n, mheads = 4, 45, 2
    x = wild_floats(rng, heads * rows, n + 3).reshape(-1)
    xh, xr = rows * (n + 3) * 4, (n + 3) * 4
    mt = np.float16 if mask == "f16" else F32
    m = (rng.standard_normal(mheads * (rows + 1) * n) * 3).astype(mt)
    m[::7] = -np.inf
    sl = np.ones(heads, F32) if slopes == "unit" else np.array([0.5, 0.25, 0.125, 2.0], F32)
    sk = rng.standard_normal(heads).astype(F32) if sinks else None
    args = (None if mask is None else m.view(np.uint8), sk, sl, F32(0.125), heads, rows, n, xh, xr,
            xh, xr, mheads, (rows + 1) * n * m.itemsize, n * m.itemsize, mask == "f16")
    c, t = run_both("soft_max_heads", (x.view(np.uint8), OUT) + args, len(x))
    assert_same_bits(c, t, f"soft_max_heads mask={mask} slopes={slopes} sinks={sinks}")
    c3 = run_c("soft_max_heads", (x.view(np.uint8), OUT) + args + (3,), len(x))
    assert same_bits(c, c3)
