"""The lesson pages' view-models: the map of concepts, a lesson's stops with the debugger's URLs
they open, and a verdict. The answers stay on the server: a lesson page carries the steps to
show, never a value a learner is asked for.

A lesson's stops are solved once per trace (`solved_stops`, kept by the trace's hash): the pages
and the verdicts of every learner of a class read the same solutions.
"""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock

from cachetools import LRUCache

from app.lessons import LESSONS, Ask, Lesson, LessonStop
from app.lessons.answers import Judged, Solved, fill, label, solve
from app.lessons.facts import FactError, Picked, TensorRef, tensor_refs
from app.views.debugger.where import Where, ref_key
from engine.trace import Trace

_SOLVED: LRUCache = LRUCache(256)  # (trace hash, lesson id) -> its stops solved
_SOLVED_LOCK = Lock()


def solved_stops(trace: Trace, lesson: Lesson) -> tuple[Solved, ...]:
    """Every stop of the lesson solved on the trace of its walkthrough (FactError: a stale stop)."""
    key = (trace.hash, lesson.id)
    with _SOLVED_LOCK:
        found = _SOLVED.get(key)
    if found is None:
        found = tuple(solve(trace, stop) for stop in lesson.stops)
        with _SOLVED_LOCK:
            _SOLVED[key] = found
    return found


@dataclass(frozen=True, slots=True)
class MapEntry:
    """A lesson on the map of concepts (the learner's progress is filled in by the browser)."""

    id: str
    concept: str
    title: str
    walkthrough: str
    n_stops: int


def entry(lesson: Lesson, lang: str) -> MapEntry:
    return MapEntry(lesson.id, lesson.concept(lang), lesson.title(lang), lesson.walkthrough, len(lesson.stops))


def lesson_map(lang: str) -> list[MapEntry]:
    """Every lesson, in the map's order."""
    return [entry(x, lang) for x in LESSONS.values()]


@dataclass(frozen=True, slots=True)
class StopView:
    index: int
    question: str
    form: str  # Form's value: number, choice, shape
    options: tuple[str, ...]  # a choice's labels
    panel: str  # the debugger panel that shows the answer
    asked_url: str  # the debugger while the question is open
    step_url: str  # the debugger at the step the question is about (the truth)


@dataclass(frozen=True, slots=True)
class LessonView:
    id: str
    concept: str
    title: str
    intro: str
    walkthrough: str
    stops: tuple[StopView, ...]
    next: MapEntry | None  # the next lesson on the map
    class_code: str | None  # the class whose answers are counted (a lesson link for a class)


def _focus(trace: Trace, stop: LessonStop, solved: Solved, k: int) -> TensorRef | None:
    """The tensor the debugger selects at step k for this stop: the fact's tensor, or the
    tensor the answer is; None when the stop is about no tensor or it is not there at k."""
    if isinstance(solved.value, Picked) and k == solved.step:
        return solved.value.ref
    if stop.fact.tensor is None or (stop.fact.tensor.startswith("@") and k != solved.step):
        return None
    try:
        return tensor_refs(trace, k, (stop.fact.tensor,))[0]
    except FactError:
        return None


def _url(lesson: Lesson, k: int, ref: TensorRef | None) -> str:
    return Where(lesson.walkthrough, k, tensor=None if ref is None else ref_key(*ref)).url()


def lesson_view(lesson: Lesson, trace: Trace, lang: str, class_code: str | None = None) -> LessonView:
    solved = solved_stops(trace, lesson)
    stops = []
    for i, (stop, s) in enumerate(zip(lesson.stops, solved)):
        at_focus = _focus(trace, stop, s, s.step)
        asked_focus = at_focus if s.asked == s.step else None if stop.ask == Ask.BEFORE else \
            _focus(trace, stop, s, s.asked)
        stops.append(StopView(i, fill(stop.question(lang), s), stop.form.value,
                              tuple(label(o) for o in stop.options), stop.panel,
                              _url(lesson, s.asked, asked_focus), _url(lesson, s.step, at_focus)))
    ids = list(LESSONS)
    after = ids.index(lesson.id) + 1
    nxt = LESSONS[ids[after]] if after < len(ids) else None
    return LessonView(lesson.id, lesson.concept(lang), lesson.title(lang), lesson.intro(lang), lesson.walkthrough,
                      tuple(stops), None if nxt is None else entry(nxt, lang), class_code)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The server's answer to a learner's answer (or to a request for the answer)."""

    lesson: str
    index: int  # the stop
    right: bool
    revealed: bool  # the learner asked for the answer
    unread: bool  # the answer did not read as the form asks
    higher: bool | None  # a wrong number: the answer is higher (True) or lower (False)
    said: str  # what the learner answered, as read
    answer: str | None  # shown when right or revealed
    hint: str | None  # shown when wrong
    explain: str | None  # shown when right or revealed
    form: str
    last: bool  # the lesson's last stop


def verdict(lesson: Lesson, index: int, solved: Solved, judged: Judged | None, lang: str) -> Verdict:
    """The verdict on a stop: `judged` the learner's answer, None when the answer was asked for."""
    stop = lesson.stops[index]
    shown = judged is None or judged.right
    return Verdict(lesson.id, index, judged is not None and judged.right, judged is None,
                   judged is not None and judged.said == "?", None if judged is None else judged.higher,
                   "" if judged is None else judged.said, solved.answer if shown else None,
                   None if shown else fill(stop.hint(lang), solved),
                   fill(stop.explain(lang), solved, answer=True) if shown else None,
                   stop.form.value, index == len(lesson.stops) - 1)
