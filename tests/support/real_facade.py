"""Run a walkthrough's own code on real ggml: the same function, with ggml-python behind its names.

`run_on_real_ggml(fn, **kwargs)` executes `fn`'s code object with globals that map every facade
name the program uses onto ggml-python (str arguments become bytes, tensors are wrapped so that
`t.nb[1]` reads the C struct, `set_data` is a memcpy), and returns its outputs as numpy arrays.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

import ggml as real
import numpy as np
from ggml.utils import to_numpy as real_to_numpy

from engine.core.types import GGMLType, TYPE_TRAITS, fp32_to_bf16_bits, fp32_to_fp16_bits

# ggml-python 0.0.45 declares these functions' pointer results with a NewType of int, which ctypes
# reads as a 32-bit C int (the pointer is cut in half and crashes when used): read them as pointers.
for _name in ("ggml_backend_alloc_buffer", "ggml_backend_cpu_buffer_from_ptr", "ggml_backend_cpu_buffer_type",
              "ggml_backend_sched_get_tensor_backend"):
    getattr(real, _name).restype = ctypes.c_void_p


class RealTensor:
    """A ggml_tensor * from ggml-python, with the C fields readable as attributes."""

    def __init__(self, ptr) -> None:
        self.ptr = ptr

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.ptr.contents, name)
        return list(value) if name in ("ne", "nb", "op_params") else value


def _unwrap(a: Any) -> Any:
    if isinstance(a, RealTensor):
        return a.ptr
    if isinstance(a, str):
        return a.encode()
    if isinstance(a, (list, tuple)) and a and isinstance(a[0], RealTensor):
        return type(a)(x.ptr for x in a)
    if isinstance(a, list) and a and all(isinstance(x, int) for x in a):  # an int64_t ne[] array
        return (ctypes.c_int64 * len(a))(*a)
    return a


def _wrap(fn):
    def call(*args, **kwargs):
        result = fn(*(_unwrap(a) for a in args), **{k: _unwrap(v) for k, v in kwargs.items()})
        if isinstance(result, ctypes._Pointer) and result and \
                isinstance(result.contents, real.ggml_tensor):
            return RealTensor(result)
        return result
    return call


def _set_data(t: RealTensor, values) -> None:
    c = t.ptr.contents
    x = np.asarray(values)
    if c.type == GGMLType.F16 and x.dtype != np.float16:
        x = fp32_to_fp16_bits(x.astype(np.float32))
    elif c.type == GGMLType.BF16:
        x = fp32_to_bf16_bits(x.astype(np.float32))
    x = np.ascontiguousarray(x)
    ctypes.memmove(c.data, x.ctypes.data, real.ggml_nbytes(t.ptr))


_KEEP: list = []  # memory the C side points into, kept alive for the test run


def _init_params(mem_size: int, mem_buffer=None, no_alloc: bool = False):
    if isinstance(mem_buffer, bytearray):  # the program's own pool (simple-backend's model.buf)
        mem_buffer = (ctypes.c_char * len(mem_buffer)).from_buffer(mem_buffer)
        _KEEP.append(mem_buffer)
        mem_buffer = ctypes.cast(mem_buffer, ctypes.c_void_p)
    return real.ggml_init_params(mem_size=mem_size, mem_buffer=mem_buffer, no_alloc=no_alloc)


def _tensor_set(t: RealTensor, data, offset: int, size: int) -> None:
    """ggml_backend_tensor_set from bytes or an array (the engine's signature)."""
    raw = data if isinstance(data, (bytes, bytearray)) else np.ascontiguousarray(data).tobytes()
    buf = ctypes.create_string_buffer(bytes(raw[:size]), size)
    real.ggml_backend_tensor_set(t.ptr, buf, offset, size)


def _tensor_get(t: RealTensor, offset: int, size: int) -> bytes:
    """ggml_backend_tensor_get returning the bytes (the engine's signature)."""
    buf = ctypes.create_string_buffer(size)
    real.ggml_backend_tensor_get(t.ptr, buf, offset, size)
    return buf.raw


def _sched_new(backends, bufts, n_backends: int, graph_size: int, parallel: bool, op_offload: bool):
    arr = (real.ggml_backend_t_ctypes * len(backends))(*backends)
    _KEEP.append(arr)
    return real.ggml_backend_sched_new(arr, None if bufts is None else bufts, n_backends, graph_size, parallel,
                                       op_offload)


RPC_ENDPOINT: list[bytes] = []  # set by a test that runs an RPC server: the real accelerator


def _accel_init(name: str = "ACCEL0", backend_name=None, **caps):
    """The engine's simulated accelerator, on real ggml: the RPC backend of a loopback server
    (tests/support/rpc_server.py), which can do everything the default accelerator can."""
    assert RPC_ENDPOINT, "the program needs a second backend: run it inside tests.support.rpc_server"
    return real.ggml_backend_rpc_init(RPC_ENDPOINT[-1], 0)


class _GGUFParams:
    def __init__(self, no_alloc: bool = False, ctx: bool = False) -> None:
        self.no_alloc, self.ctx = no_alloc, ctx


def _gguf_init_from_file(path: str, params: _GGUFParams):
    """gguf_init_from_file with the ggml context out-pointer, returned as the engine returns it."""
    out = ctypes.c_void_p()
    p = real.gguf_init_params(no_alloc=params.no_alloc,
                              ctx=ctypes.pointer(out) if params.ctx else None)
    g = real.gguf_init_from_file(path.encode(), p)
    assert g, f"real ggml could not read {path}"
    return (g, out) if params.ctx else g


class _OptParams:
    """struct ggml_opt_params as the engine's program sets it: tensors and Python values, made C
    when ggml_opt_init reads it."""

    def __init__(self, sched, loss_type: int) -> None:
        object.__setattr__(self, "c", real.ggml_opt_default_params(sched, loss_type))

    def __setattr__(self, name: str, value) -> None:
        setattr(self.c, name, value.ptr if isinstance(value, RealTensor) else value)


def _opt_epoch(opt_ctx, dataset, result_train, result_eval, idata_split: int, callback_train, callback_eval):
    assert callback_train is None and callback_eval is None, "only ggml_opt_epoch without callbacks is mapped"
    null = ctypes.cast(None, real.ggml_opt_epoch_callback)
    real.ggml_opt_epoch(opt_ctx, dataset, result_train, result_eval, idata_split, null, null)


def _opt_result_pair(fn):
    """ggml_opt_result_loss/_accuracy returning (value, uncertainty), as the engine's do."""
    def call(result):
        a, b = ctypes.c_double(), ctypes.c_double()
        fn(result, ctypes.byref(a), ctypes.byref(b))
        return a.value, b.value
    return call


def _opt_result_pred(result) -> list[int]:
    n = ctypes.c_int64()
    real.ggml_opt_result_ndata(result, ctypes.byref(n))
    pred = (ctypes.c_int32 * max(n.value, 1))()
    real.ggml_opt_result_pred(result, pred)
    return list(pred)[:n.value]


def real_namespace() -> dict:
    ns: dict[str, Any] = {"np": np}
    for name in dir(real):
        obj = getattr(real, name)
        if name.startswith(("ggml_", "gguf_")) and callable(obj):
            ns[name] = _wrap(obj)
        elif name.startswith("GGML_"):
            ns[name] = obj
    ns["ggml_init_params"] = _init_params
    ns["set_data"] = _set_data
    ns["to_numpy"] = lambda t: real_to_numpy(t.ptr)
    ns["gguf_init_params"] = _GGUFParams
    ns["gguf_init_from_file"] = _gguf_init_from_file
    ns["gguf_get_tensor_name"] = lambda g, i: real.gguf_get_tensor_name(g, i).decode()
    ns["ggml_backend_tensor_set"] = _tensor_set
    ns["ggml_backend_tensor_get"] = _tensor_get
    ns["ggml_backend_sched_new"] = _sched_new
    ns["ggml_backend_accel_init"] = _accel_init
    ns["ggml_opt_default_params"] = _OptParams
    ns["ggml_opt_init"] = lambda params: real.ggml_opt_init(params.c)
    ns["ggml_opt_epoch"] = _opt_epoch
    ns["ggml_opt_result_loss"] = _opt_result_pair(real.ggml_opt_result_loss)
    ns["ggml_opt_result_accuracy"] = _opt_result_pair(real.ggml_opt_result_accuracy)
    ns["ggml_opt_result_pred"] = _opt_result_pred
    ns["ggml_opt_get_default_optimizer_params"] = ctypes.cast(real.lib.ggml_opt_get_default_optimizer_params,
                                                              ctypes.c_void_p)
    return ns


def call_on_real_ggml(fn: types.FunctionType, **kwargs) -> Any:
    """fn's code, and its module's helper functions, run with ggml-python behind the facade's names."""
    real.ggml_cpu_init()
    globs = dict(fn.__globals__)
    globs.update(real_namespace())
    for name, obj in list(globs.items()):  # the program's own helper functions see real ggml too
        if isinstance(obj, types.FunctionType) and obj.__globals__ is fn.__globals__:
            globs[name] = types.FunctionType(obj.__code__, globs, obj.__name__, obj.__defaults__)
    return types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__)(**kwargs)


def run_on_real_ggml(fn: types.FunctionType, **kwargs) -> dict[str, np.ndarray]:
    outputs = call_on_real_ggml(fn, **kwargs)
    result = {}
    for name, t in outputs.items():
        if isinstance(t, RealTensor):
            if TYPE_TRAITS[t.type].is_quantized:
                result[name] = ctypes.string_at(t.data, real.ggml_nbytes(t.ptr)).hex()
            else:
                a = real_to_numpy(t.ptr)
                result[name] = (a.view(np.float16) if t.type == GGMLType.F16 else a).tolist()
        else:
            result[name] = t
    return result
