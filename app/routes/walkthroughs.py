"""The debugger: /walkthroughs/{name}/steps/{n}, one permalink per step, and the graph drawn at a
step as its own immutable SVG. The same routes serve a learner's program's trace at
/programs/{hash}/…: the path's first segment is the route's `kind` parameter, and one dependency
reads a route's parameters into its `Where`."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path as FilePath
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.convertors import Convertor, register_url_convertor

from app.deps import PLAYGROUND_OFF, FileHash, Jobs, Programs, Store, Svgs, Threads, Traces
from app.i18n import _
from app.jobs import Pending, QueueFull, busy
from app.playground import ProgramStore
from app.routes.playground import run_url, trace_or_job
from app.sandbox.template import TemplatesBusy
from app.store import HeaderOnly, UploadStore
from app.traces import Recipe, TraceCache
from app.views.debugger import graph as G
from app.views.debugger.chat import MESSAGE_CHARS, SYSTEM_CHARS, chat_prompt
from app.views.debugger.panels import LAYOUT, At, shown_tabs, view_models
from app.views.debugger.sched import sched_view
from app.views.debugger.steps import search_results
from app.views.debugger.tensors import tensor_list
from app.views.debugger.where import Where, current_node, selected_tensor, tensor_key
from app.web import client_of, go_to, recording_page, templates
from engine.programs import PROGRAMS
from engine.programs.settings import read_settings
from engine.core.tensor import Tensor
from engine.trace import State, Step, Trace

router = APIRouter()
IMMUTABLE = "public, max-age=31536000, immutable"
PROMPT_CHARS = 400
# (a form sends each line break as two characters, CRLF: the limit is checked on the text read)
Prompt = Annotated[str | None, Query(max_length=2 * PROMPT_CHARS, description="the prompt a model reads")]
Then = Annotated[str | None, Query(pattern=r"^\d{1,7}(,\d{1,7}){0,15}$",
                                   description="token ids appended after the prompt")]
TensorKey = Annotated[str | None, Query(pattern=r"^\d+\.\d+$", description="the selected tensor")]
Expand = Annotated[str | None, Query(pattern=r"^\d{1,4}$", description="a folded layer drawn in full")]
ListPage = Annotated[int | None, Query(ge=0, le=100_000, description="the page of the tensor list shown")]
ListFilter = Annotated[str, Query(max_length=200, description="the tensor list's filter: part of a name")]


def _flag(description: str):
    """A query parameter holding one of llama.cpp's settings of a model walkthrough, under
    llama-cli's flag (engine/programs/settings.py): a short word."""
    return Query(max_length=16, pattern=r"^[A-Za-z0-9_+-]*$", description=description)


FlashAttn = Annotated[str | None, _flag("-fa: flash attention, on|off|auto")]
CacheK = Annotated[str | None, _flag("-ctk: the K cache's type (f16, q8_0...)")]
CacheV = Annotated[str | None, _flag("-ctv: the V cache's type (quantized only with -fa)")]
NoRepack = Annotated[str | None, _flag("-nr: 1 leaves the weights unrepacked")]
UBatch = Annotated[str | None, _flag("-ub: the most tokens one graph computes")]
NCtx = Annotated[str | None, _flag("-c: the cells the KV cache holds")]


class _Kind(Convertor):
    """A debugger path's first segment, the route's `kind`: whose trace it shows. No other first
    segment matches the debugger's routes."""

    regex = "walkthroughs|programs"

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


register_url_convertor("debugger", _Kind())
DEBUGGER = "/{kind:debugger}/{name}"  # /walkthroughs/<name>, or /programs/<hash of a learner's program>


# --- a route's Where, from its parameters -------------------------------------------------------

