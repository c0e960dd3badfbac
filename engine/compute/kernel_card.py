"""What computed a node: ggml's C kernel, the engine's numpy code that mirrors it, and, for a
quantized product, one block worked through with the node's own numbers.

The debugger's Kernel tab shows this. The code is the code that runs: the kernel registered for
the node's op and, where the kernel hands its inner loop to engine._lanes, that loop's numpy twin
(engine/lanes.py), read from the source files with `inspect`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from engine.compute.kernels import KERNELS, KernelInfo, same_bits_on_every_cpu
from engine.compute.kernels.common import to_f32, view4
from engine.compute.kernels.floatmath import fmaf
from engine.compute.kernels.matmul import emulates_vec_dot, quant_rows, vec_dot_type
from engine.compute.kernels.vecdot import EXACT_QUANT, add_mins, block_lanes, decode_weights, \
    paired_total, row_result, tail_sum, vec_dot_of
from engine.compute.kernels.vecdot_float import hsum8
from engine.lanes import TWINS, pure_numpy
from engine.core.optable import GGMLOp
from engine.quants import from_float
from engine.quants.common import Mins
from engine.quants.explain import BlockExplanation, explain_block
from engine.core.tensor import Tensor
from engine.core.types import GGMLType, TYPE_TRAITS

F32 = np.float32
ROOT = Path(__file__).resolve().parents[2]  # the folder holding the engine package
BINARY = {GGMLOp.ADD: "+", GGMLOp.SUB: "-", GGMLOp.MUL: "*", GGMLOp.DIV: "/"}


@dataclass(frozen=True, slots=True)
class Code:
    """One Python function of the engine, as its source file has it."""

    name: str  # "compute_forward_mul_mat"
    path: str  # "engine/compute/kernels/matmul.py"
    line: int  # its first line in that file
    text: str
    role: str  # "kernel" (the op's compute_forward), "helper" (a function of its module it
    # calls) or "twin" (a C loop's numpy form)


@dataclass(frozen=True, slots=True)
class KernelCard:
    """What computes a node of this op and these types."""

    op: str  # "MUL_MAT"
    ggml_kernel: str  # "ggml_compute_forward_mul_mat"
    inner: str | None  # ggml's inner C function it ends in: "ggml_vec_dot_q4_K_q8_K"
    lane: str | None  # the engine._lanes loop the kernel runs it with: "quant_dot"
    in_c: bool  # that loop ran compiled (False: its numpy twin, pure-numpy mode)
    exact: bool  # the result has ggml's bits on every CPU (False: a BLAS product)
    about: str  # the kernel module's own summary
    code: tuple[Code, ...]


@cache
def _code(fn, role: str) -> Code:
    lines, start = inspect.getsourcelines(fn)
    source = inspect.getsourcefile(fn)
    assert source is not None, fn  # (the engine's functions, from its .py files)
    path = Path(source).resolve()
    try:
        shown = str(path.relative_to(ROOT))
    except ValueError:
        shown = path.name
    return Code(fn.__name__, shown, start, "".join(lines), role)


@cache
def _helpers(fn) -> list:
    """The functions of fn's own module that fn calls (its lambdas included), in order."""
    names: list[str] = []
    codes = [fn.__code__]
    while codes:
        code = codes.pop(0)
        names += [n for n in code.co_names if n not in names]
        codes += [c for c in code.co_consts if inspect.iscode(c)]
    module = inspect.getmodule(fn)
    assert module is not None, fn  # (a function of one of the engine's modules)
    return [f for f in (getattr(module, n, None) for n in names)
            if inspect.isfunction(f) and f is not fn and f.__module__ == module.__name__]


def _inner(dst: Tensor, info: KernelInfo) -> tuple[str | None, str | None]:
    """ggml's inner function for this node and the engine._lanes loop that runs it, if any: a
    product's vec_dot, or the loop in C its kernel's registration names."""
    op = GGMLOp(dst.op)
    if op in (GGMLOp.MUL_MAT, GGMLOp.MUL_MAT_ID):
        src0 = dst.source(0)
        vdt = vec_dot_type(src0.type)
        name = f"ggml_vec_dot_{TYPE_TRAITS[src0.type].type_name}" + (
            f"_{TYPE_TRAITS[vdt].type_name}" if TYPE_TRAITS[src0.type].is_quantized else "")
        if not same_bits_on_every_cpu(dst):
            return name, None
        lane = "quant_dot" if src0.type in EXACT_QUANT else "float_dot" \
            if src0.type == GGMLType.F16 else "dot_f32" if src0.type == GGMLType.F32 else None
        return name, lane
    loop = info.loop_in_c(dst)
    return (None, None) if loop is None else (loop.ggml, loop.lane)


