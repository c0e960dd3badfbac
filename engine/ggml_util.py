"""The small functions of ggml.h around the tensors: conversions, clocks, the version, status and
op descriptions, index arithmetic, logging and abort callbacks, file types, and row validation.

Mirrors ggml.c (and ggml-quants.c's ggml_validate_row_data). Differences forced by Python, as in
the rest of the facade: out-pointers become return values (`ggml_unravel_index`, `ggml_log_get`),
a `void *` is the simulated address (`ggml_get_data`), row converters take and return arrays.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import numpy as np

from engine.compute import GGML_STATUS_ABORTED, GGML_STATUS_SUCCESS
from engine.core.api import query
from engine.core.errors import GGMLAbortError, ggml_assert
from engine.core.graph import Graph
from engine.core.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp, ggml_glu_op_name, ggml_op_name, ggml_unary_op_name
from engine.quants import QUANT_KINDS
from engine.core.tensor import Tensor
from engine.core.types import GGML_TYPE_COUNT, GGMLType, TYPE_TRAITS, bf16_bits_to_fp32, fp16_bits_to_fp32, \
    fp32_to_bf16_bits, fp32_to_fp16_bits

GGML_VERSION = "0.15.3"  # the version of the ggml the engine is checked against (the oracle's)
GGML_COMMIT = "unknown"

GGML_STATUS_ALLOC_FAILED, GGML_STATUS_FAILED = -2, -1  # (SUCCESS and ABORTED: engine/compute)
_STATUS = {GGML_STATUS_ALLOC_FAILED: "GGML status: error (failed to allocate memory)",
           GGML_STATUS_FAILED: "GGML status: error (operation failed)",
           GGML_STATUS_SUCCESS: "GGML status: success",
           GGML_STATUS_ABORTED: "GGML status: warning (operation aborted)"}

GGML_LOG_LEVEL_NONE, GGML_LOG_LEVEL_DEBUG, GGML_LOG_LEVEL_INFO = 0, 1, 2
GGML_LOG_LEVEL_WARN, GGML_LOG_LEVEL_ERROR, GGML_LOG_LEVEL_CONT = 3, 4, 5

# enum ggml_ftype: a whole model file's "mostly" type
GGML_FTYPE_UNKNOWN, GGML_FTYPE_ALL_F32, GGML_FTYPE_MOSTLY_F16 = -1, 0, 1
GGML_FTYPE_MOSTLY_Q4_0, GGML_FTYPE_MOSTLY_Q4_1, GGML_FTYPE_MOSTLY_Q4_1_SOME_F16 = 2, 3, 4
GGML_FTYPE_MOSTLY_Q8_0, GGML_FTYPE_MOSTLY_Q5_0, GGML_FTYPE_MOSTLY_Q5_1 = 7, 8, 9
GGML_FTYPE_MOSTLY_Q2_K, GGML_FTYPE_MOSTLY_Q3_K, GGML_FTYPE_MOSTLY_Q4_K = 10, 11, 12
GGML_FTYPE_MOSTLY_Q5_K, GGML_FTYPE_MOSTLY_Q6_K, GGML_FTYPE_MOSTLY_IQ2_XXS = 13, 14, 15
GGML_FTYPE_MOSTLY_IQ2_XS, GGML_FTYPE_MOSTLY_IQ3_XXS, GGML_FTYPE_MOSTLY_IQ1_S = 16, 17, 18
GGML_FTYPE_MOSTLY_IQ4_NL, GGML_FTYPE_MOSTLY_IQ3_S, GGML_FTYPE_MOSTLY_IQ2_S = 19, 20, 21
GGML_FTYPE_MOSTLY_IQ4_XS, GGML_FTYPE_MOSTLY_IQ1_M, GGML_FTYPE_MOSTLY_BF16 = 22, 23, 24
GGML_FTYPE_MOSTLY_MXFP4, GGML_FTYPE_MOSTLY_NVFP4, GGML_FTYPE_MOSTLY_Q1_0 = 25, 26, 27

T = GGMLType
_FTYPE_TYPE = {
    GGML_FTYPE_ALL_F32: T.F32, GGML_FTYPE_MOSTLY_F16: T.F16, GGML_FTYPE_MOSTLY_BF16: T.BF16,
    GGML_FTYPE_MOSTLY_Q4_0: T.Q4_0, GGML_FTYPE_MOSTLY_Q4_1: T.Q4_1, GGML_FTYPE_MOSTLY_Q1_0: T.Q1_0,
    GGML_FTYPE_MOSTLY_Q5_0: T.Q5_0, GGML_FTYPE_MOSTLY_Q5_1: T.Q5_1, GGML_FTYPE_MOSTLY_Q8_0: T.Q8_0,
    GGML_FTYPE_MOSTLY_MXFP4: T.MXFP4, GGML_FTYPE_MOSTLY_NVFP4: T.NVFP4, GGML_FTYPE_MOSTLY_Q2_K: T.Q2_K,
    GGML_FTYPE_MOSTLY_Q3_K: T.Q3_K, GGML_FTYPE_MOSTLY_Q4_K: T.Q4_K, GGML_FTYPE_MOSTLY_Q5_K: T.Q5_K,
    GGML_FTYPE_MOSTLY_Q6_K: T.Q6_K, GGML_FTYPE_MOSTLY_IQ2_XXS: T.IQ2_XXS, GGML_FTYPE_MOSTLY_IQ2_XS: T.IQ2_XS,
    GGML_FTYPE_MOSTLY_IQ3_XXS: T.IQ3_XXS, GGML_FTYPE_MOSTLY_IQ1_S: T.IQ1_S, GGML_FTYPE_MOSTLY_IQ1_M: T.IQ1_M,
    GGML_FTYPE_MOSTLY_IQ4_NL: T.IQ4_NL, GGML_FTYPE_MOSTLY_IQ4_XS: T.IQ4_XS, GGML_FTYPE_MOSTLY_IQ3_S: T.IQ3_S,
    GGML_FTYPE_MOSTLY_IQ2_S: T.IQ2_S,
}


# --- fp16 / bf16 -------------------------------------------------------------------------------

@query
def ggml_fp16_to_fp32(x: int) -> float:
    """ggml_fp16_to_fp32: the float an IEEE half (its 16 bits) stands for."""
    return float(fp16_bits_to_fp32(np.array([x], np.uint16))[0])


@query
def ggml_fp32_to_fp16(x: float) -> int:
    """ggml_fp32_to_fp16: the nearest IEEE half (round to nearest even), as its 16 bits."""
    return int(fp32_to_fp16_bits(np.array([x], np.float32))[0])


@query
def ggml_bf16_to_fp32(x: int) -> float:
    """ggml_bf16_to_fp32: a bfloat16 (its 16 bits) widened to float."""
    return float(bf16_bits_to_fp32(np.array([x], np.uint16))[0])


@query
def ggml_fp32_to_bf16(x: float) -> int:
    """ggml_fp32_to_bf16: round to nearest even; a NaN keeps its top bits, made quiet."""
    return int(fp32_to_bf16_bits(np.array([x], np.float32))[0])


@query
def ggml_fp16_to_fp32_row(x, n: int) -> np.ndarray:
    """ggml_fp16_to_fp32_row: n halves (uint16 bits) to floats."""
    return fp16_bits_to_fp32(np.asarray(x, np.uint16)[:n])


@query
def ggml_fp32_to_fp16_row(x, n: int) -> np.ndarray:
    """ggml_fp32_to_fp16_row: n floats to halves (uint16 bits)."""
    return fp32_to_fp16_bits(np.asarray(x, np.float32)[:n])


@query
def ggml_bf16_to_fp32_row(x, n: int) -> np.ndarray:
    """ggml_bf16_to_fp32_row: n bfloat16s (uint16 bits) to floats."""
    return bf16_bits_to_fp32(np.asarray(x, np.uint16)[:n])


@query
def ggml_fp32_to_bf16_row(x, n: int) -> np.ndarray:
    """ggml_fp32_to_bf16_row: n floats to bfloat16 bits, rounding to nearest even."""
    return fp32_to_bf16_bits(np.asarray(x, np.float32)[:n])


@query
def ggml_fp32_to_bf16_row_ref(x, n: int) -> np.ndarray:
    """ggml_fp32_to_bf16_row_ref: the reference converter (the same rounding)."""
    return ggml_fp32_to_bf16_row(x, n)


# --- clocks, version, status -------------------------------------------------------------------

_T0 = time.monotonic_ns()


@query
def ggml_time_init() -> None:
    """ggml_time_init: a no-op on Linux (the clock needs no set-up)."""


@query
def ggml_time_ms() -> int:
    """ggml_time_ms: a monotonic clock in milliseconds."""
    return (time.monotonic_ns() - _T0) // 1_000_000


@query
def ggml_time_us() -> int:
    """ggml_time_us: a monotonic clock in microseconds."""
    return (time.monotonic_ns() - _T0) // 1_000


@query
def ggml_cycles() -> int:
    """ggml_cycles: clock() in C, the process's CPU time in clock ticks (CLOCKS_PER_SEC = 10^6)."""
    return time.process_time_ns() // 1_000


