"""The ggml.h facade: ggml's names, signatures and constants, so a program reads like its C twin.

    from engine.ggml import *

    ctx = ggml_init(ggml_init_params(mem_size=16 * 1024 * 1024))
    x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)      # a 1-element tensor: 368 bytes of header,
    ggml_set_name(x, "x")                              # struct and padding, then 16 of data
    a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)
    b = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)
    x2 = ggml_mul(ctx, x, x)                           # records the op, computes nothing
    f = ggml_add(ctx, ggml_mul(ctx, a, x2), b)         # f(x) = a*x^2 + b

    print(format_tensor(f))                            # as gdb's `p *f` prints the struct

Differences from C, all forced by Python: out-pointers become return values; `ctx.pool` holds
the bytes a `void *` would point at (pointers themselves are simulated addresses); strings are str.
"""

from __future__ import annotations

from engine import autodiff as _autodiff
from engine import compute as _compute
from engine import context as _context
from engine import graph as _graph
from engine import ops as _ops
from engine import ops_back as _ops_back
from engine import ops_math as _ops_math
from engine import ops_nn as _ops_nn
from engine import optable as _optable
from engine import quants as _quants
from engine import tensor as _tensor
from engine import types as _types
from engine.gguf import api as _gguf
from engine.compute import GGML_STATUS_ABORTED, GGML_STATUS_SUCCESS, CPlan  # noqa: F401
from engine.context import Context, ggml_init_params  # noqa: F401
from engine.errors import GGMLAssertionError, GGMLNotSupportedError, GGMLPoolError  # noqa: F401
from engine.layout import GGML_MAX_DIMS, GGML_MAX_NAME, GGML_MAX_OP_PARAMS, GGML_MAX_SRC, \
    GGML_MEM_ALIGN, GGML_OBJECT_SIZE, GGML_PAD, GGML_TENSOR_SIZE  # noqa: F401
from engine.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.graph import GGML_DEFAULT_GRAPH_SIZE, Graph  # noqa: F401
from engine.tensor import Tensor, data_bytes, set_data, to_numpy  # noqa: F401
from engine.types import GGMLType

# every ggml_* and gguf_* function of the engine modules, under its ggml name
for _module in (_types, _context, _tensor, _ops, _ops_math, _ops_nn, _ops_back, _optable, _graph,
                _autodiff, _compute, _quants, _gguf):
    for _name in dir(_module):
        if _name.startswith(("ggml_", "GGML_", "gguf_", "GGUF_")):
            globals()[_name] = getattr(_module, _name)

# enum constants with ggml's spelling: GGML_TYPE_F32, GGML_OP_MUL_MAT, GGML_UNARY_OP_GELU, ...
for _enum, _prefix in ((GGMLType, "GGML_TYPE_"), (GGMLOp, "GGML_OP_"),
                       (GGMLUnaryOp, "GGML_UNARY_OP_"), (GGMLGluOp, "GGML_GLU_OP_")):
    for _member in _enum:
        globals()[_prefix + _member.name] = _member


def _gdb_array(values: list[str]) -> str:
    """gdb's array printing: runs of 10 or more equal elements collapse to '<repeats N times>'."""
    parts, i = [], 0
    while i < len(values):
        j = i
        while j < len(values) and values[j] == values[i]:
            j += 1
        run = j - i
        if run >= 10:
            parts.append(f"{values[i]} <repeats {run} times>")
        else:
            parts.extend(values[i:j])
        i = j
    return "{" + ", ".join(parts) + "}"


def _gdb_name(raw: bytes) -> str:
    text, _, rest = raw.partition(b"\0")
    shown = '"' + text.decode("utf-8", errors="backslashreplace") + '"'
    rest = b"\0" + rest  # the NUL and everything after it
    if rest.strip(b"\0"):
        return shown + ", " + '"' + "".join(f"\\{b:03o}" if b < 32 or b > 126 else chr(b)
                                            for b in rest) + '"'
    return shown + (f", '\\000' <repeats {len(rest) - 1} times>" if len(rest) > 1 else "")


def format_tensor(t: Tensor) -> str:
    """The tensor struct as gdb prints `p *t` (with `set print pretty on`)."""
    ptr = lambda a: f"{a:#x}" if a else "0x0"  # noqa: E731
    r = t._r[0]
    op = GGMLOp(t.op).name
    fields = [
        ("type", "GGML_TYPE_" + GGMLType(t.type).name),
        ("buffer", ptr(int(r["buffer"]))),
        ("ne", _gdb_array([str(int(x)) for x in t.ne])),
        ("nb", _gdb_array([str(int(x)) for x in t.nb])),
        ("op", "GGML_OP_" + op),
        ("op_params", _gdb_array([str(int(x)) for x in t.op_params])),
        ("flags", str(t.flags)),
        ("src", _gdb_array([ptr(int(a)) for a in r["src"]])),
        ("view_src", ptr(int(r["view_src"]))),
        ("view_offs", str(t.view_offs)),
        ("data", ptr(int(r["data"]))),
        ("name", _gdb_name(t.ctx.pool[t.offs + 256:t.offs + 256 + GGML_MAX_NAME].tobytes())),
        ("extra", ptr(t.extra)),
        ("padding", '"' + "\\000" * 7 + '"'),
    ]
    body = ",\n".join(f"  {k} = {v}" for k, v in fields)
    return "{\n" + body + "\n}"
