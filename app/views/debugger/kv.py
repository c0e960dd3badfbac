"""The KV panel, on the model walkthroughs: the KV cache as the step's pass finds it — the cells
allocated (the context padded to 256 cells, as llama_context pads n_ctx), the cells attention
reads (n_kv: the cells in use padded to 256), the cells in use and the positions they hold, the
cells this pass writes, and, for the sliding-window layers of Gemma 2 and 3, which cells a layer
still sees at the newest token, beside a global layer; then the masks the pass's attention reads,
their -inf / 0 pattern drawn as query tokens x cells.

Everything is read from the trace: the cache tensors' shapes (cache_k_l*) from the recorded
state; each pass's inputs (inp_pos, attn_inp_k_idxs, the KQ masks) from the state right after the
step that set them (ggml_backend_tensor_set, or set_data in the gemma3 walkthrough), found by
that step's note (the tensor's name and data address). The walkthrough itself returns what the
trace does not hold as tensors (engine/programs/model.py kv_facts): the context asked for (-c),
the sliding window and which layers slide.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from app.i18n import _
from app.views.debugger.values import element_view
from app.views.debugger.where import Where, ref_key
from engine.compute.kernels.common import to_f32
from engine.core.tensor import Tensor
from engine.models.decoder import KV_PAD
from engine.models.params import CTX_PAD
from engine.trace import State, Step, Trace

MASKS = ("attn_inp_kq_mask", "attn_inp_kq_mask_swa")  # llama.cpp's names: causal, sliding window
INPUTS = ("inp_pos", "attn_inp_k_idxs", "attn_inp_k_idxs_swa", *MASKS)
MAX_COLS = 64  # cells drawn at most (the newest ones); the others are summed up in words
MAX_ROWS = 32  # query tokens drawn at most (the newest)
EXTRA_COLS = 4  # empty cells drawn past the last one in use (padding: what n_kv adds)
CELL_PX, AXIS_PX = 11.0, 34.0  # a mask grid's cell side and its axes' room (px)
TICK_PX = 5  # a digit of its labels (px)
KEPT = 64  # passes' inputs kept read, across traces


@dataclass(frozen=True, slots=True)
class PassInputs:
    """One pass's inputs, as the step that set the last of them left them."""

    n_past: int  # the cells in use before the pass
    step: int  # the step after which every input is set
    positions: np.ndarray  # inp_pos: the new tokens' positions
    cells: np.ndarray  # attn_inp_k_idxs: the cells their K (and V) rows go to
    masks: dict[str, np.ndarray]  # mask name -> [n tokens, n_kv cells], its values as float
    cache_cells: dict[str, int]  # the cache tensors: name -> ne[1] (cells allocated)
    refs: dict[str, tuple[int, int]]  # each input tensor's (context, struct offset)


@dataclass(frozen=True, slots=True)
class CellView:
    index: int
    pos: int | None  # the position of the token it holds (None: empty, padding)
    kind: str  # old (an earlier pass's), new (this pass's), empty
    seen: bool  # the newest token's mask row has 0 here (its attention reads the cell)
    title: str


@dataclass(frozen=True, slots=True)
class Strip:
    """The cells one kind of layer reads at the newest token, from its mask's last row."""

    label: str
    mask: str
    cells: list[CellView]
    first: int | None  # the first and last cell seen (None: none)
    last: int | None
    n_seen: int
    rule: str  # the rule that row follows, in words


@dataclass(frozen=True, slots=True)
class MaskRun:
    x: float
    w: float
    masked: bool
    title: str


@dataclass(frozen=True, slots=True)
class MaskGrid:
    name: str
    layers: str  # the layers that read it
    n_kv: int  # its width: the cells attention reads
    rows: list[tuple[float, int, list[MaskRun]]]  # (y, query position, runs of equal values)
    cols: list[tuple[float, int]]  # (x, cell) column labels
    width: float
    height: float
    note: str  # the rows and columns not drawn, summed up from their values
    url: str  # the mask tensor selected, at the step that set it
    x0: float = AXIS_PX  # where the cells start
    y0: float = AXIS_PX / 2
    cell: float = CELL_PX  # a cell's side