@query
def ggml_cycles_per_ms() -> int:
    """ggml_cycles_per_ms: CLOCKS_PER_SEC / 1000."""
    return 1000


@query
def ggml_version() -> str:
    return GGML_VERSION


@query
def ggml_commit() -> str:
    return GGML_COMMIT


@query
def ggml_status_to_string(status: int) -> str:
    """ggml_status_to_string: the words for a ggml_status."""
    return _STATUS.get(int(status), "GGML status: unknown")


# --- tensors and graphs --------------------------------------------------------------------------

@query
def ggml_get_unary_op(t: Tensor) -> GGMLUnaryOp:
    """ggml_get_unary_op: op_params[0] of a UNARY node."""
    ggml_assert(t.op == GGMLOp.UNARY, "tensor->op == GGML_OP_UNARY", "ggml_get_unary_op")
    return GGMLUnaryOp(int(t.op_params[0]))


@query
def ggml_get_glu_op(t: Tensor) -> GGMLGluOp:
    """ggml_get_glu_op: op_params[0] of a GLU node."""
    ggml_assert(t.op == GGMLOp.GLU, "tensor->op == GGML_OP_GLU", "ggml_get_glu_op")
    return GGMLGluOp(int(t.op_params[0]))


@query
def ggml_op_desc(t: Tensor) -> str:
    """ggml_op_desc: the unary or GLU op's name for those nodes, else the op's name."""
    if t.op == GGMLOp.UNARY:
        return ggml_unary_op_name(ggml_get_unary_op(t))
    if t.op == GGMLOp.GLU:
        return ggml_glu_op_name(ggml_get_glu_op(t))
    return ggml_op_name(t.op)


