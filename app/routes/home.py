"""The home page: what a learner can open."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse

from app import i18n
from app.lessons.views import lesson_map
from app.web import STATIC_DIR, templates
from engine.programs import PROGRAMS

router = APIRouter()
START = "simple-ctx"  # the first walkthrough: ggml's own first example, fourteen steps


@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> HTMLResponse:
    """The lessons first, for a newcomer; the walkthroughs, the one to start with first; the
    keys; the playground (when this server runs programs) and the GGUF inspector."""
    return templates.TemplateResponse(request, "pages/home.html", {
        "lessons": lesson_map(i18n.current()),
        "programs": list(PROGRAMS.values()), "start": PROGRAMS[START],
        "playground": request.app.state.programs is not None})


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    """The icon browsers ask for by this name (pages name /static/favicon.svg too)."""
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})