def _inputs(name: str, threads: Threads = None, file: FileHash = None, prompt: Prompt = None,
            then: Then = None, fa: FlashAttn = None, ctk: CacheK = None, ctv: CacheV = None,
            nr: NoRepack = None, ub: UBatch = None, c: NCtx = None) -> Where:
    """The trace a URL names, at step 0 (a blank prompt is the program's own; a form sends a
    textarea's line breaks as CRLF, read as the newlines they were typed as; llama.cpp's
    settings as llama-cli reads them, a default one left out)."""
    if prompt is not None:
        prompt = prompt.replace("\r\n", "\n") if prompt.strip() else None
    if prompt is not None and len(prompt) > PROMPT_CHARS:
        raise HTTPException(422, _("A prompt holds at most {limit} characters; this one has {n}.").format(
            limit=PROMPT_CHARS, n=len(prompt)))
    given = dict(flash_attn=fa, type_k=ctk, type_v=ctv, no_repack=nr, n_ubatch=ub, n_ctx=c)
    prog = PROGRAMS.get(name)
    try:
        settings = read_settings(name, prog.settings if prog else (), given)
    except ValueError as e:  # (ParamsError: llama-cli's words)
        raise HTTPException(422, _("llama.cpp's settings: {why}").format(why=e)) from None
    return Where(name, 0, threads, file=file, prompt=prompt, then=then, settings=settings)


def _walkthrough(where: Annotated[Where, Depends(_inputs)]) -> Where:
    """A walkthrough's trace (404 for an unknown name)."""
    _program(where.name)
    return where


def _debugger(kind: Literal["walkthroughs", "programs"], where: Annotated[Where, Depends(_inputs)]) -> Where:
    """A walkthrough's or a learner's program's trace, as the route's kind says."""
    if kind == "walkthroughs":
        return _walkthrough(where)
    if where.file or where.prompt or where.then or where.settings:
        raise HTTPException(422, _("a program of yours reads no file and no prompt"))
    return replace(where, kind=kind)


def _at_step(where: Annotated[Where, Depends(_debugger)], n: int, t: TensorKey = None, row: int = 0,
             block: int = 0, bytes_view: Annotated[str, Query(alias="hex", pattern="^(struct|data)$")] = "struct",
             ith: Annotated[int, Query(ge=0, le=255)] = 0) -> Where:
    """Step n of the trace, with what its panels show: the selected tensor, the quantized row and
    block, the Bytes panel's view, the thread whose share the kernel panel shows."""
    return replace(where, step=n, tensor=t, row=row, block=block, hex=bytes_view, ith=ith)


Walkthrough = Annotated[Where, Depends(_walkthrough)]
Debugger = Annotated[Where, Depends(_debugger)]
AtStep = Annotated[Where, Depends(_at_step)]


def _program(name: str) -> str:
    if name not in PROGRAMS:
        raise HTTPException(404, _("There is no walkthrough named '{name}'. The walkthroughs are: {names}.")
                            .format(name=name, names=", ".join(PROGRAMS)))
    return name


@router.get(DEBUGGER)
def start(where: Debugger) -> RedirectResponse:
    return RedirectResponse(where.url(), status_code=303)


@router.get(DEBUGGER + "/goto")
def goto(request: Request, where: Debugger, cache: Traces, store: Store, programs: Programs,
         step: Annotated[int, Query(ge=0)] = 0) -> RedirectResponse:
    """Step n, or the last step of a trace that has fewer: where a control that makes another
    trace keeps the learner's place (the thread count, a prompt, "append"), and the scrubber's
    form without JavaScript. A trace not kept yet is recorded first (its recording page ends at
    the same step)."""
    trace = _loaded(cache, store, replace(where, step=step), programs, client_of(request))
    return RedirectResponse(where.url(step=min(step, len(trace.steps) - 1)), status_code=303)


def _input_file(store: UploadStore, name: str, file: str | None) -> str | None:
    """The stored GGUF a walkthrough reads, by content hash (checked: gguf-load reads any whole
    file, never a header-only upload's holes; a model walkthrough the files of the architectures
    it runs)."""
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
    if not store.whole(file):
        raise HTTPException(422, str(HeaderOnly(store.upload_limit)))
    if "*" not in prog.runs:
        reader = store.open(file)  # the store's parsed file, cached (there: its path was found)
        arch = reader.get("general.architecture") if reader is not None else None
        if arch not in prog.runs:
            raise HTTPException(422, _("'{name}' runs {archs} models; this file holds a '{arch}' model.").format(
                name=name, archs=", ".join(prog.runs), arch=arch))
    return file