@query
def ggml_is_view(t: Tensor) -> bool:
    """ggml_is_view: does the tensor look into another's data (view_src set)?"""
    return t.view_src is not None


@query
def ggml_unravel_index(t: Tensor, i: int) -> tuple[int, int, int, int]:
    """ggml_unravel_index: the 4-d index (i0, i1, i2, i3) of flat element i (ne[0] fastest)."""
    ne0, ne1, ne2 = int(t.ne[0]), int(t.ne[1]), int(t.ne[2])
    i3 = i // (ne2 * ne1 * ne0)
    i2 = (i - i3 * ne2 * ne1 * ne0) // (ne1 * ne0)
    i1 = (i - i3 * ne2 * ne1 * ne0 - i2 * ne1 * ne0) // ne0
    i0 = i - i3 * ne2 * ne1 * ne0 - i2 * ne1 * ne0 - i1 * ne0
    return i0, i1, i2, i3


@query
def ggml_get_data(t: Tensor) -> int | None:
    """ggml_get_data: the data pointer (a simulated address; None for NULL)."""
    return t.data


@query
def ggml_graph_nodes(graph: Graph) -> list[Tensor]:
    """ggml_graph_nodes: the graph's nodes array (its first n_nodes entries)."""
    return list(graph.nodes)


@query
def ggml_guid_matches(a: bytes, b: bytes) -> bool:
    """ggml_guid_matches: the two 16-byte GUIDs are equal."""
    return bytes(a)[:16] == bytes(b)[:16]


