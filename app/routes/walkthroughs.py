"""The walkthrough debugger: /walkthroughs/{name}/steps/{n}, one permalink per step."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from app.main import templates
from app.traces import TraceCache
from app.views import debugger as V
from engine.programs import PROGRAMS

router = APIRouter()
_svg_cache: OrderedDict[str, str] = OrderedDict()


def get_cache(request: Request) -> TraceCache:
    state = request.app.state
    if not hasattr(state, "traces"):
        state.traces = TraceCache(state.settings.trace_cache)
    return state.traces


Cache = Annotated[TraceCache, Depends(get_cache)]
Threads = Annotated[int | None, Query(ge=1, le=8, description="threads for compute")]


def _program(name: str) -> str:
    if name not in PROGRAMS:
        raise HTTPException(404, f"There is no walkthrough named '{name}'. "
                                 f"The walkthroughs are: {', '.join(PROGRAMS)}.")
    return name


File = Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$",
                                    description="an uploaded GGUF's content hash (gguf-load)")]


@router.get("/walkthroughs/{name}")
def start(name: str, threads: Threads = None, file: File = None) -> RedirectResponse:
    _program(name)
    return RedirectResponse(V.Where(name, 0, threads, file=file).url(), status_code=303)


@router.get("/walkthroughs/{name}/goto")
def goto(name: str, step: int = 0, threads: Threads = None, file: File = None) -> RedirectResponse:
    """The scrubber's form target without JavaScript: go to step n."""
    _program(name)
    return RedirectResponse(V.Where(name, step, threads, file=file).url(), status_code=303)


def _input_file(request: Request, name: str, file: str | None) -> str | None:
    """The stored GGUF a walkthrough reads (gguf-load only), by content hash."""
    if file is None:
        return None
    if name != "gguf-load":
        raise HTTPException(422, f"'{name}' reads no file; only gguf-load does.")
    from app.routes.gguf import get_store

    path = get_store(request).path(file)
    if path is None:
        raise HTTPException(404, f"No GGUF file with hash {file} is stored; upload it in the "
                                 "GGUF inspector first.")
    return str(path)


def _svg(dot: str) -> str:
    key = hashlib.sha1(dot.encode()).hexdigest()
    if key not in _svg_cache:
        _svg_cache[key] = V.render_svg(dot)
        while len(_svg_cache) > 256:
            _svg_cache.popitem(last=False)
    return _svg_cache[key]


def step_model(cache: TraceCache, name: str, n: int, threads: int | None, t: str | None,
               row: int, block: int, file: str | None = None, path: str | None = None,
               expand: str | None = None, hex: str = "struct") -> dict:
    trace = cache.trace(_program(name), threads, path)
    if not 0 <= n < len(trace.steps):
        raise HTTPException(404, f"'{name}' has steps 0 to {len(trace.steps) - 1}; "
                                 f"there is no step {n}.")
    where = V.Where(name, n, threads, t, row, block, file, hex)
    step = trace.steps[n]
    state = cache.state(trace, n)
    sel = V.selected_tensor(state, where, step)
    if sel is not None and where.tensor is None:
        where.tensor = V.tensor_key(sel)
    cur = V.current_node(state, step)
    graph = V.graph_view(state, where, cur, sel, expand)
    return {
        "program": PROGRAMS[name], "where": where, "trace": trace, "step": step,
        "nav": V.nav(trace, where), "source": V.source(trace, step),
        "pools": V.pools(state, step, where, sel), "hex": V.hexview(state, step, sel, hex),
        "tensors": V.tensor_list(state, where, sel), "struct": V.struct(sel, where),
        "strides": V.strides(sel, where), "values": V.values(sel, where),
        "threads": V.threads(trace, step), "graph": graph,
        "graph_key": hashlib.sha1(graph.dot.encode()).hexdigest()[:16] if graph else None,
        "programs": PROGRAMS,
    }


@router.get("/walkthroughs/{name}/steps/{n}", response_class=HTMLResponse)
def step_page(request: Request, cache: Cache, name: str, n: int, threads: Threads = None,
              t: str | None = Query(None, pattern=r"^\d+\.\d+$"), row: int = 0,
              block: int = 0, file: File = None,
              expand: str | None = Query(None, pattern=r"^\d{1,4}$"),
              hex: str = Query("struct", pattern="^(struct|data)$")) -> HTMLResponse:
    path = _input_file(request, _program(name), file)
    try:
        model = step_model(cache, name, n, threads, t, row, block, file, path, expand, hex)
    except ValueError as e:
        raise HTTPException(422, str(e)) from None
    # the graph panel is sent again only when the graph drawn changed: otherwise htmx keeps the
    # one on the page (hx-preserve) and only the highlight style is new
    model["graph_unchanged"] = bool(request.headers.get("HX-Request")) and bool(
        model["graph_key"]) and request.headers.get("X-Graph-Key") == model["graph_key"]
    if not model["graph_unchanged"] and model["graph"] is not None:
        model["graph_svg"] = _svg(model["graph"].dot)
    else:
        model["graph_svg"] = None
    if request.headers.get("HX-Request"):
        return templates.TemplateResponse(request, "partials/debugger.html", model)
    return templates.TemplateResponse(request, "pages/walkthrough.html", model)
