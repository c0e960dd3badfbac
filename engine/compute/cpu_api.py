"""ggml-cpu.h's small functions: the CPU features, element access by 4-d index, row converters.

The engine emulates the CPU of the oracle's build (x86-64 with AVX2, FMA, F16C, BMI2): the
`ggml_cpu_has_*` answers are that build's, checked against the oracle in
tests/conformance/test_cpu_api.py.
"""

from __future__ import annotations

import numpy as np

from engine.core.api import Writes, query, writes
from engine.core.errors import ggml_assert
from engine.core.tensor import Tensor
from engine.core.tensor_data import _element_view, _from_f32, _to_f32, tensor_view
from engine.core.types import GGMLType, bf16_bits_to_fp32, fp16_bits_to_fp32, fp32_to_bf16_bits, fp32_to_fp16_bits


@query
def ggml_cpu_has_sse3() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_ssse3() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_avx() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_avx_vnni() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_avx2() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_bmi2() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_f16c() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_fma() -> int:
    """1 on the emulated CPU."""
    return 1


@query
def ggml_cpu_has_avx512() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_avx512_vbmi() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_avx512_vnni() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_avx512_bf16() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_amx_int8() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_neon() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_arm_fma() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_fp16_va() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_dotprod() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_matmul_int8() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_sve() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_sme() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_riscv_v() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_vsx() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_vxe() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_wasm_simd() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_has_llamafile() -> int:
    """0 on the emulated CPU."""
    return 0


@query
def ggml_cpu_get_sve_cnt() -> int:
    """No SVE on x86-64."""
    return 0


@query
def ggml_cpu_get_rvv_vlen() -> int:
    """No RISC-V vectors on x86-64."""
    return 0


@query
def ggml_cpu_init() -> None:
    """ggml_cpu_init fills ggml-cpu's fp16 tables once; the engine converts exactly without them."""


@query
def ggml_numa_init(strategy: int) -> None:
    """The emulated machine has one NUMA node: nothing to set up."""


@query
def ggml_is_numa() -> bool:
    return False


def _nd(t: Tensor, i0: int, i1: int, i2: int, i3: int, fn: str) -> np.ndarray:
    dtype = _element_view(t, fn).dtype
    addr = i0 * int(t.nb[0]) + i1 * int(t.nb[1]) + i2 * int(t.nb[2]) + i3 * int(t.nb[3])
    return tensor_view(t, (1,), (dtype.itemsize,), dtype, addr, fn)


_FLOATS = (GGMLType.F16, GGMLType.BF16, GGMLType.F32)


@query
def ggml_get_f32_nd(t: Tensor, i0: int, i1: int, i2: int, i3: int) -> float:
    arr = _nd(t, i0, i1, i2, i3, "ggml_get_f32_nd")
    return float(_to_f32(t.type, arr)[0]) if t.type in _FLOATS else float(arr[0])


@writes(Writes.DATA)
def ggml_set_f32_nd(t: Tensor, i0: int, i1: int, i2: int, i3: int, value: float) -> None:
    arr = _nd(t, i0, i1, i2, i3, "ggml_set_f32_nd")
    arr[0] = _from_f32(t.type, value) if t.type in _FLOATS else np.array(np.float32(value)).astype(arr.dtype)


@query
def ggml_get_i32_nd(t: Tensor, i0: int, i1: int, i2: int, i3: int) -> int:
    arr = _nd(t, i0, i1, i2, i3, "ggml_get_i32_nd")
    return int(np.trunc(_to_f32(t.type, arr)[0])) if t.type in _FLOATS else int(arr[0])


@writes(Writes.DATA)
def ggml_set_i32_nd(t: Tensor, i0: int, i1: int, i2: int, i3: int, value: int) -> None:
    arr = _nd(t, i0, i1, i2, i3, "ggml_set_i32_nd")
    arr[0] = _from_f32(t.type, float(value)) if t.type in _FLOATS else np.array(value).astype(arr.dtype)


# row converters: C writes n values into y; here they return the converted array

@query
def ggml_cpu_fp32_to_fp32(x, n: int) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)[:n].copy()


@query
def ggml_cpu_fp32_to_i32(x, n: int) -> np.ndarray:
    """A C cast per value: truncation toward zero."""
    return np.trunc(np.asarray(x, dtype=np.float32)[:n]).astype(np.int32)