@query
def ggml_ftype_to_ggml_type(ftype: int) -> GGMLType:
    """ggml_ftype_to_ggml_type: the tensor type a file type is "mostly" made of."""
    ggml_assert(int(ftype) in _FTYPE_TYPE, "wtype != GGML_TYPE_COUNT", "ggml_ftype_to_ggml_type",
                f"ftype {int(ftype)} names no single type")
    return _FTYPE_TYPE[int(ftype)]


@query
def ggml_type_sizef(type_: int) -> float:
    """ggml_type_sizef: bytes per element, as a double (type_size / blck_size)."""
    tr = TYPE_TRAITS[type_]
    return tr.type_size / tr.blck_size


@query
def ggml_quantize_init(type_: int) -> None:
    """ggml_quantize_init: ggml builds the IQ types' search tables once here; the engine builds
    them the first time a quantizer needs them (engine/quants/iqsearch.py), so there is nothing
    to do ahead of time."""
    ggml_assert(0 <= int(type_) < GGML_TYPE_COUNT, "type < GGML_TYPE_COUNT", "ggml_quantize_init")


@query
def ggml_quantize_free() -> None:
    """ggml_quantize_free: the search tables stay cached for the process (nothing to free)."""


# --- logging and abort -------------------------------------------------------------------------

LogCallback = Callable[[int, str, Any], None]


def _log_to_stderr(level: int, text: str, user_data: Any) -> None:
    sys.stderr.write(text)


_log: tuple[LogCallback, Any] = (_log_to_stderr, None)
_abort_callback: Callable[[str], None] | None = None


@query
def ggml_log_set(callback: LogCallback | None, user_data: Any = None) -> None:
    """ggml_log_set: where ggml's log lines go (None: back to stderr)."""
    global _log
    _log = (callback or _log_to_stderr, user_data)


@query
def ggml_log_get() -> tuple[LogCallback, Any]:
    """ggml_log_get: the current log callback and its user data."""
    return _log


def log_line(level: int, text: str) -> None:
    """GGML_LOG_*: one line through the log callback."""
    callback, user_data = _log
    callback(level, text, user_data)


@query
def ggml_set_abort_callback(callback: Callable[[str], None] | None):
    """ggml_set_abort_callback: called with the message before an abort; returns the old one."""
    global _abort_callback
    old, _abort_callback = _abort_callback, callback
    return old


@query
def ggml_abort(file: str, line: int, fmt: str, *args) -> None:
    """ggml_abort: "file:line: message" to the abort callback (or stderr); ggml then ends the
    process — the engine raises GGMLAbortError instead."""
    message = fmt % args if args else fmt
    text = f"{file}:{line}: {message}"
    if _abort_callback is not None:
        _abort_callback(text)
    else:
        sys.stderr.write(text + "\n")
    raise GGMLAbortError(message, f"{file}:{line}")


# --- ggml_validate_row_data (ggml-quants.c) ----------------------------------------------------

_D = ("d",)
_D_M = ("d", "m")
_D_DMIN = ("d", "dmin")
_F16_SCALES = {T.Q1_0: _D, T.Q4_0: _D, T.Q4_1: _D_M, T.Q5_0: _D, T.Q5_1: _D_M, T.Q8_0: _D,
               T.Q2_K: _D_DMIN, T.Q3_K: _D, T.Q4_K: _D_DMIN, T.Q5_K: _D_DMIN, T.Q6_K: _D,
               T.TQ1_0: _D, T.TQ2_0: _D, T.IQ1_S: _D, T.IQ2_XXS: _D, T.IQ2_XS: _D, T.IQ2_S: _D,
               T.IQ3_XXS: _D, T.IQ3_S: _D, T.IQ4_XS: _D, T.IQ4_NL: _D}
_NOTHING_TO_CHECK = {T.I8, T.I16, T.I32, T.I64, T.NVFP4}


