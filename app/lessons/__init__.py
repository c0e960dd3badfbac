"""Lessons: paths through the concepts of ggml, each a few stops on a walkthrough's steps.

A lesson is data, one TOML file in this folder (Python's own tomllib reads it), in both
languages: its concept and title, the walkthrough it stops on, and its stops in order. A stop
names a step (facts.Selector: by the call's text, robust to lines moving), whether the learner
sees the step before it and predicts (`ask = "before"`) or reads the step itself (`"at"`), the
fact it asks (facts.TraceFact), the answer's form (a number, a choice among tensors or names, a
shape), the question, a hint, the explanation and the panel that shows the answer. The answer
is never written in the file: the server reads it from the recorded trace (facts.resolve), and
tests/unit/app/test_lessons.py resolves every stop of every lesson on the current engine, so a
lesson cannot go stale without a failing test.

In a question, a hint or an explanation, `{given}` (`{given2}`, `{given3}`) is the value of the
stop's `given` facts (numbers the question needs, read from the trace too) and `{answer}`
(explanations only) the answer.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from app.lessons.facts import TraceFact, Selector
from app.views.debugger.panels import PANELS
from engine.programs import PROGRAMS
from engine.trace import StepKind

FOLDER = Path(__file__).resolve().parent
LANGS = ("en", "zh")
GIVEN = ("{given}", "{given2}", "{given3}")  # the values of a stop's `given` facts, in order
PLACEHOLDERS = (*GIVEN, "{answer}")


class Form(StrEnum):
    """What the learner answers with."""

    NUMBER = "number"  # an integer (decimal or 0x hex), or a number within `tolerance`
    CHOICE = "choice"  # one of the stop's options: tensor specs, or names (an op, a backend)
    SHAPE = "shape"  # ne, as "3, 4, 2"


class Ask(StrEnum):
    """What the debugger shows while the question is open."""

    BEFORE = "before"  # the step before: the learner predicts what the step will do
    AT = "at"  # the step itself: the learner reads (or works out) the fact from it


@dataclass(frozen=True, slots=True)
class Text:
    """A text in both languages."""

    en: str
    zh: str

    def __call__(self, lang: str) -> str:
        return self.zh if lang == "zh" else self.en


@dataclass(frozen=True, slots=True)
class LessonStop:
    at: Selector  # the step the question is about
    ask: Ask
    fact: TraceFact  # what the answer is, read after that step
    form: Form
    question: Text
    hint: Text  # shown after a wrong answer, before the answer itself
    explain: Text  # shown with the verdict: why the answer is what it is
    panel: str  # the debugger's panel (app/views/debugger/panels.py) that shows the answer
    options: tuple[str, ...] = ()  # a choice's options: tensor specs or names
    given: tuple[TraceFact, ...] = ()  # facts the question names ({given}, {given2}, {given3})
    tolerance: float = 0.0  # a number's allowed difference (0: exactly)
    show: Selector | None = None  # the step shown while asking, when not the one before (or at) `at`


@dataclass(frozen=True, slots=True)
class Lesson:
    id: str  # its URL name, and its file's name
    order: int  # its place on the map
    walkthrough: str  # the walkthrough (engine.programs) its stops are steps of
    concept: Text  # the concept it teaches, as the map names it
    title: Text
    intro: Text
    stops: tuple[LessonStop, ...]


class LessonError(ValueError):
    """A lesson file that does not read: the file and what is wrong."""


def _text(d: dict, name: str, where: str, allowed: tuple[str, ...] = ()) -> Text:
    t = d.get(name)
    if not isinstance(t, dict) or set(t) != set(LANGS) or not all(isinstance(t[x], str) and t[x].strip()
                                                                  for x in LANGS):
        raise LessonError(f"{where}: `{name}` needs a non-empty text in each of {', '.join(LANGS)}")
    for lang in LANGS:
        rest = t[lang]
        for p in allowed:
            rest = rest.replace(p, "")
        if "{" in rest or "}" in rest:
            raise LessonError(f"{where}: `{name}.{lang}` may hold only {' '.join(allowed) or 'no placeholder'}")
    return Text(t["en"].strip(), t["zh"].strip())


def _fact(d: object, where: str) -> TraceFact:
    if not isinstance(d, dict) or "kind" not in d:
        raise LessonError(f"{where}: a fact is a table with a `kind`")
    try:
        f = TraceFact(**d)
        f.check()
    except (TypeError, ValueError) as e:
        raise LessonError(f"{where}: {e}") from None
    return f


def _selector(d: dict | None, where: str) -> Selector:
    at = dict(d or {})
    try:
        if "kind" in at:
            at["kind"] = StepKind(at["kind"])
        selector = Selector(**at)
    except (TypeError, ValueError) as e:
        raise LessonError(f"{where}: {e}") from None
    if selector.call is None and selector.kind is None and selector.index is None:
        raise LessonError(f"{where}: names no step (call, kind or index)")
    return selector


def _stop(d: dict, where: str, panels: frozenset[str]) -> LessonStop:
    known = {"at", "ask", "show", "fact", "answer", "question", "hint", "explain", "panel", "options", "given",
             "tolerance"}
    if set(d) - known:
        raise LessonError(f"{where}: unknown keys {sorted(set(d) - known)}")
    selector = _selector(d.get("at"), where + " `at`")
    panel = d.get("panel")
    if panel not in panels:
        raise LessonError(f"{where}: panel {panel!r} is not one of {sorted(panels)}")
    answer: Any = d.get("answer")  # (whatever the file holds: Form refuses what it is not)
    try:
        ask, form = Ask(d.get("ask", "before")), Form(answer)
    except ValueError as e:
        raise LessonError(f"{where}: {e}") from None
    stop = LessonStop(selector, ask, _fact(d.get("fact"), where), form,
                _text(d, "question", where, GIVEN), _text(d, "hint", where, GIVEN),
                _text(d, "explain", where, PLACEHOLDERS), panel, tuple(d.get("options", ())),
                _givens(d.get("given", ()), where), float(d.get("tolerance", 0)),
                _selector(d["show"], where + " `show`") if "show" in d else None)
    if (stop.form == Form.CHOICE) != bool(stop.options) or len(stop.options) == 1:
        raise LessonError(f"{where}: a choice has two or more options, and only a choice has options")
    for n, p in enumerate(GIVEN):
        used = any(p in t.en or p in t.zh for t in (stop.question, stop.hint, stop.explain))
        if used and n >= len(stop.given):
            raise LessonError(f"{where}: {p} is named but the stop has {len(stop.given)} `given` facts")
    return stop


def _givens(d: dict | list, where: str) -> tuple[TraceFact, ...]:
    """A stop's `given`: one fact, or a list of up to three."""
    found = tuple(_fact(x, f"{where} given") for x in ([d] if isinstance(d, dict) else d))
    if len(found) > len(GIVEN):
        raise LessonError(f"{where}: at most {len(GIVEN)} `given` facts")
    return found


