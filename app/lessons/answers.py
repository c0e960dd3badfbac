"""A stop solved on a trace, and a learner's answer judged against it.

`solve` finds the stop's step and reads its fact (app/lessons/facts.py); `judge` reads what the
learner typed or chose in the stop's form and compares: a number exactly (or within the stop's
tolerance), a shape element by element, a choice by the tensor or name it stands for. The
learner's answer is also put in a canonical form (`Judged.said`), which a class's tally counts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from app.lessons import GIVEN, Ask, Form, LessonStop
from app.lessons.facts import FactError, Picked, Shape, Value, resolve, tensor_refs
from engine.trace import State, Trace

UNREAD = "?"  # what an answer that does not read as the form asks is counted as


@dataclass(frozen=True, slots=True)
class Solved:
    """A stop on a trace: the step it is about, the answer, and what the question names."""

    step: int  # the step the fact is read after
    asked: int  # the step the debugger shows while the question is open (step, or one before it)
    value: Value
    answer: str  # the answer as the learner would write it (a choice: its option's label)
    given: tuple[str, ...]  # the `given` facts, as the question shows them
    choice: int | None = None  # a choice: the index of the right option


def label(option: str) -> str:
    """A choice's label: a tensor spec without its `$` (the program's variable)."""
    return option[1:] if option.startswith("$") else option


def shown(value: Value) -> str:
    """A value as a learner writes it: 768, [4, 3], MUL_MAT."""
    if isinstance(value, Shape):
        return "[" + ", ".join(str(n) for n in value.ne) + "]"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def solve(trace: Trace, stop: LessonStop, state: State | None = None) -> Solved:
    """The stop's step and answer on this trace (FactError when it does not resolve, or the
    answer does not fit the stop's form)."""
    k, value = resolve(trace, stop.at, stop.fact, state)
    asked = stop.show.find(trace) if stop.show is not None else max(0, k - 1) if stop.ask == Ask.BEFORE else k
    if asked > k:
        raise FactError(f"the step shown while asking ({asked}) comes after the step asked about ({k})")
    given = tuple(shown(resolve(trace, stop.at, g, state)[1]) for g in stop.given)
    if stop.form == Form.CHOICE:
        if isinstance(value, Picked):
            refs = tensor_refs(trace, k, stop.options, state)
            hits = [i for i, ref in enumerate(refs) if ref == value.ref]
        else:
            hits = [i for i, option in enumerate(stop.options) if option == value]
        if len(hits) != 1:
            raise FactError(f"the answer {value!r} is {'none' if not hits else 'more than one'} of the options "
                            f"{list(stop.options)}")
        return Solved(k, asked, value, label(stop.options[hits[0]]), given, hits[0])
    if stop.form == Form.SHAPE and not isinstance(value, Shape):
        raise FactError(f"a shape question's fact gives {value!r}")
    if stop.form == Form.NUMBER and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise FactError(f"a number question's fact gives {value!r}")
    return Solved(k, asked, value, shown(value), given)


def fill(text: str, solved: Solved, answer: bool = False) -> str:
    """A lesson's text with the stop's values put in: {given}… always, {answer} when `answer`."""
    for p, value in zip(GIVEN, solved.given):
        text = text.replace(p, value)
    return text.replace("{answer}", solved.answer) if answer else text


@dataclass(frozen=True, slots=True)
class Judged:
    right: bool
    said: str  # the learner's answer in canonical form (UNREAD when it does not read)
    higher: bool | None = None  # a wrong number: True when the answer is higher than said


NUMBER = re.compile(r"^[+-]?(0[xX][0-9a-fA-F]+|\d+(\.\d*)?([eE][+-]?\d+)?|\.\d+)$")


def read_number(text: str) -> int | float | None:
    """A number as a learner types it: 768, 0x300, 1_024, 1,024, 2.5 (None if it is none)."""
    t = re.sub(r"[\s_,]", "", text or "")
    if not NUMBER.match(t):
        return None
    if re.fullmatch(r"[+-]?(0[xX][0-9a-fA-F]+|\d+)", t):
        return int(t, 0)
    return float(t)


def read_shape(text: str) -> tuple[int, ...] | None:
    """A shape as a learner types it: "4, 3", "[4,3]", "4 x 3" (trailing 1s dropped)."""
    if not re.fullmatch(r"[\s\[\](),xX×0-9]*", text or ""):
        return None
    ne = [int(n) for n in re.findall(r"\d+", text)]
    while len(ne) > 1 and ne[-1] == 1:
        ne.pop()
    return tuple(ne) or None


def judge(stop: LessonStop, solved: Solved, text: str) -> Judged:
    """The learner's answer `text` (a choice: the option's index) against the solved stop."""
    if stop.form == Form.CHOICE:
        try:
            i = int(text)
        except (TypeError, ValueError):
            return Judged(False, UNREAD)
        if not 0 <= i < len(stop.options):
            return Judged(False, UNREAD)
        return Judged(i == solved.choice, label(stop.options[i]))
    value = solved.value
    if stop.form == Form.SHAPE:
        ne = read_shape(text)
        if ne is None:
            return Judged(False, UNREAD)
        assert isinstance(value, Shape)  # (a shape question's fact is a shape: the lesson's check)
        return Judged(ne == value.ne, shown(Shape(ne)))
    x = read_number(text)
    if x is None:
        return Judged(False, UNREAD)
    assert isinstance(value, (int, float))  # (a number question's fact is a number: the lesson's check)
    right = abs(x - value) <= stop.tolerance
    return Judged(right, shown(x), None if right else value > x)
