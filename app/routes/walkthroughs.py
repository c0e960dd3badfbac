"""The walkthrough debugger: /walkthroughs/{name}/steps/{n}, one permalink per step, and the
graph drawn at a step as its own immutable SVG."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from app.deps import PLAYGROUND_OFF, FileHash, Jobs, Programs, Store, Svgs, Threads, Traces
from app.i18n import _
from app.jobs import Pending, QueueFull, busy
from app.programs import ProgramStore
from app.routes.programs import run_url, trace_or_job
from app.store import UploadStore
from app.traces import TraceCache
from app.views.debugger import graph as G
from app.views.debugger.hexview import hexview
from app.views.debugger.kernel import kernel
from app.views.debugger.nav import nav
from app.views.debugger.accountant import accounts
from app.views.debugger.answer import answer_view
from app.views.debugger.buffers import buffers
from app.views.debugger.plan import plan_view
from app.views.debugger.returned import returned
from app.views.debugger.pool import pools
from app.views.debugger.sched import sched_view
from app.views.debugger.steps import search_results, steps_view
from app.views.debugger.source import source
from app.views.debugger.strides import strides
from app.views.debugger.struct import struct
from app.views.debugger.tensors import tensor_list
from app.views.debugger.threads import threads
from app.views.debugger.training import training_view
from app.views.debugger.values import gradient_of, values
from app.views.debugger.where import Where, current_node, selected_tensor, tensor_key
from app.web import client_of, go_to, recording_page, templates
from engine.programs import PROGRAMS
from engine.core.tensor import Tensor
from engine.trace import State, Step, Trace

router = APIRouter()
IMMUTABLE = "public, max-age=31536000, immutable"
Prompt = Annotated[str | None, Query(max_length=400, description="the prompt a model reads")]
Then = Annotated[str | None, Query(pattern=r"^\d{1,7}(,\d{1,7}){0,15}$",
                                   description="token ids appended after the prompt")]


def _kind(request: Request) -> str:
    """Which debugger a request is for: a walkthrough's, or a learner's program's (the same
    routes serve /walkthroughs/<name>/… and /programs/<hash>/…)."""
    return "programs" if request.url.path.startswith("/programs/") else "walkthroughs"


def _where(request: Request, name: str, step: int, *args, **kw) -> Where:
    kind = _kind(request)
    if kind == "programs":
        if any(kw.get(k) for k in ("file", "prompt", "then")):
            raise HTTPException(422, _("a program of yours reads no file and no prompt"))
    else:
        _program(name)
    return Where(name, step, *args, kind=kind, **kw)


def _program(name: str) -> str:
    if name not in PROGRAMS:
        raise HTTPException(404, _("There is no walkthrough named '{name}'. The walkthroughs are: {names}.")
                            .format(name=name, names=", ".join(PROGRAMS)))
    return name


def _prompt(name: str, prompt: str | None) -> str | None:
    """The prompt, blank meaning the program's own."""
    return prompt if prompt and prompt.strip() else None


@router.get("/walkthroughs/{name}")
@router.get("/programs/{name}")
def start(request: Request, name: str, threads: Threads = None, file: FileHash = None, prompt: Prompt = None,
          then: Then = None) -> RedirectResponse:
    return RedirectResponse(_where(request, name, 0, threads, file=file, prompt=_prompt(name, prompt),
                                   then=then).url(), status_code=303)


@router.get("/walkthroughs/{name}/goto")
@router.get("/programs/{name}/goto")
def goto(request: Request, name: str, step: int = 0, threads: Threads = None, file: FileHash = None,
         prompt: Prompt = None, then: Then = None) -> RedirectResponse:
    """The scrubber's form target without JavaScript: go to step n."""
    return RedirectResponse(_where(request, name, step, threads, file=file, prompt=_prompt(name, prompt),
                                   then=then).url(), status_code=303)


def _input_file(store: UploadStore, name: str, file: str | None) -> str | None:
    """The stored GGUF a walkthrough reads, by content hash (checked: gguf-load reads any; a
    model walkthrough the files of the architectures it runs)."""
    if file is None:
        return None
    prog = PROGRAMS[name]
    if not prog.runs:
        readers = ", ".join(p.name for p in PROGRAMS.values() if p.runs)
        raise HTTPException(422, _("'{name}' reads no file; {readers} do.").format(name=name, readers=readers))
    path = store.path(file)
    if path is None:
        raise HTTPException(404, _("No GGUF file with hash {file} is stored; upload it in the GGUF inspector "
                                   "first.").format(file=file))
    if "*" not in prog.runs:
        arch = store.open(file).get("general.architecture")  # the store's parsed file, cached
        if arch not in prog.runs:
            raise HTTPException(422, _("'{name}' runs {archs} models; this file holds a '{arch}' model.").format(
                name=name, archs=", ".join(prog.runs), arch=arch))
    return file