def every_code() -> set[Code]:
    """The source of every function a kernel card may show: each kernel, its helpers and the
    loops' numpy twins."""
    codes = {_code(block_lanes, "twin")}
    codes |= {_code(vec_dot_of(t).decode, "twin") for t in EXACT_QUANT}  # each type's decoder
    codes |= {_code(fn, "twin") for fn in TWINS.values()}
    for info in KERNELS.values():
        codes |= {_code(info.fn, "kernel")} | {_code(f, "helper") for f in _helpers(info.fn)}
    return codes


def kernel_card(dst: Tensor) -> KernelCard | None:
    """The kernel of a computed node (None for a view op or an op with no kernel)."""
    info = KERNELS.get(dst.op)
    if info is None:
        return None
    fn, op = info.fn, GGMLOp(dst.op)
    inner, lane = _inner(dst, info)
    code = [_code(fn, "kernel")] + [_code(f, "helper") for f in _helpers(fn)]
    if lane is not None:
        if lane == "quant_dot":
            decode = vec_dot_of(dst.source(0).type).decode  # the weights' type's own decoder
            code += [_code(decode, "twin"), _code(block_lanes, "twin")]
        code.append(_code(TWINS[lane], "twin"))
    return KernelCard(op.name, f"ggml_compute_forward_{op.name.lower()}", inner, lane,
                      lane is not None and not pure_numpy(), same_bits_on_every_cpu(dst),
                      summary_of(fn), tuple(code))


def summary_of(kernel) -> str:
    """A kernel's module's own summary: the first paragraph of its docstring (the Kernel tab
    shows it, and the app's message catalogue translates it)."""
    return (inspect.getmodule(kernel).__doc__ or "").strip().split("\n\n")[0]


# --- one block of a quantized product, worked through --------------------------------------------

@dataclass(frozen=True, slots=True)
class WorkedBlock:
    """Block `block` of the dot product of weight row `row` with activation row `col`."""

    type: str  # the weights' type, "q4_K"
    vec_dot_type: str  # the activations', "q8_K"
    row: int
    col: int
    block: int
    nblocks: int
    weight: BlockExplanation
    activation: BlockExplanation
    lanes: tuple[int, ...]  # the 8 integer lane sums of this block
    scale: float  # x.d * y.d
    acc_before: tuple[float, ...]  # the 8 float accumulators before this block (Q2_K: after its
    #                                mins; IQ4_NL: the block parity's own)
    acc_after: tuple[float, ...]  # after acc = fmaf(lane, scale, acc)
    min_lanes: tuple[int, ...] | None  # Q4_K: the 4 lanes of mins times block sums
    min_scale: float | None  # Q4_K: -y.d * x.dmin
    min_after: tuple[float, ...] | None
    result: float  # the whole row's dot product: hsum of the accumulators after the last block
    dst_value: float  # what the node holds there