@dataclass(frozen=True, slots=True)
class KVView:
    title: str  # "pass 2 of 4: ..."
    facts: list[str]  # the cache's sizes, padded, in sentences
    n_ctx_asked: int
    n_ctx: int  # cells allocated (the non-SWA cache's cache_k tensors)
    n_ctx_swa: int | None  # the sliding-window layers' cache (None: no such layer)
    n_kv: int  # the cells attention reads this pass (the causal mask's width)
    n_used: int  # cells holding a token after this pass
    n_past: int
    n_new: int
    n_swa: int  # the window, in positions (0: none)
    bar: list[tuple[str, float, str]]  # (kind, width %, title): the cache allocated, to scale
    strips: list[Strip]
    masks: list[MaskGrid]
    layer_note: str  # which mask the step's own layer reads
    set_url: str  # the step that set the pass's inputs
    set_step: int


_lock = threading.Lock()
_read: OrderedDict[tuple[str, int], PassInputs] = OrderedDict()


def kv_view(trace: Trace, step: Step, state: State, where: Where) -> KVView | None:
    """The KV panel at a step of a walkthrough whose run returned kv_n_ctx (a model with a KV
    cache): None elsewhere, and before its first pass."""
    out = trace.outputs
    if "kv_n_ctx" not in out or "kv_swa_layers" not in out:
        return None
    sets = pass_inputs_steps(trace)
    if not sets:
        return None
    n_past = step.n_past if step.n_past in sets else None
    if n_past is None:  # (a step between passes, or after the last: the pass before it)
        done = [p for p, names in sets.items() if max(k for k, _ in names.values()) < step.index]
        if not done:
            return None
        n_past = max(done)
    order = sorted(sets)
    now = read_pass(trace, n_past, state)
    if now is None:
        return None
    holds: dict[int, tuple[int, str]] = {}  # cell -> (position, old / new)
    for p in order[:order.index(n_past) + 1]:
        inp = now if p == n_past else read_pass(trace, p, None)
        if inp is not None:
            for c, pos in zip(inp.cells.tolist(), inp.positions.tolist()):
                holds[int(c)] = (int(pos), "new" if p == n_past else "old")
    swa = [bool(x) for x in out["kv_swa_layers"]]
    n_swa, asked = int(out.get("kv_n_swa") or 0), int(out["kv_n_ctx"])
    n_ctx = _cells(now, swa, False)
    n_ctx_swa = _cells(now, swa, True) if any(swa) else None
    main = now.masks.get(MASKS[0])
    n_kv = int(main.shape[1]) if main is not None else n_ctx
    n_used = len(holds)
    newest = int(now.positions.max()) if now.positions.size else 0
    facts = [_("The context asked for: {asked} cells. llama.cpp pads it to a multiple of {pad}, "
               "so the cache holds n_ctx = {n_ctx} cells per layer (the cache_k_l* tensors' "
               "ne[1]).").format(asked=asked, pad=CTX_PAD, n_ctx=n_ctx)]
    if n_ctx_swa is not None and n_ctx_swa < n_ctx:
        facts.append(_("The sliding-window layers keep a smaller cache: {cells} cells each "
                       "(llama.cpp's SWA cache: the window of {n_swa} positions plus a ubatch, "
                       "padded to {pad}, at most n_ctx).").format(cells=n_ctx_swa, n_swa=n_swa,
                                                                 pad=CTX_PAD))
    elif n_ctx_swa is not None:
        facts.append(_("The sliding-window layers' cache tensors hold {cells} cells each, as "
                       "the global layers' do: the window is in their mask.").format(cells=n_ctx_swa))
    facts.append(_("This pass's attention reads n_kv = {n_kv} cells (its mask's width): the "
                   "{n_used} cells in use after it, padded to a multiple of {pad}; the {pad_cells} "
                   "cells past them are padding, masked with -inf.").format(
        n_kv=n_kv, n_used=n_used, pad=KV_PAD, pad_cells=max(0, n_kv - n_used)))
    first = min(holds) if holds else 0
    col1 = min(n_kv, (max(holds) + 1 if holds else 0) + EXTRA_COLS)
    col0 = max(0, min(first, col1 - MAX_COLS))
    strips = [_strip(now, name, holds, col0, col1, newest, n_swa, swa) for name in MASKS
              if name in now.masks]
    grids = [_grid(now, name, col0, col1, swa,
                   where.url(step=now.step, tensor=ref_key(*now.refs[name])))
             for name in MASKS if name in now.masks]
    layer_note = ""
    if step.layer is not None and 0 <= step.layer < len(swa) and len(now.masks) > 1:
        layer_note = (_("This step is in layer {il}, a sliding-window layer: its attention reads "
                        "attn_inp_kq_mask_swa.") if swa[step.layer] else
                      _("This step is in layer {il}, a global layer: its attention reads "
                        "attn_inp_kq_mask.")).format(il=step.layer)
    n_new = int(now.positions.size)
    title = _("Pass {k} of {n}: {n_new} new token(s) at positions {a}..{b}, after {n_past} in the "
              "cache").format(k=order.index(n_past) + 1, n=len(order), n_new=n_new,
                              a=int(now.positions.min()) if n_new else 0, b=newest, n_past=n_past)
    return KVView(title, facts, asked, n_ctx, n_ctx_swa, n_kv, n_used, n_past, n_new, n_swa,
                  _bar(n_ctx, n_kv, n_used, n_new), strips, grids, layer_note,
                  where.url(step=now.step), now.step)


