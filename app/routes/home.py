"""The home page: what a learner can open."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, HTMLResponse

from app.web import STATIC_DIR, templates
from engine.programs import PROGRAMS

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/home.html",
                                      {"programs": list(PROGRAMS.values())})


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> FileResponse:
    """The icon browsers ask for by this name (pages name /static/favicon.svg too)."""
    return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml",
                        headers={"Cache-Control": "public, max-age=86400"})
