"""The training panel, for a walkthrough that trains (mnist-train): the loss and accuracy after
each epoch as two small charts (training and validation), the accuracy on the held-out digits,
and some of those digits drawn with the label the network read. Everything shown is in the
trace's outputs: the engine computed it while the program ran."""

from __future__ import annotations

import base64
import math
from dataclasses import dataclass

import numpy as np

from app.i18n import _
from app.views.png import png_rgb
from engine.trace import Trace

W, H, PAD = 300, 120, 4  # a chart's size in SVG units, and its inner margin


@dataclass(frozen=True, slots=True)
class Curve:
    label: str
    css: str  # the line's class: train or val
    points: str  # SVG polyline points
    last: str  # the last value, formatted


@dataclass(frozen=True, slots=True)
class Chart:
    title: str
    curves: list[Curve]
    top: str  # the value at the top of the chart
    bottom: str


@dataclass(frozen=True, slots=True)
class Digit:
    png: str  # data: URI of the 8x8 image, scaled up
    pred: int
    label: int

    @property
    def right(self) -> bool:
        return self.pred == self.label


@dataclass(frozen=True, slots=True)
class TrainingView:
    epochs: int
    first_loss: float
    charts: list[Chart]
    test_accuracy: float
    test_unc: float
    n_test: int
    digits: list[Digit]


def _points(values: list[float], lo: float, hi: float) -> str:
    n = len(values)
    span = (hi - lo) or 1.0
    xs = [PAD + (W - 2 * PAD) * (i / max(n - 1, 1)) for i in range(n)]
    ys = [H - PAD - (H - 2 * PAD) * ((v - lo) / span) for v in values]
    return " ".join(f"{x:.1f},{y:.1f}" for x, y, v in zip(xs, ys, values) if math.isfinite(v))


def _chart(title: str, train: list[float], val: list[float], lo: float, hi: float, fmt: str) -> Chart:
    curves = [Curve(_("training"), "train", _points(train, lo, hi), fmt.format(train[-1])),
              Curve(_("validation"), "val", _points(val, lo, hi), fmt.format(val[-1]))]
    return Chart(title, curves, fmt.format(hi), fmt.format(lo))


def _digit_png(pixels: list[float], scale: int = 6) -> str:
    grey = (255 - np.clip(np.asarray(pixels, dtype=np.float32).reshape(8, 8), 0, 1) * 255).astype(np.uint8)
    big = np.repeat(np.repeat(grey, scale, axis=0), scale, axis=1)
    rgb = np.stack([big] * 3, axis=-1)
    return "data:image/png;base64," + base64.b64encode(png_rgb(rgb)).decode()


def training_view(trace: Trace) -> TrainingView | None:
    out = trace.outputs
    if "history" not in out or not out["history"]:
        return None
    h = np.asarray(out["history"], dtype=float)  # per epoch: loss, ±, accuracy, ± (train), then val
    loss_hi = float(np.nanmax(h[:, [0, 4]]))
    charts = [_chart(_("loss (cross entropy)"), list(h[:, 0]), list(h[:, 4]), 0.0, loss_hi, "{:.3f}"),
              _chart(_("accuracy"), list(100 * h[:, 2]), list(100 * h[:, 6]), 0.0, 100.0, "{:.1f}%")]
    pred, labels = out["test_pred"], out["test_labels"]
    digits = [Digit(_digit_png(px), int(p), int(y)) for px, p, y in zip(out["test_images"], pred, labels)]
    acc, unc = out["test_accuracy"]
    return TrainingView(len(h), float(out["first_loss"]), charts, float(acc), float(unc), len(labels), digits)
