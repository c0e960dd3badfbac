"""A trace you can diff with llama.cpp: every computed node printed as llama.cpp's eval callback
prints it, and two such dumps compared node by node.

llama.cpp's `llama-eval-callback` (common/debug.cpp, `common_debug_cb_eval`) prints each node
after the scheduler computes it: a header line

    common_debug_cb_eval:                   norm-0 = (f32)       NORM(inp_embd{384, 7, 1, 1}, }) = {384, 7, 1, 1}

then the values, the first and last 3 along every dimension with `%12.4f`, and `sum = %f` (a
float accumulated element by element). `format_node` writes the same text from a tensor's fields
and bytes, so a dump of the engine's run and one of real llama.cpp's (tests read llama.cpp's
tensors in its own callback and format them here) line up; `parse_dump` reads either back and
`diff_dumps` finds the first node whose values differ beyond a bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.compute.threadpool import COMPUTE_OBSERVER
from engine.core.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.core.tensor import Tensor, dims4, ggml_nbytes
from engine.core.tensor_data import data_bytes, strided_view
from engine.core.types import TYPE_TRAITS, GGMLType, bf16_bits_to_fp32, fp16_bits_to_fp32

PREFIX = "common_debug_cb_eval"
N_EDGE = 3  # values shown at each end of every dimension


@dataclass(frozen=True, slots=True)
class NodeFields:
    """What the dump needs of a tensor: enough to format one from another library's memory."""

    name: str
    type: int
    ne: tuple[int, int, int, int]
    nb: tuple[int, int, int, int]
    op_desc: str  # ggml_op_desc: the op's name, or the unary / glu op's
    src0: tuple[str, tuple[int, ...]] | None
    src1: tuple[str, tuple[int, ...]] | None
    data: bytes  # ggml_nbytes(t) bytes from t->data


def op_desc(t: Tensor) -> str:
    """ggml_op_desc."""
    if t.op == GGMLOp.UNARY:
        return GGMLUnaryOp(int(t.op_params[0])).name
    if t.op == GGMLOp.GLU:
        return GGMLGluOp(int(t.op_params[0])).name
    return GGMLOp(t.op).name


def fields_of(t: Tensor) -> NodeFields:
    """A node of the engine as NodeFields."""
    src = [(s.name, tuple(int(x) for x in s.ne)) if s is not None else None
           for s in (t.src[0], t.src[1])]
    raw = data_bytes(t, ggml_nbytes(t)).tobytes() if t.data is not None else b""
    return NodeFields(t.name, int(t.type), dims4(t.ne), dims4(t.nb), op_desc(t), src[0], src[1], raw)


def _values(f: NodeFields) -> np.ndarray | None:
    """The elements as float32 in (i3, i2, i1, i0) order, as the callback reads them; None for
    quantized types (the callback prints no values for them)."""
    t = GGMLType(f.type)
    if TYPE_TRAITS[t].is_quantized:
        return None
    dt = {GGMLType.F32: "<f4", GGMLType.F16: "<u2", GGMLType.BF16: "<u2", GGMLType.I64: "<i8",
          GGMLType.I32: "<i4", GGMLType.I16: "<i2", GGMLType.I8: "i1"}[t]
    a = strided_view(np.frombuffer(f.data, np.uint8), 0, reversed(f.ne), reversed(f.nb), dt,
                     "eval_callback", f"'{f.name}'")
    if t == GGMLType.F16:
        return fp16_bits_to_fp32(a)
    if t == GGMLType.BF16:
        return bf16_bits_to_fp32(a)
    return a.astype(np.float32)


def _ne(ne) -> str:
    return ", ".join(str(int(x)) for x in ne)


def format_node(f: NodeFields) -> str:
    """One node as common_debug_cb_eval prints it (header, values, sum)."""
    src0 = f"{f.src0[0]}{{{_ne(f.src0[1])}}}" if f.src0 else ""
    src1 = f"{f.src1[0]}{{{_ne(f.src1[1])}}}" if f.src1 else ""
    out = [f"{PREFIX}: {f.name:>24} = ({TYPE_TRAITS[f.type].type_name}) {f.op_desc:>10}("
           f"{src0}, {src1}}}) = {{{_ne(f.ne)}}}"]
    v = _values(f)
    if v is None:
        return "\n".join(out) + "\n"
    # the sum: a float, element by element in (i3, i2, i1, i0) order
    flat = v.reshape(-1)
    total = np.cumsum(flat, dtype=np.float32)[-1] if flat.size else np.float32(0)
    ne0, ne1, ne2, ne3 = f.ne
    ind = "    "
    for i3 in range(ne3):
        out.append(ind + "[")
        for i2 in _shown(ne2):
            if i2 is None:
                out.append(ind * 2 + "..., ")
                continue
            out.append(ind * 2 + "[")
            for i1 in _shown(ne1):
                if i1 is None:
                    out.append(ind * 3 + "..., ")
                    continue
                cells = []
                for i0 in _shown(ne0):
                    cells.append("   ..., " if i0 is None else f"{float(v[i3, i2, i1, i0]):12.4f}"
                                 + (", " if i0 < ne0 - 1 else ""))
                out.append(ind * 3 + "[" + "".join(cells) + "  ],")
            out.append(ind * 2 + "],")
        out.append(ind + "]")
        out.append(ind + f"sum = {float(total):f}")
    return "\n".join(out) + "\n"