def _first_bad_half(bits: np.ndarray) -> str | None:
    """validate_fp16 over halves in order: the first inf or NaN (exponent all ones)."""
    bad = np.flatnonzero((bits & 0x7C00) == 0x7C00)
    if bad.size == 0:
        return None
    i = int(bad[0])
    what = "inf" if (int(bits[i]) & 0x03FF) == 0 else "nan"
    return f"ggml_validate_row_data: found {what} value at block {i}"


def _first_bad_float(values: np.ndarray) -> str | None:
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size == 0:
        return None
    i = int(bad[0])
    return f"ggml_validate_row_data: found {'inf' if np.isinf(values[i]) else 'nan'} value at block {i}"


def row_data_problem(type_: int, data) -> str | None:
    """What ggml_validate_row_data would print for these bytes (None: the row is valid)."""
    raw = np.frombuffer(bytes(data) if not isinstance(data, np.ndarray) else data.tobytes(), np.uint8)
    if not 0 <= int(type_) < GGML_TYPE_COUNT or int(type_) not in {int(t) for t in GGMLType}:
        return f"ggml_validate_row_data: invalid type {int(type_)}"
    t = GGMLType(int(type_))
    tr = TYPE_TRAITS[t]
    if raw.size % tr.type_size:
        return (f"ggml_validate_row_data: invalid size {raw.size} for type {tr.type_name} "
                f"(type size = {tr.type_size})")
    if t == T.BF16:
        bits = raw.view("<u2")
        nans, infs = int(((bits & 0x7FFF) > 0x7F80).sum()), int(((bits & 0x7FFF) == 0x7F80).sum())
        if nans:
            return f"ggml_validate_row_data: found {nans} NaNs in row of {bits.size} BF16 values"
        if infs:
            return f"ggml_validate_row_data: found {infs} infinities in row of {bits.size} BF16 values"
        return None
    if t == T.F16:
        return _first_bad_half(raw.view("<u2"))
    if t in (T.F32, T.F64):
        return _first_bad_float(raw.view("<f4" if t == T.F32 else "<f8"))
    if t in _NOTHING_TO_CHECK:
        return None
    if t == T.Q8_K:
        return _first_bad_float(raw.view(QUANT_KINDS[t].dtype)["d"])
    if t == T.MXFP4:
        e = raw.view(QUANT_KINDS[t].dtype)["e"]
        bad = np.flatnonzero(e == 0xFF)
        return None if bad.size == 0 else \
            f"ggml_validate_row_data: found invalid e value 255 at block {int(bad[0])}"
    if t == T.IQ1_M:  # the fp16 super-scale is spread over the top nibbles of the 4 scale words
        sc = raw.view(QUANT_KINDS[t].dtype)["scales"].reshape(-1, 8).copy().view("<u2")
        bits = (sc[:, 0] >> 12) | ((sc[:, 1] >> 8) & 0x00F0) | ((sc[:, 2] >> 4) & 0x0F00) | (sc[:, 3] & 0xF000)
        return _first_bad_half(bits.astype(np.uint16))
    if t in _F16_SCALES:
        blocks = raw.view(QUANT_KINDS[t].dtype)
        fields = _F16_SCALES[t]
        # in block order, d before m in each block
        flags = np.stack([(blocks[f] & 0x7C00) == 0x7C00 for f in fields], axis=1)
        hit = np.flatnonzero(flags.any(axis=1))
        if hit.size == 0:
            return None
        i = int(hit[0])
        field = fields[int(np.flatnonzero(flags[i])[0])]
        what = "inf" if (int(blocks[field][i]) & 0x03FF) == 0 else "nan"
        return f"ggml_validate_row_data: found {what} value at block {i}"
    return f"ggml_validate_row_data: invalid type {int(t)}"


@query
def ggml_validate_row_data(type_: int, data, nbytes: int) -> bool:
    """ggml_validate_row_data: False (with ggml's message on stderr) when the row's bytes hold
    a NaN or inf where ggml checks (every float of F32/F16/BF16 rows, each block's scales)."""
    buf = bytes(data) if not isinstance(data, np.ndarray) else data.tobytes()
    problem = row_data_problem(type_, buf[:nbytes])
    if problem:
        sys.stderr.write(problem + "\n")
    return problem is None
