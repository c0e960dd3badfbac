"""The playground: a learner writes or forks a ggml program, runs it in the sandbox and steps
through its trace at /programs/<hash of its text>/steps/<n> (the debugger's routes serve those
too, see walkthroughs.py)."""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from app.deps import PLAYGROUND_OFF, Jobs, Programs, Threads, Traces
from app.i18n import _
from app.jobs import QueueFull, busy
from app.playground import MAX_PROGRAM, ProgramStore
from app.settings import MAX_THREADS
from app.sandbox.check import ProgramRefused, Refusal, check_program
from app.sandbox.run import Limits
from app.traces import TraceCache
from app.views.debugger.where import Where
from app.web import client_of, go_to, recording_page, templates
from engine.programs import PROGRAMS
from engine.trace import Trace

router = APIRouter()

STARTER = '''"""My first ggml program: make a context, two tensors, add them, compute."""

import numpy as np

from engine.ggml import *

# room for three tensors (struct and data), a graph, and ggml's alignment slack
mem_size = 3 * (ggml_tensor_overhead() + 12 * 4) + ggml_graph_overhead() + 1024
ctx = ggml_init(ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=False))

a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 3)
ggml_set_name(a, "a")
set_data(a, np.arange(12, dtype=np.float32).reshape(3, 4))

b = ggml_reshape_2d(ctx, a, 3, 4)  # try 5, 4: ggml's assertion names the rule
c = ggml_add(ctx, b, b)

gf = ggml_new_graph(ctx)
ggml_build_forward_expand(gf, c)
ggml_graph_compute_with_ctx(ctx, gf, n_threads)  # n_threads: the count chosen beside Run
'''


def _on(programs: ProgramStore | None) -> ProgramStore:
    """The program store, or 403 when the playground is off."""
    if programs is None:
        raise HTTPException(403, _(PLAYGROUND_OFF))
    return programs


def _page(request: Request, source: str, threads: int | None, refusal: Refusal | None = None,
          origin: str | None = None, status: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/playground.html", {
        "source": source, "threads": threads or 1, "refusal": refusal, "origin": origin,
        "limits": Limits(), "max_program": MAX_PROGRAM,
        "missing": request.app.state.programs.boundary_missing()}, status_code=status)


@router.get("/playground", response_class=HTMLResponse)
def playground(request: Request, programs: Programs, threads: Threads = None,
               fork: Annotated[str | None, Query(alias="from", pattern=r"^[a-z0-9-]{1,40}$")] = None,
               program: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$")] = None) -> HTMLResponse:
    """The editor: empty but for a starter program, a walkthrough's copy (?from=views-and-permute)
    or a stored program (?program=<hash>). A program that would be refused says so at once."""
    programs = _on(programs)
    source: str | None
    if fork is not None:
        if fork not in PROGRAMS:
            raise HTTPException(404, _("There is no walkthrough named '{name}'.").format(name=fork))
        source = FilePath(PROGRAMS[fork].source_file).read_text(encoding="utf-8")
    elif program is not None:
        source = programs.load(program)
        if source is None:
            raise HTTPException(404, _("No program with hash {name} is stored here.").format(name=program))
    else:
        source = STARTER
    try:
        check_program(source)
        refusal = None
    except ProgramRefused as e:
        refusal = e.refusal
    return _page(request, source, threads, refusal, origin=fork or program)


@router.post("/programs")
def submit(request: Request, programs: Programs, cache: Traces, jobs: Jobs,
           source: Annotated[str, Form(max_length=MAX_PROGRAM)],
           threads: Annotated[int, Form(ge=1, le=MAX_THREADS)] = 1) -> Response:
    """Run: check the program (a refusal or syntax error is shown in the editor at its line),
    keep its text under its hash and queue its recording in the sandbox; the answer comes at
    once: the recording's page, which follows the job and opens the debugger when it is done."""
    programs = _on(programs)
    source = source.replace("\r\n", "\n")
    try:
        check_program(source)
    except ProgramRefused as e:
        return _page(request, source, threads, e.refusal, status=422)
    digest = programs.save(source)
    found = trace_or_job(programs, cache, digest, threads, client_of(request))
    url = _steps_url(found, digest, threads) if isinstance(found, Trace) else run_url(digest, threads)
    return RedirectResponse(url, status_code=303)


@router.get("/programs/{digest}/run")
def run_page(request: Request, programs: Programs, cache: Traces, jobs: Jobs,
             digest: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")], threads: Threads = None,
             step: Annotated[int | None, Query(ge=0)] = None) -> Response:
    """The recording of a stored program: its place in the queue, or how long it has run; the
    debugger once its trace is kept (htmx polls this page)."""
    programs = _on(programs)
    return program_recording(request, programs, cache, jobs, digest, threads or 1, step)


def program_recording(request: Request, programs: ProgramStore, cache: TraceCache, jobs: Jobs,
                      digest: str, threads: int, step: int | None = None) -> Response:
    """The debugger if the program's trace is kept, else its job's page (202)."""
    found = trace_or_job(programs, cache, digest, threads, client_of(request))
    if isinstance(found, Trace):
        return go_to(request, _steps_url(found, digest, threads, step))
    return recording_page(request, jobs.progress(found), what=None, url=run_url(digest, threads, step),
                          limits=programs.limits, back=f"/playground?program={digest}")


def trace_or_job(programs: ProgramStore, cache: TraceCache, digest: str, threads: int,
                 client: str, wait: float = 0) -> Trace | object:
    """The program's trace (kept, or written by another process), or the job recording it in
    the sandbox (queued now if there was none): 503 with Retry-After when the queue is full, 429
    when this client has enough programs queued."""
    def check() -> None:
        missing = programs.boundary_missing()
        if missing is not None:
            raise HTTPException(503, _("Programs cannot run on this server: {why}").format(why=missing))
        if programs.load(digest) is None:
            raise HTTPException(404, _("No program with hash {name} is stored here.").format(name=digest))

    try:
        return cache.trace(cache.program_key(digest, threads), client, wait=wait, check=check)
    except QueueFull as e:
        raise busy(e) from None


def _steps_url(trace: Trace, digest: str, threads: int, step: int | None = None) -> str:
    """Where a recorded program opens: at `step`, else at its last step when it stopped with an
    error, else at step 0."""
    last = len(trace.steps) - 1
    n = min(step, last) if step is not None else last if trace.error else 0
    return Where(digest, n, None if threads == 1 else threads, kind="programs").url()


def run_url(digest: str, threads: int, step: int | None = None) -> str:
    """The recording page of a program's run."""
    return f"/programs/{digest}/run?threads={threads}" + (f"&step={step}" if step is not None else "")

