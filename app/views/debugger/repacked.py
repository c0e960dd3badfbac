"""The repacked-blocks panel: a weight in ggml-cpu's CPU_REPACK buffer, one interleaved block drawn
against the plain blocks of the rows it was made from, each byte coloured by the row it came from.

Which byte of the interleaved block comes from where is not typed here: `byte_map` asks the
layout's own `pack` (engine/quants/repack_*.py), packing probes that each set one bit of one
row's block and seeing which bit of the result moves (and packing zeros for the bits it flips on
its own, Q4_0's XOR 0x88). The bytes shown are the trace's: the interleaved block as it lies in
the buffer at this step, and the plain blocks the layout's `unpack` reads back from them.

The threads panel's line on a repacked MUL_MAT (`gemm_rows`) says which activation rows went
through gemm and which through gemv.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np
from markupsafe import Markup, escape

from app.i18n import _, current
from app.views.debugger.where import Where, current_node
from engine.backend.repack import CPU_REPACK_BUFT
from engine.core.layout import struct_fields
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nbytes
from engine.core.types import TYPE_TRAITS
from engine.quants import QUANT_KINDS
from engine.quants.repack import RepackLayout, optimal_layout
from engine.trace import State, Step, StepKind

# one colour a row of the group (a layout interleaves 8)
ROW_COLOURS = ("#ffd6d6", "#ffe7bf", "#fff6b0", "#d8f5c8", "#c9efef", "#cfe0ff", "#e2d4ff", "#f7d2ef")
LINE = 16  # bytes a line (a plain block of at most PLAIN_LINE bytes: one line)
PLAIN_LINE = 24
GEMM_ROWS = 4  # forward_mul_mat: the activation rows gemm takes at a time (the rest go to gemv)


# --- where each byte goes: the layout's own pack, probed -------------------------------------------

@dataclass(frozen=True, slots=True)
class Origin:
    """Bits of one byte of the interleaved block that come from one byte of one row's plain block."""

    row: int  # the row within the group, 0 .. rows - 1
    byte: int  # the byte within that row's plain block
    bits: int  # which bits of the interleaved byte it gives (0xff: all)
    same_place: bool  # each of those bits sits where it sat in the plain byte


@dataclass(frozen=True, slots=True)
class ByteMap:
    """Where each byte of one interleaved block comes from, as the layout's pack puts it."""

    layout: str
    rows: int  # the rows interleaved into one block
    block_size: int  # bytes of one plain block
    source: np.ndarray  # per bit of the interleaved block: the plain bit (row * S + byte) * 8 + bit, or -1
    xor: np.ndarray  # per byte of the interleaved block: the bits pack flips on its own (uint8)
    origins: tuple[tuple[Origin, ...], ...]  # per byte of the interleaved block
    exact: bool  # pack is this rearrangement of bits (and flips), checked on random blocks

    def apply(self, blocks: np.ndarray) -> np.ndarray:
        """The interleaved block the map makes of plain blocks (rows, block_size) uint8."""
        bits = np.unpackbits(np.asarray(blocks, np.uint8).reshape(-1), bitorder="little")
        out = np.where(self.source >= 0, bits[np.maximum(self.source, 0)], 0).astype(np.uint8)
        return np.packbits(out, bitorder="little") ^ self.xor


