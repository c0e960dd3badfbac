"""The perplexity page: pick a model of the models folder, a text (the built-in essay or the
learner's own) and -c, optionally a second model for the KL divergence; the run is a job
(app/perplexity_runs.py) whose page shows the chunks scored so far, then llama-perplexity's lines
and a heat map of the text.

GET /perplexity is the form; POST /perplexity keeps a learner's text and sends the browser to the
run's own URL (GET /perplexity/run?model=…&text=…&c=…), which queues the run if this process
does not have it and polls itself (htmx) until it is done.
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, Response

from app.i18n import N_, _
from app.jobs import QueueFull
from app.perplexity_runs import BUILTIN, DEFAULT_CTX, PerplexityRuns, RunRefused, RunSpec
from app.views.perplexity import form_view, progress_view, result_view
from app.web import client_of, go_to, templates

router = APIRouter()
_made = threading.Lock()
FIRST_WAIT = 0.3  # seconds a run's first request waits, so a quick failure shows at once


def get_runs(request: Request) -> PerplexityRuns:
    """The app's perplexity runs (made on first use: their queue's thread starts then)."""
    state = request.app.state
    with _made:
        if getattr(state, "perplexity", None) is None:
            state.perplexity = PerplexityRuns(state.store,
                                              state.settings.data_dir / "perplexity-texts")
    return state.perplexity


Runs = Annotated[PerplexityRuns, Depends(get_runs)]


def _form(request: Request, runs: PerplexityRuns, status: int = 200, **args) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/perplexity.html",
                                      {"view": form_view(runs, **args)}, status_code=status)


@router.get("/perplexity", response_class=HTMLResponse)
def perplexity_form(request: Request, runs: Runs, model: str = "", kld: str = "",
                    c: int = DEFAULT_CTX, chunks: int = -1) -> HTMLResponse:
    spec = RunSpec(model, BUILTIN, c, chunks, kld) if model else None
    return _form(request, runs, spec=spec)


@router.post("/perplexity", response_class=HTMLResponse)
def perplexity_start(request: Request, runs: Runs, model: Annotated[str, Form()],
                     c: Annotated[int, Form()] = DEFAULT_CTX,
                     chunks: Annotated[str, Form()] = "", kld: Annotated[str, Form()] = "",
                     source: Annotated[str, Form()] = BUILTIN,
                     text: Annotated[str, Form()] = "") -> Response:
    own = source == "own"
    spec = RunSpec(model, BUILTIN, c, -1, kld)
    try:
        n = chunks.strip()
        if n and not n.lstrip("-").isdigit():
            raise RunRefused(NOT_A_NUMBER, n=n)
        spec = RunSpec(model, runs.save_text(text) if own else BUILTIN, c,
                       int(n) if n else -1, kld)
        runs.check(spec)
    except RunRefused as e:
        return _form(request, runs, e.status, spec=spec, text=text, own=own, error=str(e))
    return go_to(request, spec.url)


@router.get("/perplexity/run", response_class=HTMLResponse)
def perplexity_run(request: Request, runs: Runs, model: Annotated[str, Query(max_length=300)],
                   text: Annotated[str, Query(max_length=64)] = BUILTIN,
                   c: int = DEFAULT_CTX, chunks: int = -1,
                   kld: Annotated[str, Query(max_length=300)] = "") -> HTMLResponse:
    spec = RunSpec(model, text, c, chunks, kld)
    try:
        runs.check(spec)
    except RunRefused as e:
        raise HTTPException(e.status, str(e)) from None
    try:
        status = runs.status(spec, client_of(request))
        if status.run is None and status.error is None and runs.wait(spec, FIRST_WAIT):
            status = runs.status(spec, client_of(request))
    except QueueFull as e:
        message = RUN_WAITING if e.client else RUNS_BUSY
        raise HTTPException(429 if e.client else 503, _(message).format(n=e.retry_after),
                            headers={"Retry-After": str(e.retry_after)}) from None
    ctx: dict = {"spec": spec, "error": status.error}
    if status.run is not None:
        ctx["result"] = result_view(spec, status.run)
    elif status.error is None:
        ctx["progress"] = progress_view(status)
    polled = request.headers.get("HX-Request") == "true"  # (htmx swaps no 4xx: a poll ends on 200)
    code = 202 if "progress" in ctx else (422 if status.error and not polled else 200)
    return templates.TemplateResponse(request, "pages/perplexity_run.html", ctx,
                                      status_code=code)


NOT_A_NUMBER = N_("--chunks must be a whole number (got {n}).")
RUN_WAITING = N_("You already have a perplexity run queued or running; open it again when it "
                 "has finished (in about {n} s).")
RUNS_BUSY = N_("The perplexity runs are all taken; try again in {n} s.")