def _shown(n: int) -> list[int | None]:
    """Indices printed along a dimension of n: all, or the first and last N_EDGE around None."""
    if n > 2 * N_EDGE:
        return list(range(N_EDGE)) + [None] + list(range(n - N_EDGE, n))
    return list(range(n))


def dump_observer(write: Callable[[str], None]):
    """A compute observer (ggml's eval-callback shape) that writes every computed node."""
    def observe(node: Tensor, ask: bool, shares=None) -> bool:
        if not ask:
            write(format_node(fields_of(node)))
        return True
    return observe


def dumping(write: Callable[[str], None]):
    """Context manager: every graph computed inside writes its nodes to `write`."""
    class _Dumping:
        def __enter__(self):
            self.token = COMPUTE_OBSERVER.set(dump_observer(write))
            return self

        def __exit__(self, *exc):
            COMPUTE_OBSERVER.reset(self.token)
            return False
    return _Dumping()


def eval_dump(run: Callable[..., object], **kwargs) -> str:
    """Run `run(**kwargs)` (a program, not recorded) and return its dump."""
    parts: list[str] = []
    with dumping(parts.append):
        run(**kwargs)
    return "".join(parts)


# --- reading and comparing dumps -------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DumpNode:
    """One node read back from a dump."""

    name: str
    type: str
    op: str
    ne: tuple[int, ...]
    values: tuple[float, ...]  # the printed values, in print order
    sum: float | None


_HEADER = re.compile(rf"^{PREFIX}:\s+(.*?) = \((\w+)\)\s+(\w+)\(.*\) = \{{([\d, ]+)\}}$")
_NUMBER = re.compile(r"-?(?:\d+\.\d+|inf|nan)", re.IGNORECASE)


def parse_dump(text: str) -> list[DumpNode]:
    """The nodes of a dump (ours or llama.cpp's), in order."""
    nodes: list[DumpNode] = []
    cur: dict | None = None

    def close():
        if cur is not None:
            nodes.append(DumpNode(cur["name"], cur["type"], cur["op"], cur["ne"],
                                  tuple(cur["values"]), cur["sum"]))

    for line in text.splitlines():
        m = _HEADER.match(line)
        if m:
            close()
            cur = {"name": m[1], "type": m[2], "op": m[3],
                   "ne": tuple(int(x) for x in m[4].split(",")), "values": [], "sum": None}
        elif cur is not None:
            s = line.strip()
            if s.startswith("sum = "):
                cur["sum"] = float(s[6:]) if cur["sum"] is None else cur["sum"]
            elif s.startswith("["):
                cur["values"] += [float(x) for x in _NUMBER.findall(s)]
    close()
    return nodes


@dataclass(frozen=True, slots=True)
class NodeDiff:
    name: str
    max_abs: float  # largest difference between printed values
    sum_rel: float  # relative difference of the sums


@dataclass(frozen=True, slots=True)
class DumpDiff:
    """Two dumps compared by node name (each name's first occurrence)."""

    compared: tuple[NodeDiff, ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]
    first_over: NodeDiff | None  # the first compared node beyond the bounds

    def report(self) -> str:
        lines = [f"{len(self.compared)} nodes compared, {len(self.only_a)} only in A, "
                 f"{len(self.only_b)} only in B"]
        if self.first_over is None:
            lines.append("no node differs beyond the bounds")
        else:
            d = self.first_over
            lines.append(f"first node beyond the bounds: '{d.name}' (printed values differ by up "
                         f"to {d.max_abs:.4g}, sums by {d.sum_rel:.3g} relative)")
        return "\n".join(lines)


_AUTO_NAME = re.compile(r"^(node|leaf)_\d+$")  # ggml's names for unnamed tensors: no identity


def diff_dumps(a: list[DumpNode], b: list[DumpNode], abs_tol: float = 2e-3,
               rel_tol: float = 1e-3) -> DumpDiff:
    """Compare nodes of the same name and shape: printed values within abs_tol + rel_tol·|b|
    (they are printed to 4 decimals) and sums within rel_tol (relative to the larger of |b|
    and the sum of the printed magnitudes). Nodes ggml named itself (node_12, leaf_3) are
    numbered by their place in each graph and do not name the same tensor in two programs: they
    are left out."""
    a = [n for n in a if not _AUTO_NAME.match(n.name)]
    b = [n for n in b if not _AUTO_NAME.match(n.name)]
    first_b: dict[str, DumpNode] = {}
    for n in b:
        first_b.setdefault(n.name, n)
    seen, compared, first_over = set(), [], None
    for n in a:
        if n.name in seen or n.name not in first_b:
            continue
        seen.add(n.name)
        m = first_b[n.name]
        if m.ne != n.ne or len(m.values) != len(n.values):
            continue
        va, vb = np.array(n.values, np.float64), np.array(m.values, np.float64)
        diff = np.abs(va - vb)
        max_abs = float(diff.max()) if diff.size else 0.0
        over = bool(np.any(diff > abs_tol + rel_tol * np.abs(vb)))
        sum_rel = 0.0
        if n.sum is not None and m.sum is not None:
            scale = max(abs(m.sum), float(np.abs(vb).sum()), 1e-6)
            sum_rel = abs(n.sum - m.sum) / scale
            over = over or sum_rel > rel_tol
        d = NodeDiff(n.name, max_abs, sum_rel)
        compared.append(d)
        if over and first_over is None:
            first_over = d
    names_a, names_b = {n.name for n in a}, {n.name for n in b}
    return DumpDiff(tuple(compared), tuple(sorted(names_a - names_b)),
                    tuple(sorted(names_b - names_a)), first_over)
