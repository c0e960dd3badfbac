"""A tensor's values, sampled: statistics, a histogram and a heatmap (as a PNG)."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field

import numpy as np

from app.i18n import _
from app.views.format import fmt_float
from app.views.gguf.file import Fact
from app.views.png import png_rgb
from engine.gguf import GGUFReader, TensorInfo
from engine.quants import QUANT_KINDS, dequantize
from engine.core.types import NUMPY_DTYPE, GGMLType, bf16_bits_to_fp32, traits

SAMPLE_VALUES = 1 << 18  # values read from a tensor for its statistics and pictures
HEAT_ROWS, HEAT_COLS = 64, 128  # the heatmap's size in cells, at most
HIST_BINS = 48

@dataclass(frozen=True, slots=True)
class SampleBar:
    """One bar of the sample's histogram, in percent of the plot; its title says the bin."""

    x: float
    y: float
    w: float
    h: float
    title: str


@dataclass(frozen=True, slots=True)
class SampleView:
    ok: bool
    note: str  # what was sampled, or why nothing could be
    stats: list[Fact] = field(default_factory=list)
    bars: list[SampleBar] = field(default_factory=list)
    hist_lo: str = ""
    hist_hi: str = ""
    zero_x: float | None = None  # where 0 falls on the histogram, if inside
    heat_png: str = ""  # data: URI
    heat_w: int = 0
    heat_h: int = 0
    heat_note: str = ""
    heat_scale: str = ""

def nrows(t: TensorInfo) -> int:
    return t.ne[1] * t.ne[2] * t.ne[3]

def can_read(t: TensorInfo) -> bool:
    if t.type in NUMPY_DTYPE:
        return True
    kind = QUANT_KINDS.get(t.type)
    return kind is not None and kind.dequantize is not None


def rows_float(r: GGUFReader, t: TensorInfo, rows: np.ndarray, ncols: int) -> np.ndarray:
    """Rows `rows` (over ne1..ne3 flattened) of tensor t, first `ncols` elements, as float64."""
    if t.type in NUMPY_DTYPE:
        data = r.tensor_data(t).reshape(nrows(t), t.ne[0])[rows, :ncols]
        if t.type == GGMLType.BF16:
            return bf16_bits_to_fp32(data.astype(np.uint16)).astype(np.float64)
        return data.astype(np.float64)
    tr = traits(t.type)
    nbytes = ncols // tr.blck_size * tr.type_size
    raw = r.tensor_bytes(t).reshape(nrows(t), t.nb[1])[rows, :nbytes]
    vals = dequantize(t.type, np.ascontiguousarray(raw), len(rows) * ncols)
    return vals.reshape(len(rows), ncols).astype(np.float64)

_NEG = np.array([47, 111, 219], np.float64)  # blue for negative values
_POS = np.array([200, 68, 47], np.float64)  # red for positive values


def _diverging(v: np.ndarray, vmax: float) -> np.ndarray:
    x = np.clip(np.nan_to_num(v / vmax if vmax > 0 else v * 0), -1, 1)[..., None]
    white = np.full(3, 255.0)
    rgb = np.where(x < 0, white + (-x) * (_NEG - white), white + x * (_POS - white))
    return rgb.round().astype(np.uint8)


