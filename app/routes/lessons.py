"""Lessons: the map of concepts (/lessons), a lesson's stops on its walkthrough (/lessons/<id>),
the server's verdict on each answer, and a class's tally for the teacher
(/lessons/<id>/classes/<code>).

The answer to every question is read from the walkthrough's recorded trace (app/lessons/): the
pages carry the questions and the steps to show, and the verdict, the hint and the answer come
from here. A learner's progress is kept by the browser (static/lessons.js), so a lesson link
opens at the learner's place without an account.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app import i18n
from app.deps import Jobs, Traces
from app.i18n import _
from app.jobs import QueueFull, busy
from app.lessons import LESSONS, Lesson
from app.lessons.answers import judge
from app.lessons.facts import FactError
from app.lessons.tally import MemoryTally, RedisTally, Tally
from app.lessons.views import lesson_map, lesson_view, solved_stops, verdict
from app.traces import TraceCache
from app.web import client_of, go_to, recording_page, templates
from engine.trace import Trace

router = APIRouter()
ANSWER_WAIT = 30.0  # s a verdict waits for the walkthrough's trace (recorded again after an eviction)
LessonId = Annotated[str, Path(pattern=r"^[a-z0-9-]{1,64}$")]
ClassCode = Annotated[str, Path(pattern=r"^[0-9a-f]{8}$")]
InClass = Annotated[str | None, Query(alias="class", pattern=r"^[0-9a-f]{8}$", description="a class's code")]
Learner = Annotated[str, Form(pattern=r"^[0-9a-zA-Z-]{0,64}$", description="the browser's anonymous id")]


def _lesson(lesson_id: str) -> Lesson:
    lesson = LESSONS.get(lesson_id)
    if lesson is None:
        raise HTTPException(404, _("There is no lesson named '{name}'. The lessons are: {names}.").format(
            name=lesson_id, names=", ".join(LESSONS)))
    return lesson


def tally_of(request: Request) -> Tally | None:
    """Where this server counts a class's answers: the classroom's Redis, else this process's
    memory when it is the only one (None: several processes and no Redis)."""
    state = request.app.state
    if not hasattr(state, "lesson_tally"):
        settings = state.settings
        state.lesson_tally = RedisTally(settings.queue) if settings.queue else \
            None if settings.shares_traces else MemoryTally()
    return state.lesson_tally


def _trace(request: Request, cache: TraceCache, lesson: Lesson, wait: float | None = None) -> Trace | object:
    """The trace of the lesson's walkthrough, or the job recording it (when it takes longer)."""
    try:
        return cache.trace(cache.key(lesson.walkthrough, None), client_of(request), wait=wait)
    except QueueFull as e:
        raise busy(e) from None
    except ValueError as e:
        raise HTTPException(422, str(e)) from None


def _class(request: Request, lesson: Lesson, code: str | None) -> str | None:
    """A class's code, checked: it names a class of this lesson (404 otherwise)."""
    if code is None:
        return None
    tally = tally_of(request)
    if tally is None or tally.lesson_of(code) != lesson.id:
        raise HTTPException(404, _("There is no class {code} for the lesson '{name}'.").format(
            code=code, name=lesson.id))
    return code


@router.get("/lessons", response_class=HTMLResponse)
def lessons_page(request: Request) -> HTMLResponse:
    """The map of concepts: every lesson in order; the browser marks what the learner has done."""
    return templates.TemplateResponse(request, "pages/lessons.html", {"lessons": lesson_map(i18n.current())})


@router.get("/lessons/{lesson_id}", response_class=HTMLResponse)
def lesson_page(request: Request, lesson_id: LessonId, cache: Traces, jobs: Jobs,
                class_code: InClass = None) -> Response:
    """A lesson: its stops in order, each with the debugger at its step (loaded by the page at
    the learner's place). While its walkthrough is recorded, the recording's page."""
    lesson = _lesson(lesson_id)
    code = _class(request, lesson, class_code)
    url = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    found = _trace(request, cache, lesson, wait=0 if request.headers.get("HX-Request") == "true" else None)
    if not isinstance(found, Trace):
        return recording_page(request, jobs.progress(found), what=lesson.walkthrough, limits=None, back=None,
                              url=url)
    if request.headers.get("HX-Request") == "true":  # (the recording page's poll: the trace is kept)
        return go_to(request, url)
    try:
        view = lesson_view(lesson, found, i18n.current(), code)
    except FactError as e:
        raise HTTPException(500, _("The lesson '{name}' no longer matches its walkthrough: {why}").format(
            name=lesson.id, why=e)) from None
    return templates.TemplateResponse(request, "pages/lesson.html", {"lesson": view})