def pass_inputs_steps(trace: Trace) -> dict[int, dict[str, tuple[int, int]]]:
    """Per pass (its n_past), the steps that set its inputs: name -> (step, data address), from
    each step's note ("… wrote the data of 'inp_pos': 8 bytes at 0x…")."""
    found: dict[int, dict[str, tuple[int, int]]] = {}
    quoted = {f"'{n}'": n for n in INPUTS}
    for s in trace.steps:
        if s.n_past is None or not s.notes or s.notes[0].key != "wrote_data":
            continue
        args = dict(s.notes[0].args)
        name = quoted.get(str(args.get("name")))
        if name is not None:
            found.setdefault(s.n_past, {})[name] = (s.index, int(str(args["addr"]), 16))
    return {p: names for p, names in found.items() if "inp_pos" in names and "attn_inp_k_idxs" in names}


def read_pass(trace: Trace, n_past: int, state: State | None) -> PassInputs | None:
    """The pass's inputs as set (read once per trace and pass): from the state right after the
    last of them was set (`state` when it is that one)."""
    key = (trace.hash, n_past)
    with _lock:
        if key in _read:
            _read.move_to_end(key)
            return _read[key]
    names = pass_inputs_steps(trace).get(n_past)
    if names is None:
        return None
    at = max(k for k, _ in names.values())
    st = state if state is not None and state.k == at else trace.state_at(at)
    tensors = {name: _tensor(st, name, addr) for name, (_k, addr) in names.items()}
    if tensors["inp_pos"] is None or tensors["attn_inp_k_idxs"] is None:
        return None
    masks = {}
    for name in MASKS:
        t = tensors.get(name)
        if t is not None:
            v = element_view(t)
            if v is not None:
                masks[name] = to_f32(v, t.type).astype(np.float32).reshape(-1, int(t.ne[0]))
    inp = PassInputs(n_past, at, _ints(tensors["inp_pos"]), _ints(tensors["attn_inp_k_idxs"]),
                     masks, _cache_cells(st),
                     {name: (t.ctx.id, t.offs) for name, t in tensors.items() if t is not None})
    with _lock:
        _read[key] = inp
        while len(_read) > KEPT:
            _read.popitem(last=False)
    return inp


def _tensor(state: State, name: str, addr: int) -> Tensor | None:
    """The tensor of that name whose data is at addr, in the state's contexts."""
    for cid in state.contexts:
        for info in state.tensor_infos(cid):
            if info.data == addr and info.name == name:
                return state.tensor((cid, info.offs))
    return None


def _ints(t: Tensor) -> np.ndarray:
    v = element_view(t)
    return np.zeros(0, np.int64) if v is None else np.asarray(v).reshape(-1).astype(np.int64)


def _cache_cells(state: State) -> dict[str, int]:
    """The cache tensors (cache_k_l0, …) and their cells (ne[1]), as the state holds them."""
    cells: dict[str, int] = {}
    for cid in state.contexts:
        for info in state.tensor_infos(cid):
            if info.name.startswith("cache_k_l") and info.name not in cells:
                cells[info.name] = int(info.ne[1])
    return cells


def _cells(inp: PassInputs, swa: list[bool], of_swa: bool) -> int:
    """The cells of the first layer of that kind (the cache tensors' ne[1])."""
    for il, s in enumerate(swa):
        if s == of_swa and f"cache_k_l{il}" in inp.cache_cells:
            return inp.cache_cells[f"cache_k_l{il}"]
    return 0


def _layers(swa: list[bool], of_swa: bool) -> str:
    return ", ".join(str(il) for il, s in enumerate(swa) if s == of_swa) or "-"