def _recipe(cache: TraceCache, store: UploadStore, where: Where) -> Recipe:
    """The recipe of the walkthrough's trace `where` names (ValueError for bad threads or inputs)."""
    return cache.key(_program(where.name), where.threads, _input_file(store, where.name, where.file),
                     where.prompt, where.then_ids, where.settings)


def _trace(cache: TraceCache, store: UploadStore, programs: ProgramStore | None, where: Where,
           client: str) -> Trace:
    """The trace `where` names, a walkthrough's or a learner's program's; when no trace of it is
    kept here it is recorded as a job (Pending, with the recording's page, when that takes more
    than a moment; a program's always runs as a job, in the sandbox)."""
    if not where.is_program:
        found = cache.trace(_recipe(cache, store, where), client)
        if not isinstance(found, Trace):
            raise Pending(where.base + "/recording" + where.query(tensor=None) + f"&step={where.step}")
        return found
    if programs is None:
        raise HTTPException(403, _(PLAYGROUND_OFF))
    found = trace_or_job(programs, cache, where.name, where.threads or 1, client)
    if not isinstance(found, Trace):  # (a shared link, a restarted server: recorded now)
        raise Pending(run_url(where.name, where.threads or 1, where.step))
    return found


def _loaded(cache: TraceCache, store: UploadStore, where: Where, programs: ProgramStore | None,
            client: str) -> Trace:
    """The trace `where` names (422 for bad threads or inputs, or for a run that stops with an
    error; 503/429 when no job can record it)."""
    try:
        return _trace(cache, store, programs, where, client)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    except QueueFull as e:
        raise busy(e) from None


def _at(cache: TraceCache, store: UploadStore, where: Where, programs: ProgramStore | None, client: str):
    """The trace, step and rebuilt state `where` names (404 outside the trace, and _loaded's
    errors)."""
    trace = _loaded(cache, store, where, programs, client)
    if not 0 <= where.step < len(trace.steps):
        raise HTTPException(404, _("'{name}' has steps 0 to {last}; there is no step {step}.").format(
            name=where.name, last=len(trace.steps) - 1, step=where.step))
    return trace, trace.steps[where.step], cache.state(trace, where.step)


# --- the debugger at a step and its graph, from a route's parameters ------------------------------

@dataclass(frozen=True, slots=True)
class Stop:
    """The debugger at one step: the trace, the step, the state rebuilt after it, the selected
    tensor, and `where`, which names that tensor from now on when the URL did not."""

    where: Where
    trace: Trace
    step: Step
    state: State
    selected: Tensor | None


def _stop(request: Request, where: AtStep, cache: Traces, store: Store, programs: Programs) -> Stop:
    """The step `where` names, loaded (recorded first if need be), its tensor selected."""
    trace, step, state = _at(cache, store, where, programs, client_of(request))
    sel = selected_tensor(state, where, step)
    if sel is not None and where.tensor is None:
        where = replace(where, tensor=tensor_key(sel))
    return Stop(where, trace, step, state, sel)


def _graph(stop: Annotated[Stop, Depends(_stop)], expand: Expand = None) -> G.GraphView | None:
    """The step's newest graph, drawn with the layer `expand` open."""
    return G.graph_view(stop.state, stop.where, current_node(stop.state, stop.step), stop.selected, expand,
                        lambda g: sched_view(stop.trace, stop.step, stop.state, g),
                        G.made_in(stop.trace.steps))


AtStop = Annotated[Stop, Depends(_stop)]
Graph = Annotated[G.GraphView | None, Depends(_graph)]


def step_model(stop: Stop, graph: G.GraphView | None, playground: bool, tp: int | None = None,
               tq: str = "", path: FilePath | None = None) -> dict[str, Any]:
    """Every panel's view-model at one step, as the panel table builds them
    (app/views/debugger/panels.py), with the layout and the tabs shown (`tp`, `tq`: the tensor
    list's page and filter; `path`: the file the walkthrough reads, for its chat template)."""
    where = stop.where
    models = view_models(At(where, stop.trace, stop.step, stop.state, stop.selected, graph, path, tp, tq))
    return {"program": None if where.is_program else PROGRAMS[where.name], "where": where,
            "playground": playground, "step": stop.step, "layout": LAYOUT,
            "tabs": shown_tabs(models), **models}


# --- the routes -------------------------------------------------------------------------------