def read_lesson(path: Path, panels: frozenset[str]) -> Lesson:
    """A lesson file, checked (LessonError names the file and the fault)."""
    where = path.name
    try:
        d = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise LessonError(f"{where}: {e}") from None
    if d.get("walkthrough") not in PROGRAMS:
        raise LessonError(f"{where}: walkthrough {d.get('walkthrough')!r} is not one of {', '.join(PROGRAMS)}")
    if d.get("id") != path.stem:
        raise LessonError(f"{where}: its id must be its file's name, {path.stem!r}")
    stops = tuple(_stop(s, f"{where} stop {i + 1}", panels) for i, s in enumerate(d.get("stops", ())))
    if len(stops) < 4:
        raise LessonError(f"{where}: a lesson has 4 or more stops; this one has {len(stops)}")
    return Lesson(d["id"], int(d.get("order", 0)), d["walkthrough"], _text(d, "concept", where),
                  _text(d, "title", where), _text(d, "intro", where), stops)


def read_lessons(folder: Path = FOLDER) -> dict[str, Lesson]:
    """Every lesson in the folder, in the map's order."""
    panels = frozenset(p.id for p in PANELS)
    found = [read_lesson(p, panels) for p in sorted(folder.glob("*.toml"))]
    return {x.id: x for x in sorted(found, key=lambda x: (x.order, x.id))}


LESSONS: dict[str, Lesson] = read_lessons()