@router.post("/lessons/{lesson_id}/stops/{index}", response_class=HTMLResponse)
def answer_stop(request: Request, lesson_id: LessonId, index: Annotated[int, Path(ge=0, le=99)], cache: Traces,
                answer: Annotated[str, Form(max_length=200)] = "", reveal: Annotated[bool, Form()] = False,
                class_code: Annotated[str | None, Form(alias="class", pattern=r"^([0-9a-f]{8})?$")] = None,
                learner: Learner = "") -> HTMLResponse:
    """The verdict on an answer to stop `index`: right (the explanation, the next stop), or wrong
    (the hint first; the answer when `reveal` asks for it). In a class, a learner's first
    answer is counted for the teacher."""
    lesson = _lesson(lesson_id)
    if index >= len(lesson.stops):
        raise HTTPException(404, _("The lesson '{name}' has stops 1 to {n}.").format(name=lesson.id,
                                                                                      n=len(lesson.stops)))
    found = _trace(request, cache, lesson, wait=ANSWER_WAIT)
    if not isinstance(found, Trace):
        raise HTTPException(503, _("The walkthrough is still being recorded; answer again in a moment."),
                            headers={"Retry-After": "5"})
    solved = solved_stops(found, lesson)[index]
    judged = None if reveal else judge(lesson.stops[index], solved, answer)
    code = _class(request, lesson, class_code or None)
    if code is not None and judged is not None and learner:
        tally = tally_of(request)
        assert tally is not None  # _class found the class in it
        tally.count(code, index, learner, judged.said, judged.right)
    return templates.TemplateResponse(request, "partials/lessons/verdict.html", {
        "v": verdict(lesson, index, solved, judged, i18n.current())})


@router.post("/lessons/{lesson_id}/classes")
def open_class(request: Request, lesson_id: LessonId) -> RedirectResponse:
    """A teacher makes a class for the lesson: its code names the learners' link and the tally."""
    lesson = _lesson(lesson_id)
    tally = tally_of(request)
    if tally is None:
        raise HTTPException(409, _("This server runs several processes without a shared Redis, so it keeps no "
                                   "class's answers: serve a class with `ggml-lens serve --queue redis://…`."))
    return RedirectResponse(f"/lessons/{lesson.id}/classes/{tally.open_class(lesson.id)}", status_code=303)


@router.get("/lessons/{lesson_id}/classes/{code}", response_class=HTMLResponse)
def teacher_page(request: Request, lesson_id: LessonId, code: ClassCode, cache: Traces) -> HTMLResponse:
    """The teacher's view of a class: the learners' link, and per stop how many answered, how
    many were right, and the spread of their first answers (the page refreshes itself)."""
    lesson = _lesson(lesson_id)
    _class(request, lesson, code)
    found = _trace(request, cache, lesson, wait=ANSWER_WAIT)
    if not isinstance(found, Trace):
        raise HTTPException(503, _("The walkthrough is still being recorded; reload in a moment."),
                            headers={"Retry-After": "5"})
    lang = i18n.current()
    view = lesson_view(lesson, found, lang, code)
    solved = solved_stops(found, lesson)
    tally = tally_of(request)
    assert tally is not None  # _class found the class in it
    tallies = tally.stops(code, len(lesson.stops))
    rows = [(s, solved[s.index].answer, t, max((n for _a, n in t.answers), default=0))
            for s, t in zip(view.stops, tallies)]
    link = str(request.base_url).rstrip("/") + f"/lessons/{lesson.id}?class={code}"
    return templates.TemplateResponse(request, "pages/teacher.html", {
        "lesson": view, "rows": rows, "link": link, "code": code})
