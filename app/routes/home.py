"""The home page: what a learner can open."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.web import templates
from engine.programs import PROGRAMS

router = APIRouter()


@router.get("/", response_class=HTMLResponse)
def home(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/home.html",
                                      {"programs": list(PROGRAMS.values())})