def worked_block(dst: Tensor, row: int, col: int, block: int) -> WorkedBlock | None:
    """A quantized MUL_MAT's block `block` of weight row `row` (matrix 0) times activation row
    `col`, with the node's numbers (None for another node, or one without data)."""
    if dst.op != GGMLOp.MUL_MAT or dst.data is None:
        return None
    src0, src1 = dst.source(0), dst.source(1)
    if src0.type not in EXACT_QUANT or src0.data is None or src1.data is None \
            or not emulates_vec_dot(src0, int(src1.ne[1]) * int(src1.ne[2]) * int(src1.ne[3])):
        return None
    t0, vdt = TYPE_TRAITS[src0.type], vec_dot_type(src0.type)
    tv = TYPE_TRAITS[vdt]
    nb = int(src0.ne[0]) // t0.blck_size
    row = min(max(row, 0), int(src0.ne[1]) - 1)
    col = min(max(col, 0), int(src1.ne[1]) - 1)
    block = min(max(block, 0), nb - 1)
    w = quant_rows(src0, 0, 0, slice(row, row + 1))[0]
    if src1.type == vdt:
        y = np.frombuffer(bytes(view4(src1)[0, 0, col]), np.uint8)
    else:  # as mul_mat converts src1: the CPU's quantizer of its vec_dot_type
        y = from_float(vdt, to_f32(view4(src1)[0, 0, col:col + 1], src1.type)).view(np.uint8).reshape(-1)
    wb, yb = w.reshape(nb, t0.type_size), y.reshape(nb, tv.type_size)
    dec = decode_weights(src0.type, wb)
    lanes, scale, mlanes, mscale = block_lanes(src0.type, dec, yb)
    acc = acc2 = np.zeros(8, F32)
    inside = vec_dot_of(src0.type).mins is Mins.IN_ACC  # Q2_K: the mins into acc, before the lanes
    paired = vec_dot_of(src0.type).paired  # IQ4_NL, MXFP4: odd blocks into acc2, an odd last apart
    accm = np.zeros(4 if mlanes is None or inside else mlanes.shape[-1], F32)
    for b in range(nb):
        if inside:
            assert mlanes is not None and mscale is not None  # (Mins.IN_ACC: block_lanes made them)
            acc = fmaf(mlanes[b].astype(F32), mscale[b], acc)
        odd = paired and b % 2
        before = acc2 if odd else acc
        after = before if paired and b == nb - 1 and nb % 2 else \
            fmaf(lanes[b].astype(F32), scale[b], before)  # (that tail touches no accumulator)
        acc2, acc = (after, acc) if odd else (acc2, after)
        if mlanes is not None and mscale is not None and not inside:
            accm = fmaf(mlanes[b].astype(F32), mscale[b], accm)
        if b == block:
            shown, shown_m = (before, after), accm.copy()
    if paired:
        result = F32(paired_total(acc, acc2, nb, scale[-1], tail_sum(dec.q[-1], yb[-1]) if nb % 2 else None))
    else:  # IQ3_XXS's times 0.25f, IQ2_S's times 0.125f
        result = F32(row_result(src0.type, hsum8(acc)))
    if mlanes is not None and not inside:
        result = F32(add_mins(src0.type, result, accm))
    if src0.type != GGMLType.Q4_K:  # the page tells Q4_K's 4 lanes of mins only
        mlanes = None
    return WorkedBlock(t0.type_name, tv.type_name, row, col, block, nb,
                       explain_block(src0.type, w, block), explain_block(vdt, y, block),
                       tuple(int(v) for v in lanes[block]), float(scale[block]),
                       tuple(float(v) for v in shown[0]), tuple(float(v) for v in shown[1]),
                       None if mlanes is None else tuple(int(v) for v in mlanes[block]),
                       None if mlanes is None or mscale is None else float(mscale[block]),
                       None if mlanes is None else tuple(float(v) for v in shown_m),
                       float(result), float(view4(dst)[0, 0, col, row]))


@dataclass(frozen=True, slots=True)
class WorkedElement:
    """The first element of an element-wise node: dst[0] = src0[0] op src1[0]."""

    sign: str
    a: float
    b: float
    value: float

    @property
    def formula(self) -> str:
        return (f"dst[0] = src0[0] {self.sign} src1[0] = {self.a:.9g} {self.sign} {self.b:.9g} "
                f"= {self.value:.9g}")


def worked_element(dst: Tensor) -> WorkedElement | None:
    """ADD, SUB, MUL, DIV: the first element computed, with the node's numbers."""
    sign = BINARY.get(GGMLOp(dst.op))
    src0, src1 = dst.src[0], dst.src[1]
    if sign is None or src0 is None or src1 is None or any(
            t.data is None or TYPE_TRAITS[t.type].is_quantized for t in (dst, src0, src1)):
        return None
    first = [float(to_f32(view4(t)[0, 0, 0, :1], t.type)[0]) for t in (src0, src1, dst)]
    return WorkedElement(sign, *first)
