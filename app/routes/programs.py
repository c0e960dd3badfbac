"""The playground: a learner writes or forks a ggml program, runs it in the sandbox and steps
through its trace at /programs/<hash of its text>/steps/<n> (the debugger's routes serve those
too, see walkthroughs.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.deps import PLAYGROUND_OFF, Programs, Threads, Traces
from app.i18n import _
from app.programs import MAX_PROGRAM, ProgramsBusy
from app.settings import MAX_THREADS
from app.sandbox.check import ProgramRefused, Refusal, check_program
from app.sandbox.run import Limits
from app.views.debugger.where import Where
from app.web import templates
from engine.programs import PROGRAMS

router = APIRouter()

STARTER = '''"""My first ggml program: make a context, two tensors, add them, compute."""

import numpy as np

from engine.ggml import *


def run(n_threads: int = 1) -> dict:
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
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"c": c}
'''


def _on(programs) -> None:
    if programs is None:
        raise HTTPException(403, _(PLAYGROUND_OFF))


def _page(request: Request, source: str, threads: int | None, refusal: Refusal | None = None,
          origin: str | None = None, status: int = 200) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/playground.html", {
        "source": source, "threads": threads or 1, "refusal": refusal, "origin": origin,
        "limits": Limits(), "max_program": MAX_PROGRAM}, status_code=status)


@router.get("/playground", response_class=HTMLResponse)
def playground(request: Request, programs: Programs, threads: Threads = None,
               fork: Annotated[str | None, Query(alias="from", pattern=r"^[a-z0-9-]{1,40}$")] = None,
               program: Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$")] = None) -> HTMLResponse:
    """The editor: empty but for a starter program, a walkthrough's copy (?from=views-and-permute)
    or a stored program (?program=<hash>). A program that would be refused says so at once."""
    _on(programs)
    if fork is not None:
        if fork not in PROGRAMS:
            raise HTTPException(404, _("There is no walkthrough named '{name}'.").format(name=fork))
        source = Path(PROGRAMS[fork].source_file).read_text(encoding="utf-8")
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
def submit(request: Request, programs: Programs, cache: Traces,
           source: Annotated[str, Form(max_length=MAX_PROGRAM)],
           threads: Annotated[int, Form(ge=1, le=MAX_THREADS)] = 1) -> HTMLResponse:
    """Run: check the program (a refusal or syntax error is shown in the editor at its line),
    keep its text under its hash, record it in the sandbox, and open the debugger (at the last
    step when the program stopped with an error)."""
    _on(programs)
    source = source.replace("\r\n", "\n")
    try:
        check_program(source)
    except ProgramRefused as e:
        return _page(request, source, threads, e.refusal, status=422)
    digest = programs.save(source)
    try:
        trace = cache.program(digest, threads, lambda n: programs.record(source, n))
    except ProgramsBusy as e:
        raise HTTPException(503, str(e)) from None
    step = len(trace.steps) - 1 if trace.error else 0
    where = Where(digest, step, None if threads == 1 else threads, kind="programs")
    return RedirectResponse(where.url(), status_code=303)