def _trace(cache: TraceCache, store: UploadStore, programs: ProgramStore | None, where: Where,
           client: str) -> Trace:
    """The trace `where` names, a walkthrough's or a learner's program's; when no trace of it is
    kept here it is recorded as a job (Pending, with the recording's page, when that takes more
    than a moment; a program's always runs as a job, in the sandbox)."""
    if not where.is_program:
        key = cache.key(_program(where.name), where.threads, _input_file(store, where.name, where.file),
                        where.prompt, where.then_ids)
        found = cache.trace(key, client)
        if not isinstance(found, Trace):
            raise Pending(where.base + "/recording" + where.query(tensor=None) + f"&step={where.step}")
        return found
    if programs is None:
        raise HTTPException(403, _(PLAYGROUND_OFF))
    found = trace_or_job(programs, cache, where.name, where.threads or 1, client)
    if not isinstance(found, Trace):  # (a shared link, a restarted server: recorded now)
        raise Pending(run_url(where.name, where.threads or 1, where.step))
    return found


def _at(cache: TraceCache, store: UploadStore, where: Where, programs: ProgramStore | None, client: str):
    """The trace, step and rebuilt state `where` names (404 outside the trace, 422 for bad
    threads or inputs, or for a run that stops with an error; 503/429 when no job can record it)."""
    try:
        trace = _trace(cache, store, programs, where, client)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    except QueueFull as e:
        raise busy(e) from None
    if not 0 <= where.step < len(trace.steps):
        raise HTTPException(404, _("'{name}' has steps 0 to {last}; there is no step {step}.").format(
            name=where.name, last=len(trace.steps) - 1, step=where.step))
    return trace, trace.steps[where.step], cache.state(trace, where.step)



def _select(state: State, where: Where, step: Step) -> Tensor | None:
    """The selected tensor; `where` names it from now on if the URL did not."""
    sel = selected_tensor(state, where, step)
    if sel is not None and where.tensor is None:
        where.tensor = tensor_key(sel)
    return sel


def step_model(cache: TraceCache, store: UploadStore, where: Where, expand: str | None = None,
               programs: ProgramStore | None = None, client: str = "?") -> dict[str, Any]:
    """Every panel's view-model at one step."""
    trace, step, state = _at(cache, store, where, programs, client)
    sel = _select(state, where, step)
    shares = threads(trace, step)
    graph = G.graph_view(state, where, current_node(state, step), sel, expand,
                         lambda nodes: sched_view(trace, step, state, nodes))
    return {
        "program": None if where.is_program else PROGRAMS[where.name], "where": where,
        "playground": programs is not None, "step": step, "expand": expand,
        "nav": nav(trace, where), "source": source(trace, step), "returned": returned(trace, step),
        "pools": pools(state, step, where), "accounts": accounts(state), "hex": hexview(step, sel, where.hex),
        "tensors": tensor_list(state, where, sel), "struct": struct(sel, where),
        "strides": strides(sel), "values": values(sel, where),
        "grad": values(gradient_of(state, sel), where),
        "threads": shares, "kernel": kernel(step, state, where, shares.shares), "graph": graph,
        "buffers": buffers(state, step, where), "plan": plan_view(trace, step, state, where),
        "steps": steps_view(trace, where), "answer": answer_view(trace, where),
        "training": training_view(trace),
    }


TensorKey = Query(None, pattern=r"^\d+\.\d+$")
Expand = Query(None, pattern=r"^\d{1,4}$")


@router.get("/walkthroughs/{name}/steps/{n}", response_class=HTMLResponse)
@router.get("/programs/{name}/steps/{n}", response_class=HTMLResponse)
def step_page(request: Request, cache: Traces, store: Store, svgs: Svgs, programs: Programs, name: str, n: int,
              threads: Threads = None, t: str | None = TensorKey, row: int = 0, block: int = 0,
              file: FileHash = None, expand: str | None = Expand,
              hex: str = Query("struct", pattern="^(struct|data)$"), prompt: Prompt = None,
              then: Then = None, ith: int = Query(0, ge=0, le=255)) -> HTMLResponse:
    """The debugger at step n: the page, or for htmx only the debugger's root (the graph's SVG
    is inlined in a page; an htmx swap keeps the one on the page while its key is the same)."""
    where = _where(request, name, n, threads, t, row, block, file, hex, _prompt(name, prompt), then,
                   ith=ith)
    model = step_model(cache, store, where, expand, programs, client_of(request))
    # (htmx restoring history after Back asks for the whole page)
    htmx = request.headers.get("HX-Request") == "true" and "HX-History-Restore-Request" not in request.headers
    graph = model["graph"]
    model["graph_svg"] = svgs(graph.key, lambda: graph.dot) if graph is not None and not htmx else None
    page = "partials/debugger/debugger.html" if htmx else "pages/walkthrough.html"
    response = templates.TemplateResponse(request, page, model)
    response.headers["Vary"] = "HX-Request, HX-History-Restore-Request"
    if htmx:  # the address bar shows the step shown, however it was asked for (keys, the scrubber)
        response.headers["HX-Push-Url"] = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return response