def _bar(n_ctx: int, n_kv: int, n_used: int, n_new: int) -> list[tuple[str, float, str]]:
    """The cache's cells to scale: in use before the pass, written by it, padding up to n_kv,
    and the cells this pass does not read."""
    total = max(1, n_ctx)
    parts = [("old", n_used - n_new, _("{n} cell(s) in use before this pass")),
             ("new", n_new, _("{n} cell(s) this pass writes")),
             ("pad", n_kv - n_used, _("{n} cell(s) of padding: read, masked with -inf")),
             ("unread", n_ctx - n_kv, _("{n} cell(s) this pass does not read"))]
    return [(kind, 100.0 * n / total, title.format(n=n)) for kind, n, title in parts if n > 0]


def _strip(inp: PassInputs, name: str, holds: dict[int, tuple[int, str]], col0: int, col1: int,
           newest: int, n_swa: int, swa: list[bool]) -> Strip:
    row = inp.masks[name][-1]  # the newest token's
    seen_all = [int(c) for c in np.flatnonzero(row == 0)]
    cells = []
    for c in range(col0, min(col1, row.size)):
        pos, kind = holds.get(c, (None, "empty"))
        seen = bool(row[c] == 0)
        if pos is None:
            title = _("cell {c}: empty (padding), {v}").format(c=c, v=_value(row[c]))
        elif seen:
            title = _("cell {c}: position {pos}, seen ({v})").format(c=c, pos=pos, v=_value(row[c]))
        else:
            title = _("cell {c}: position {pos}, not seen ({v})").format(c=c, pos=pos, v=_value(row[c]))
        cells.append(CellView(c, pos, kind, seen, title))
    if name == MASKS[1]:
        label = _("A sliding-window layer (layers {layers}) at position {pos}").format(
            layers=_layers(swa, True), pos=newest)
        rule = _("it sees position p when p <= {pos} and {pos} - p < n_swa = {n_swa}").format(
            pos=newest, n_swa=n_swa)
    else:
        label = _("A global layer (layers {layers}) at position {pos}").format(
            layers=_layers(swa, False), pos=newest)
        rule = _("it sees every position p <= {pos}").format(pos=newest)
    return Strip(label, name, cells, seen_all[0] if seen_all else None,
                 seen_all[-1] if seen_all else None, len(seen_all), rule)


def _value(x: float) -> str:
    return "-inf" if np.isneginf(x) else f"{float(x):g}"


def _grid(inp: PassInputs, name: str, col0: int, col1: int, swa: list[bool], url: str) -> MaskGrid:
    m = inp.masks[name]
    n, n_kv = m.shape
    r0 = max(0, n - MAX_ROWS)
    col1 = min(col1, n_kv)
    rows = []
    for i, r in enumerate(range(r0, n)):
        y = AXIS_PX / 2 + i * CELL_PX
        pos = int(inp.positions[r]) if r < inp.positions.size else r
        runs, c = [], col0
        while c < col1:  # runs of equal values: one rect each
            e = c
            while e < col1 and (m[r, e] == 0) == (m[r, c] == 0):
                e += 1
            masked = bool(m[r, c] != 0)
            runs.append(MaskRun(AXIS_PX + (c - col0) * CELL_PX, (e - c) * CELL_PX, masked,
                            _("query {pos}, cells {a}..{b}: {v}").format(
                                pos=pos, a=c, b=e - 1, v=_value(m[r, c]) if masked else "0")))
            c = e
        rows.append((y, pos, runs))
    every = -(-len(str(max(col1 - 1, 0))) * TICK_PX // (CELL_PX - 2))  # labels that fit
    cols = [(AXIS_PX + (c - col0 + 0.5) * CELL_PX, c) for c in range(col0, col1) if c % every == 0]
    notes = []
    if r0:
        notes.append(_("the first {n} query rows are not drawn").format(n=r0))
    for a, b in ((0, col0), (col1, n_kv)):
        if b > a:
            part = m[:, a:b]
            notes.append(_("cells {a}..{b} not drawn: {zeros} values 0, {inf} values -inf").format(
                a=a, b=b - 1, zeros=int((part == 0).sum()), inf=int(np.isneginf(part).sum())))
    layers = _layers(swa, name == MASKS[1])
    return MaskGrid(name, layers, n_kv, rows, cols, AXIS_PX + (col1 - col0) * CELL_PX,
                    AXIS_PX / 2 + len(rows) * CELL_PX, "; ".join(notes), url)