@cache
def byte_map(layout: RepackLayout) -> ByteMap:
    """Pack one probe per bit of a group's plain blocks (that bit set, every other clear) through
    the layout's own pack, and zeros: each output bit a probe flips comes from its bit."""
    rows, size = layout.rows, TYPE_TRAITS[layout.type].type_size
    n_bits = rows * size * 8
    base = np.asarray(layout.pack(np.zeros((rows, size), np.uint8)), np.uint8).reshape(-1)
    probes = np.zeros((n_bits, rows * size), np.uint8)
    i = np.arange(n_bits)
    probes[i, i // 8] = np.left_shift(1, i % 8).astype(np.uint8)
    out = np.asarray(layout.pack(probes.reshape(n_bits * rows, size)), np.uint8).reshape(n_bits, -1)
    flipped = np.unpackbits((out ^ base)[..., None], axis=-1, bitorder="little").reshape(n_bits, -1)
    probe, out_bit = np.nonzero(flipped)
    source = np.full(flipped.shape[1], -1, np.int64)
    source[out_bit] = probe
    exact = (len(probe) == n_bits and len(np.unique(out_bit)) == n_bits
             and np.array_equal(np.bincount(probe, minlength=n_bits), np.ones(n_bits, int)))
    found = ByteMap(layout.name, rows, size, source, base, _origins(source, size), exact)
    blocks = np.random.default_rng(0).integers(0, 256, (4, rows, size), dtype=np.uint8)
    packed = np.asarray(layout.pack(blocks.reshape(-1, size)), np.uint8).reshape(4, -1)
    exact = exact and all(np.array_equal(found.apply(b), p) for b, p in zip(blocks, packed))
    return ByteMap(found.layout, rows, size, source, base, found.origins, bool(exact))


def _origins(source: np.ndarray, size: int) -> tuple[tuple[Origin, ...], ...]:
    out = []
    for p in range(source.size // 8):
        found: dict[tuple[int, int], list[int]] = {}
        same: dict[tuple[int, int], bool] = {}
        for k in range(8):
            s = int(source[p * 8 + k])
            if s < 0:
                continue
            key = divmod(s // 8, size)
            found.setdefault(key, []).append(k)
            same[key] = same.get(key, True) and s % 8 == k
        out.append(tuple(Origin(r, j, sum(1 << k for k in ks), same[r, j])
                         for (r, j), ks in sorted(found.items())))
    return tuple(out)


# --- a tensor's layout, read from a state --------------------------------------------------------

def layout_in_buffer(t: Tensor | None) -> RepackLayout | None:
    """The layout t's bytes lie in at this state: t lives in a CPU_REPACK buffer and its init_tensor
    gave it one (tensor->extra set), the one ggml_repack_get_optimal_repack_type chooses."""
    if t is None or t.data is None or not t.extra:
        return None
    try:
        owner, _off = t.ctx.space.resolve(t.data)
    except ValueError:
        return None
    if getattr(owner, "name", None) != CPU_REPACK_BUFT.name:
        return None
    return optimal_layout(t.type, tuple(int(n) for n in t.ne))


def buffer_bytes(t: Tensor) -> tuple[int, int, np.ndarray]:
    """(buffer id, offset in it, t's bytes there) as they lie in its buffer at this state."""
    assert t.data is not None  # (layout_in_buffer found it in its buffer)
    owner, off = t.ctx.space.resolve(t.data)
    return owner.id, off, owner.pool[off:off + ggml_nbytes(t)]


def plain_row(t: Tensor, row: int) -> np.ndarray | None:
    """Row `row` of a repacked tensor as plain blocks (row bytes): its layout's unpack of the
    buffer's bytes of the rows interleaved with it (one group: a page of an 8B model's weight
    unpacks 8 rows, not 14,336); None for a tensor not repacked."""
    layout = layout_in_buffer(t)
    if layout is None:
        return None
    nb1 = int(t.nb[1])
    first = row // layout.rows * layout.rows
    group = buffer_bytes(t)[2][first * nb1:(first + layout.rows) * nb1].reshape(layout.rows, nb1)
    return np.asarray(layout.unpack(group), np.uint8)[row - first]


def n_rows(t: Tensor) -> int:
    """Rows of t over dims 1..3 (a MUL_MAT_ID weight's experts follow each other)."""
    return int(t.ne[1]) * int(t.ne[2]) * int(t.ne[3])


# --- the panel ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Run:
    """Consecutive bytes of the interleaved block, in words."""

    start: int
    end: int  # inclusive
    text: str
    rows: tuple[int, ...]  # the group's rows they come from (for their colours)


@dataclass(frozen=True, slots=True)
class RepackedView:
    name: str
    of: str  # the node it is src0 of, when the step's tensor is that node
    type_name: str
    layout: str
    rows: int
    interleave: int
    vec_dot_type: str
    buffer: int
    offset: int  # of the interleaved block in the buffer
    group: int
    ngroups: int
    block: int
    nblocks: int
    row: int  # the row picked (its cells outlined)
    block_size: int
    plain: list[tuple[int, list[Markup]]]  # each row of the group: its number, its block's lines
    packed: list[tuple[int, Markup]]  # the interleaved block's lines: offset, cells
    runs: list[Run]
    xor: list[tuple[int, int]]  # (mask, how many bytes) pack flips on its own
    exact: bool
    legend: list[tuple[int, str]]  # (row, colour)


def repacked_target(state: State, step: Step, selected: Tensor | None) -> tuple[Tensor, Tensor | None] | None:
    """(the repacked tensor, the node reading it) the panel is about: the selected tensor, or the
    selected (or computed) MUL_MAT's src0, when in a CPU_REPACK buffer."""
    for t in (selected, current_node(state, step)):
        if t is None:
            continue
        if layout_in_buffer(t) is not None:
            return t, None
        if t.op in (GGMLOp.MUL_MAT, GGMLOp.MUL_MAT_ID) and layout_in_buffer(t.source(0)) is not None:
            return t.source(0), t
    return None


def repacked(state: State, step: Step, selected: Tensor | None, where: Where) -> RepackedView | None:
    """One interleaved block of the repacked tensor: group row // rows, block column `block`."""
    found = repacked_target(state, step, selected)
    if found is None:
        return None
    t, node = found
    layout = layout_in_buffer(t)
    assert layout is not None  # (repacked_target found it)
    m = byte_map(layout)
    size, rows = m.block_size, m.rows
    nrows, row_bytes = n_rows(t), int(t.nb[1])
    nblocks, ngroups = row_bytes // size, nrows // rows
    row = min(max(where.row, 0), nrows - 1)
    group, block = row // rows, min(max(where.block, 0), nblocks - 1)
    buf, off, raw = buffer_bytes(t)
    start = group * rows * row_bytes + block * rows * size  # the group's blocks follow each other
    packed = raw[start:start + rows * size]
    plain = np.asarray(layout.unpack(raw[group * rows * row_bytes:(group + 1) * rows * row_bytes]
                                     .reshape(rows, row_bytes)), np.uint8)[:, block * size:(block + 1) * size]
    dtype = QUANT_KINDS[layout.type].dtype
    first = group * rows
    picked = row - first
    plain_lines = []
    for r in range(rows):
        cells = [_cell(int(b), ROW_COLOURS[r], _("row {row}: {field}").format(
            row=first + r, field=byte_field(dtype, j)), r == picked) for j, b in enumerate(plain[r])]
        n = size if size <= PLAIN_LINE else LINE
        plain_lines.append((first + r, [Markup("".join(cells[i:i + n])) for i in range(0, size, n)]))
    cells = [_packed_cell(p, int(b), m, dtype, first, picked) for p, b in enumerate(packed)]
    packed_lines = [(i, Markup("".join(cells[i:i + LINE]))) for i in range(0, len(cells), LINE)]
    masks: dict[int, int] = {}
    for x in m.xor.tolist():
        if x:
            masks[x] = masks.get(x, 0) + 1
    return RepackedView(
        t.name or _("(unnamed)"), (node.name or _("(unnamed)")) if node is not None else "",
        TYPE_TRAITS[t.type].type_name, layout.name, rows, layout.interleave,
        TYPE_TRAITS[layout.vec_dot_type].type_name, buf, off + start, group, ngroups, block, nblocks,
        row, size, plain_lines, packed_lines, runs(m, dtype, first), sorted(masks.items()), m.exact,
        [(first + r, ROW_COLOURS[r]) for r in range(rows)])


def byte_field(dtype: np.dtype, j: int) -> str:
    """The field of a block struct byte j belongs to: "d", "qs[5]", "scales[3]" (a field of
    several bytes per element: "d (byte 1)"), in the request's language."""
    return _byte_field(dtype, j, current())


@lru_cache(maxsize=1 << 14)  # (a block's bytes, a few types, two languages)
def _byte_field(dtype: np.dtype, j: int, language: str) -> str:
    for name, (dt, off) in struct_fields(dtype).items():
        if off <= j < off + dt.itemsize:
            k = j - off
            base = dt.base if dt.shape else dt
            label = f"{name}[{k // base.itemsize}]" if dt.shape else name
            return label + (_(" (byte {i})").format(i=k % base.itemsize) if base.itemsize > 1 else "")
    return _("padding")


def _field_range(dtype: np.dtype, j0: int, j1: int) -> str:
    """Bytes j0..j1 of one field, in a few characters: "d", "qs[0..7]"."""
    for name, (dt, off) in struct_fields(dtype).items():
        if off <= j0 < off + dt.itemsize:
            if not dt.shape or (j0 == off and j1 == off + dt.itemsize - 1 and dt.base.itemsize > 1):
                return name
            a, b = (j0 - off) // dt.base.itemsize, (j1 - off) // dt.base.itemsize
            return f"{name}[{a}]" if a == b else f"{name}[{a}..{b}]"
    return _("padding")


def _field_of(dtype: np.dtype, j: int) -> str:
    return next((n for n, (dt, off) in struct_fields(dtype).items() if off <= j < off + dt.itemsize), "")


def runs(m: ByteMap, dtype: np.dtype, first: int) -> list[Run]:
    """The interleaved block as runs of bytes: each whole byte of one row's field, in order (with
    the bits pack flips), or bits regrouped from several."""
    out: list[Run] = []
    p, n = 0, len(m.origins)
    while p < n:
        o = m.origins[p]
        whole = len(o) == 1 and o[0].bits == 0xFF and o[0].same_place
        q = p
        if whole:
            r, j = o[0].row, o[0].byte
            while (q + 1 < n and len(m.origins[q + 1]) == 1 and m.origins[q + 1][0].bits == 0xFF
                   and m.origins[q + 1][0].same_place and m.origins[q + 1][0].row == r
                   and m.origins[q + 1][0].byte == j + q + 1 - p and m.xor[q + 1] == m.xor[p]
                   and _field_of(dtype, j + q + 1 - p) == _field_of(dtype, j)):
                q += 1
            text = _("row {row}'s {field}").format(row=first + r, field=_field_range(dtype, j, j + q - p))
            if m.xor[p]:
                text += _(", stored XOR {mask:#04x}").format(mask=int(m.xor[p]))
            out.append(Run(p, q, text, (r,)))
        else:
            while q + 1 < n and not (len(m.origins[q + 1]) == 1 and m.origins[q + 1][0].bits == 0xFF
                                     and m.origins[q + 1][0].same_place):
                q += 1
            srcs = [x for k in range(p, q + 1) for x in m.origins[k]]
            fields = sorted({_field_of(dtype, x.byte) for x in srcs})
            rows = sorted({x.row for x in srcs})
            text = (_("bits of {fields} of rows {first}–{last}, regrouped").format(
                fields=", ".join(fields), first=first + rows[0], last=first + rows[-1]) if srcs
                else _("bits pack sets on its own"))
            out.append(Run(p, q, text, tuple(rows)))
        p = q + 1
    return out


def _cell(byte: int, colour: str, title: str, picked: bool) -> str:
    cls = "hb rpb picked" if picked else "hb rpb"
    return f'<span class="{cls}" style="background: {colour}" title="{escape(title)}">{byte:02x}</span>'


def _packed_cell(p: int, byte: int, m: ByteMap, dtype: np.dtype, first: int, picked: int) -> str:
    origins = m.origins[p]
    parts = [_("row {row}'s {field}").format(row=first + o.row, field=byte_field(dtype, o.byte))
             + ("" if o.bits == 0xFF else _(" (into bits {mask:#04x})").format(mask=o.bits)) for o in origins]
    title = _("byte {p}: from {sources}").format(p=p, sources="; ".join(parts) or "-")
    if m.xor[p]:
        title += _(", stored XOR {mask:#04x}").format(mask=int(m.xor[p]))
    colours = [ROW_COLOURS[o.row] for o in origins] or ["#fff"]
    if len(colours) == 1:
        return _cell(byte, colours[0], title, origins[0].row == picked if origins else False)
    stops = ", ".join(f"{c} {100 * i // len(colours)}% {100 * (i + 1) // len(colours)}%"
                      for i, c in enumerate(colours))
    cls = "hb rpb mixed" + (" picked" if any(o.row == picked for o in origins) else "")
    return (f'<span class="{cls}" style="background: linear-gradient(90deg, {stops})" '
            f'title="{escape(title)}">{byte:02x}</span>')


# --- the threads panel's line on a repacked MUL_MAT ---------------------------------------------

@dataclass(frozen=True, slots=True)
class GemmRows:
    """Which activation rows of a repacked MUL_MAT went through gemm and which through gemv."""

    node: str
    src1: str
    layout: str
    vec_dot_type: str
    rows: int  # activation rows a plane (src1's ne[1])
    planes: int
    gemm: int  # rows 0 .. gemm - 1 of each plane: gemm, GEMM_ROWS at a time; the rest gemv

    @property
    def gemm_text(self) -> str:
        return _rows_text(0, self.gemm - 1) if self.gemm else ""

    @property
    def gemv_text(self) -> str:
        return _rows_text(self.gemm, self.rows - 1) if self.gemm < self.rows else ""


def _rows_text(a: int, b: int) -> str:
    return _("row {i}").format(i=a) if a == b else _("rows {a}–{b}").format(a=a, b=b)


def gemm_rows(state: State, step: Step) -> GemmRows | None:
    """forward_mul_mat of a repacked src0: the first ne11 - ne11 % 4 rows of each plane of src1
    are quantized 4 at a time (interleaved) and go through gemm, the rest one by one through gemv."""
    if step.kind != StepKind.NODE:
        return None
    node = current_node(state, step)
    if node is None or node.op != GGMLOp.MUL_MAT:
        return None
    layout = layout_in_buffer(node.source(0))
    if layout is None:
        return None
    src1 = node.source(1)
    ne11 = int(src1.ne[1])
    return GemmRows(node.name, src1.name, layout.name, TYPE_TRAITS[layout.vec_dot_type].type_name, ne11,
                    int(src1.ne[2]) * int(src1.ne[3]), ne11 - ne11 % GEMM_ROWS)