@router.get(DEBUGGER + "/steps/{n}", response_class=HTMLResponse)
def step_page(request: Request, stop: AtStop, graph: Graph, svgs: Svgs, programs: Programs,
              cache: Traces, store: Store, tp: ListPage = None, tq: ListFilter = "") -> HTMLResponse:
    """The debugger at step n: the page, or for htmx only the debugger's root (the graph's SVG
    is inlined in a page when it is drawn already or quick to draw, else the page loads it; an
    htmx swap keeps the one on the page while its key is the same)."""
    where = stop.where
    path = None if where.is_program else cache.input_path(_recipe(cache, store, where))
    model = step_model(stop, graph, programs is not None, tp, tq, path)
    # the file it reads, named (an upload is stored under its hash: shortened)
    if path is not None and where.file is not None and path.name.startswith(where.file):  # uploaded
        model["input_name"] = f"{where.file[:12]}….gguf"
    else:
        model["input_name"] = path.name if path else None
    # (htmx restoring history after Back asks for the whole page)
    htmx = request.headers.get("HX-Request") == "true" and "HX-History-Restore-Request" not in request.headers
    model["graph_svg"] = None
    if graph is not None and not htmx:  # a big graph's first drawing (seconds of graphviz) follows the page
        try:
            model["graph_svg"] = svgs.drawn(graph.key) or (
                svgs(graph.key, lambda: graph.dot) if graph.n_nodes <= G.FOLD_OVER else None)
        except G.NotDrawnInTime:
            pass  # the page asks for it, and says so if it fails again
    page = "partials/debugger/debugger.html" if htmx else "pages/walkthrough.html"
    response = templates.TemplateResponse(request, page, model)
    response.headers["Vary"] = "HX-Request, HX-History-Restore-Request"
    if htmx:  # the address bar shows the step shown, however it was asked for (keys, the scrubber)
        response.headers["HX-Push-Url"] = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return response


@router.get("/walkthroughs/{name}/chat")
def chat(where: Walkthrough, cache: Traces, store: Store,
         message: Annotated[str, Query(min_length=1, max_length=MESSAGE_CHARS)],
         system: Annotated[str, Query(max_length=SYSTEM_CHARS)] = "") -> RedirectResponse:
    """The Chat tab's form: the conversation rendered by the file's chat template becomes the
    walkthrough's prompt (422 when the file stores none, the template fails or breaks a limit,
    or the prompt is too long; 503 when every template worker is busy)."""
    try:
        path = cache.input_path(_recipe(cache, store, where))
        if path is None:
            raise ValueError(_("'{name}' reads no model file").format(name=where.name))
        prompt = chat_prompt(path, message, system)
    except ValueError as e:  # (ModelError and TemplateRefused too)
        raise HTTPException(422, str(e)) from None
    except TemplatesBusy:
        raise HTTPException(503, _("Every chat template worker is busy; send the message again in a "
                                   "moment."), headers={"Retry-After": "2"}) from None
    if len(prompt) > PROMPT_CHARS:
        raise HTTPException(422, _("The conversation renders to {n} characters; a prompt holds {limit}.").format(
            n=len(prompt), limit=PROMPT_CHARS))
    return RedirectResponse(replace(where, prompt=prompt, then=None).url(), status_code=303)


@router.get(DEBUGGER + "/steps/{n}/tensors", response_class=HTMLResponse)
def tensors_part(request: Request, stop: AtStop, tp: ListPage = None, tq: ListFilter = "") -> HTMLResponse:
    """The tensors panel alone at step n: a page of the list, or the tensors a filter finds
    (htmx swaps it in; the page's own links carry tp and tq without JavaScript)."""
    return templates.TemplateResponse(request, "partials/debugger/tensors.html", {
        "where": stop.where, "tensors": tensor_list(stop.state, stop.where, stop.selected, tp, tq)})