@router.get("/walkthroughs/{name}/steps/{n}/graph/{key}.svg")
@router.get("/programs/{name}/steps/{n}/graph/{key}.svg")
def graph_svg(request: Request, cache: Traces, store: Store, svgs: Svgs, programs: Programs, name: str, n: int,
              key: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")],
              threads: Threads = None, t: str | None = TensorKey, file: FileHash = None,
              expand: str | None = Expand, prompt: Prompt = None, then: Then = None) -> Response:
    """The graph drawn at step n, by its drawing's hash: the same URL always gives the same
    bytes, so browsers keep it. A worker that has not drawn it yet draws it from the step."""
    def dot() -> str:
        where = _where(request, name, n, threads, t, file=file, prompt=_prompt(name, prompt), then=then)
        trace, step, state = _at(cache, store, where, programs, client_of(request))
        graph = G.graph_view(state, where, current_node(state, step),
                             _select(state, where, step), expand,
                             lambda nodes: sched_view(trace, step, state, nodes))
        if graph is None or graph.key != key:
            raise HTTPException(404, _("Step {n} of '{name}' draws no graph with key {key}.").format(
                n=n, name=name, key=key))
        return graph.dot

    return Response(svgs(key, dot), media_type="image/svg+xml",
                    headers={"Cache-Control": IMMUTABLE})


@router.get("/walkthroughs/{name}/recording")
def recording(request: Request, cache: Traces, store: Store, jobs: Jobs, name: str,
                   step: Annotated[int, Query(ge=0)] = 0, threads: Threads = None, file: FileHash = None,
                   prompt: Prompt = None, then: Then = None) -> Response:
    """A walkthrough being recorded (a new prompt, a model file, a long training run): its place
    in the queue or the steps recorded so far; the debugger at `step` once the trace is kept
    (htmx polls this page)."""
    where = _where(request, name, step, threads, file=file, prompt=_prompt(name, prompt), then=then)
    try:
        key = cache.key(name, where.threads, _input_file(store, name, where.file), where.prompt, where.then_ids)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    try:
        found = cache.trace(key, client_of(request), wait=0)  # (a poll waits for nothing)
    except QueueFull as e:
        raise busy(e) from None
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    if isinstance(found, Trace):
        return go_to(request, where.url(step=min(step, len(found.steps) - 1)))
    return recording_page(request, jobs.progress(found), what=name, limits=None, back=None,
                          url=f"{request.url.path}?{request.url.query}")


@router.get("/walkthroughs/{name}/steps/{n}/graph/find")
@router.get("/programs/{name}/steps/{n}/graph/find")
def graph_find(request: Request, cache: Traces, store: Store, programs: Programs, name: str, n: int,
               q: Annotated[str, Query(min_length=1, max_length=200)], threads: Threads = None,
               t: str | None = TensorKey, file: FileHash = None, prompt: Prompt = None,
               then: Then = None) -> JSONResponse:
    """Where the graph's search finds a tensor drawn inside a folded layer: the step's URL with
    that layer opened ({"url": null} when no folded layer holds one)."""
    where = _where(request, name, n, threads, t, file=file, prompt=_prompt(name, prompt), then=then)
    _, _, state = _at(cache, store, where, programs, client_of(request))
    layer = G.find_layer(state, q)
    url = None if layer is None else f"{where.base}/steps/{where.step}" + where.query(expand=layer)
    return JSONResponse({"url": url, "layer": layer})


@router.get("/walkthroughs/{name}/eval-callback.txt")
def eval_callback_dump(cache: Traces, store: Store, name: str, threads: Threads = None,
                       file: FileHash = None, prompt: Prompt = None,
                       then: Then = None) -> Response:
    """Every node the program computes, as llama.cpp's llama-eval-callback prints it: a file to
    compare with a real llama.cpp run (`ggml-lens diff`)."""
    where = Where(name, 0, threads, file=file, prompt=_prompt(name, prompt), then=then)
    try:
        text = cache.eval_dump(cache.key(_program(name), threads, _input_file(store, name, file),
                                         where.prompt, where.then_ids))
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    return Response(text, media_type="text/plain; charset=utf-8", headers={
        "Content-Disposition": f'attachment; filename="{name}-eval-callback.txt"'})


@router.get("/walkthroughs/{name}/search", response_class=HTMLResponse)
@router.get("/programs/{name}/search", response_class=HTMLResponse)
def search_page(request: Request, cache: Traces, store: Store, programs: Programs, name: str,
                q: str = Query("", max_length=200), threads: Threads = None,
                file: FileHash = None, prompt: Prompt = None, then: Then = None) -> HTMLResponse:
    """Steps whose call, note or tensor's name contains q: each a link to its step."""
    where = _where(request, name, 0, threads, None, file=file, prompt=_prompt(name, prompt), then=then)
    trace, _, state = _at(cache, store, where, programs, client_of(request))
    final = cache.state(trace, len(trace.steps) - 1)
    names = {(t.ctx.id, t.offs): t.name for t in final.tensors()}
    results = search_results(trace, where, names, q)
    return templates.TemplateResponse(request, "pages/search.html",
                                      {"where": where, "q": q, "results": results, "n_steps": len(trace.steps)})