def sample_rows(t: TensorInfo) -> tuple[np.ndarray, int]:
    """The rows the statistics read (evenly spaced) and how many elements of each."""
    tr = traits(t.type)
    ncols = min(t.ne[0], max(tr.blck_size, SAMPLE_VALUES // tr.blck_size * tr.blck_size))
    n = min(nrows(t), max(1, SAMPLE_VALUES // ncols))
    return np.unique(np.linspace(0, nrows(t) - 1, n).round().astype(np.int64)), ncols


def read_ranges(t: TensorInfo, row: int) -> list[tuple[int, int]]:
    """The file's byte ranges (start, length) the tensor page reads: the sampled rows' first
    elements and the whole row the block explainer shows."""
    if t.n_elements == 0:
        return []
    tr = traits(t.type)
    rows, ncols = sample_rows(t)
    ranges = [(t.data_offset + int(i) * t.nb[1], ncols // tr.blck_size * tr.type_size)
              for i in rows]
    row = min(max(row, 0), nrows(t) - 1)
    return ranges + [(t.data_offset + row * t.nb[1], t.nb[1])]


def sample_view(r: GGUFReader, t: TensorInfo) -> SampleView:
    n_rows, ne0 = nrows(t), t.ne[0]
    if t.n_elements == 0:
        return SampleView(False, _("This tensor has no elements."))
    if not can_read(t):
        return SampleView(False, _("The engine cannot convert {type} values to floats, so no statistics are "
                                   "shown.").format(type=t.type.name))
    rows, ncols = sample_rows(t)
    s = rows_float(r, t, rows, ncols)
    if s.size == t.n_elements:
        note = _("Computed on all {n} values.").format(n=f"{t.n_elements:,}")
    elif ncols < ne0:
        note = _("Computed on a sample: the first {k} of row 0's {n} values ({read} of {total}).").format(
            k=f"{ncols:,}", n=f"{ne0:,}", read=f"{s.size:,}", total=f"{t.n_elements:,}")
    else:
        note = _("Computed on a sample: {k} evenly spaced rows of {n} ({read} of {total} values, "
                 "{share}).").format(k=f"{len(rows):,}", n=f"{n_rows:,}", read=f"{s.size:,}",
                                     total=f"{t.n_elements:,}", share=f"{s.size / t.n_elements:.1%}")
    finite = s[np.isfinite(s)]
    stats = [Fact(_("values read"), f"{s.size:,}"),
             Fact(_("min"), fmt_float(finite.min()) if finite.size else "—"),
             Fact(_("max"), fmt_float(finite.max()) if finite.size else "—"),
             Fact(_("mean"), fmt_float(finite.mean()) if finite.size else "—"),
             Fact(_("std"), fmt_float(finite.std()) if finite.size else "—"),
             Fact(_("mean |x|"), fmt_float(np.abs(finite).mean()) if finite.size else "—"),
             Fact(_("exact zeros"), f"{int((s == 0).sum()):,}", f"{(s == 0).mean():.2%}"),
             Fact("NaN / inf", f"{int(s.size - finite.size):,}")]
    bars, lo_t, hi_t, zero_x = [], "", "", None
    if finite.size:
        lo, hi = float(finite.min()), float(finite.max())
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        counts, edges = np.histogram(finite, bins=HIST_BINS, range=(lo, hi))
        top = counts.max() or 1
        w = 100 / HIST_BINS
        for k, c in enumerate(counts.tolist()):
            h = 100 * c / top
            bars.append(SampleBar(round(k * w, 3), round(100 - h, 3), round(w, 3), round(h, 3),
                                  f"[{fmt_float(edges[k])}, {fmt_float(edges[k + 1])}): "
                                  + _("{n} values").format(n=f"{c:,}")))
        lo_t, hi_t = fmt_float(lo), fmt_float(hi)
        if lo < 0 < hi:
            zero_x = round(100 * (0 - lo) / (hi - lo), 3)
    # heatmap: up to HEAT_ROWS of the sampled rows, columns averaged into HEAT_COLS buckets
    pick = np.unique(np.linspace(0, len(rows) - 1, min(HEAT_ROWS, len(rows))).round()
                     .astype(np.int64))
    width = min(HEAT_COLS, ncols)
    edges = np.arange(width + 1, dtype=np.int64) * ncols // width
    sub = np.nan_to_num(s[pick], nan=0.0, posinf=0.0, neginf=0.0)
    cells = np.add.reduceat(sub, edges[:-1], axis=1) / np.diff(edges)
    mag = np.abs(finite) if finite.size else np.zeros(1)
    vmax = float(np.percentile(mag, 99)) or float(mag.max())
    png = base64.b64encode(png_rgb(_diverging(cells, vmax))).decode("ascii")
    per = ncols / width
    which = (_("row {n}").format(n=f"{int(rows[pick[0]]):,}") if len(pick) == 1 else
             _("{k} of the sampled rows, top to bottom (rows {first} … {last})").format(
                 k=len(pick), first=f"{int(rows[pick[0]]):,}", last=f"{int(rows[pick[-1]]):,}"))
    cell = _("one value") if per == 1 else _("the mean of about {n} neighbouring values").format(n=f"{per:.3g}")
    heat_note = _("{which}, left to right; each cell is {cell}.").format(which=which, cell=cell)
    return SampleView(True, note, stats, bars, lo_t, hi_t, zero_x,
                      f"data:image/png;base64,{png}", width, len(pick), heat_note,
                      _("blue −{v} · white 0 · red +{v} (99th percentile of |x|; larger values "
                        "saturate)").format(v=fmt_float(vmax)))