@router.get(DEBUGGER + "/steps/{n}/graph/{key}.svg")
def graph_svg(request: Request, where: AtStep, key: Annotated[str, Path(pattern=r"^[0-9a-f]{16}$")],
              cache: Traces, store: Store, svgs: Svgs, programs: Programs, expand: Expand = None) -> Response:
    """The graph drawn at step n, by its drawing's hash: the same URL always gives the same
    bytes, so browsers keep it. A worker that has not drawn it yet draws it from the step; one
    graphviz did not finish in time is a 503 with the message, kept by no one (asked again, it
    may finish)."""
    def dot() -> str:
        graph = _graph(_stop(request, where, cache, store, programs), expand)
        if graph is None or graph.key != key:
            raise HTTPException(404, _("Step {n} of '{name}' draws no graph with key {key}.").format(
                n=where.step, name=where.name, key=key))
        return graph.dot

    try:
        return Response(svgs(key, dot), media_type="image/svg+xml", headers={"Cache-Control": IMMUTABLE})
    except G.NotDrawnInTime as e:
        return Response(e.svg, status_code=503, media_type="image/svg+xml",
                        headers={"Cache-Control": "no-store"})


@router.get(DEBUGGER + "/steps/{n}/graph/find")
def graph_find(request: Request, where: AtStep, cache: Traces, store: Store, programs: Programs,
               q: Annotated[str, Query(min_length=1, max_length=200)]) -> JSONResponse:
    """Where the graph's search finds a tensor drawn inside a folded layer: the step's URL with
    that layer opened ({"url": null} when no folded layer holds one)."""
    trace, _, state = _at(cache, store, where, programs, client_of(request))
    layer = G.find_layer(state, q, G.made_in(trace.steps))
    url = None if layer is None else f"{where.base}/steps/{where.step}" + where.query(expand=layer)
    return JSONResponse({"url": url, "layer": layer})


@router.get(DEBUGGER + "/search", response_class=HTMLResponse)
def search_page(request: Request, where: Debugger, cache: Traces, store: Store, programs: Programs,
                q: str = Query("", max_length=200)) -> HTMLResponse:
    """Steps whose call, note or tensor's name contains q: each a link to its step."""
    trace, _, state = _at(cache, store, where, programs, client_of(request))
    final = cache.state(trace, len(trace.steps) - 1)
    names = {(t.ctx.id, t.offs): t.name for t in final.tensors()}
    results = search_results(trace, where, names, q)
    return templates.TemplateResponse(request, "pages/search.html",
                                      {"where": where, "q": q, "results": results, "n_steps": len(trace.steps)})


@router.get("/walkthroughs/{name}/recording")
def recording(request: Request, where: Walkthrough, cache: Traces, store: Store, jobs: Jobs,
              step: Annotated[int, Query(ge=0)] = 0) -> Response:
    """A walkthrough being recorded (a new prompt, a model file, a long training run): its place
    in the queue or the steps recorded so far; the debugger at `step` once the trace is kept
    (htmx polls this page)."""
    try:
        key = _recipe(cache, store, where)
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
    return recording_page(request, jobs.progress(found), what=where.name, limits=None, back=None,
                          url=f"{request.url.path}?{request.url.query}")


@router.get("/walkthroughs/{name}/eval-callback.txt")
def eval_callback_dump(request: Request, where: Walkthrough, cache: Traces, store: Store,
                       jobs: Jobs) -> Response:
    """Every node the program computes, as llama.cpp's llama-eval-callback prints it: a file to
    compare with a real llama.cpp run (`ggml-lens diff`). It is made as a job of the queue, as
    a recording is (asked twice, made once; 429/503 when there is no room): the file when it is
    made within a moment, else its page (202), which polls this URL; a poll waits for nothing
    and, once the file is made, is answered with a link to it."""
    from app.traces import Dump

    poll = request.headers.get("HX-Request") == "true"
    try:
        found = cache.dump(Dump(_recipe(cache, store, where)), client_of(request), wait=0 if poll else None)
    except QueueFull as e:
        raise busy(e) from None
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    filename = f"{where.name}-eval-callback.txt"
    if isinstance(found, str) and not poll:
        return Response(found, media_type="text/plain; charset=utf-8", headers={
            "Content-Disposition": f'attachment; filename="{filename}"'})
    progress = None if isinstance(found, str) else jobs.progress(found)
    return templates.TemplateResponse(request, "pages/dump.html", {
        "name": where.name, "filename": filename, "progress": progress, "back": where.url(),
        "url": request.url.path + (f"?{request.url.query}" if request.url.query else "")},
        status_code=200 if progress is None else 202)