@query
def ggml_cpu_fp32_to_fp16(x, n: int) -> np.ndarray:
    """fp16 bit patterns (uint16), rounded to nearest even as F16C does."""
    return fp32_to_fp16_bits(np.asarray(x, dtype=np.float32)[:n])


@query
def ggml_cpu_fp16_to_fp32(x, n: int) -> np.ndarray:
    return fp16_bits_to_fp32(np.asarray(x, dtype=np.uint16)[:n])


@query
def ggml_cpu_fp32_to_bf16(x, n: int) -> np.ndarray:
    return fp32_to_bf16_bits(np.asarray(x, dtype=np.float32)[:n])


@query
def ggml_cpu_bf16_to_fp32(x, n: int) -> np.ndarray:
    return bf16_bits_to_fp32(np.asarray(x, dtype=np.uint16)[:n])


# --- the threadpool API -----------------------------------------------------------------------

GGML_MAX_N_THREADS = 512
GGML_SCHED_PRIO_NORMAL = 0


class ggml_threadpool_params:  # noqa: N801 - ggml's name
    """struct ggml_threadpool_params (its fields set by ggml_threadpool_params_init)."""

    cpumask: np.ndarray  # bool[GGML_MAX_N_THREADS]: the CPUs the threads may run on (all 0: any)
    n_threads: int
    prio: int  # enum ggml_sched_priority
    poll: int  # polling level, 0 (none) .. 100 (aggressive)
    strict_cpu: bool
    paused: bool  # start the threadpool paused

    def __init__(self, n_threads: int = 0) -> None:
        ggml_threadpool_params_init(self, n_threads)

    def __repr__(self) -> str:
        return (f"ggml_threadpool_params(n_threads={self.n_threads}, prio={self.prio}, poll={self.poll}, "
                f"strict_cpu={self.strict_cpu}, paused={self.paused})")


@query
def ggml_threadpool_params_init(p: ggml_threadpool_params, n_threads: int) -> None:
    """Normal priority, hybrid polling (50), no strict placement, not paused, an all-zero cpumask
    (the default affinity)."""
    p.n_threads = n_threads
    p.prio = GGML_SCHED_PRIO_NORMAL
    p.poll = 50
    p.strict_cpu = False
    p.paused = False
    p.cpumask = np.zeros(GGML_MAX_N_THREADS, dtype=bool)


@query
def ggml_threadpool_params_default(n_threads: int) -> ggml_threadpool_params:
    return ggml_threadpool_params(n_threads)


@query
def ggml_threadpool_params_match(p0: ggml_threadpool_params, p1: ggml_threadpool_params) -> bool:
    """Equal n_threads, prio, poll, strict_cpu and cpumask (`paused` is not compared)."""
    return (p0.n_threads == p1.n_threads and p0.prio == p1.prio and p0.poll == p1.poll
            and p0.strict_cpu == p1.strict_cpu and bool(np.array_equal(p0.cpumask, p1.cpumask)))


class Threadpool:
    """struct ggml_threadpool: the engine computes with its own worker pool (engine/compute/
    threadpool.py); this object carries what ggml's does for planning — the thread count — and
    the paused flag that pause/resume toggle."""

    def __init__(self, params: ggml_threadpool_params) -> None:
        ggml_assert(0 < params.n_threads <= GGML_MAX_N_THREADS,
                    "tpp->n_threads > 0 && tpp->n_threads <= GGML_MAX_N_THREADS", "ggml_threadpool_new")
        self.n_threads = params.n_threads
        self.paused = bool(params.paused)
        self.params = params
        self.freed = False

    def __repr__(self) -> str:
        return f"<ggml_threadpool n_threads={self.n_threads} paused={self.paused}>"


@query
def ggml_threadpool_new(params: ggml_threadpool_params) -> Threadpool:
    return Threadpool(params)


@query
def ggml_threadpool_free(threadpool: Threadpool | None) -> None:
    if threadpool is not None:
        threadpool.freed = True


@query
def ggml_threadpool_pause(threadpool: Threadpool) -> None:
    threadpool.paused = True


@query
def ggml_threadpool_resume(threadpool: Threadpool) -> None:
    threadpool.paused = False


@query
def ggml_threadpool_get_n_threads(threadpool: Threadpool) -> int:
    return threadpool.n_threads
