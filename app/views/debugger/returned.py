"""What a program returned, shown at its last step without a tab click: numbers and strings as
they are, tensors and arrays as value tables (their first rows and columns), as ggml's own
examples print their result."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from app.views.format import fmt_short, visible_text
from engine.trace.steps import assigned_names
from engine.trace import Step, StepKind, Trace

SHOWN = 8  # outputs shown
ROWS, COLS = 12, 12  # of each table


@dataclass(frozen=True, slots=True)
class Returned:
    name: str
    value: str | None  # a number or a string
    table: list[list[str]]  # rows of an array (its first 2-d slice)
    shape: str  # the array's shape, e.g. "3 × 4"
    cut: bool  # the table shows only part of it
    made_at: int | None = None  # the step whose statement assigned the variable of that name


def returned(trace: Trace, step: Step) -> list[Returned]:
    """The outputs, at the step that says the program returned (else nothing), each with the
    step that made it: the last call whose statement assigns a variable of its name."""
    if step.kind != StepKind.END:
        return []
    made = {name: s.index for s in trace.steps if s.kind == StepKind.CALL for name in assigned_names(s.call)}
    return [replace(_one(name, v), made_at=made.get(name)) for name, v in list(trace.outputs.items())[:SHOWN]]


def _one(name: str, v: Any) -> Returned:
    if isinstance(v, str):
        return Returned(name, visible_text(v, 200), [], "", len(v) > 200)
    if isinstance(v, (bool, int, float)) or v is None:
        return Returned(name, str(v) if isinstance(v, (bool, int)) or v is None else fmt_short(v), [], "", False)
    try:
        a = np.asarray(v, dtype=np.float64)
    except (TypeError, ValueError):  # ragged or not numbers
        return Returned(name, visible_text(repr(v), 200), [], "", len(repr(v)) > 200)
    shape = " × ".join(str(n) for n in a.shape)
    if a.ndim == 0:
        return Returned(name, fmt_short(float(a)), [], "", False)
    m = a.reshape(-1, a.shape[-1]) if a.ndim > 2 else a.reshape(1, -1) if a.ndim == 1 else a
    rows = [[fmt_short(float(x)) for x in row[:COLS]] for row in m[:ROWS]]
    return Returned(name, None, rows, shape, m.shape[0] > ROWS or m.shape[1] > COLS or a.ndim > 2)
