"""The GGUF inspector: upload or pick a file, then browse its header, keys, tensors and blocks."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from app.main import templates

router = APIRouter()


@router.get("/gguf", response_class=HTMLResponse)
def gguf_home(request: Request) -> HTMLResponse:
    return templates.TemplateResponse(request, "pages/gguf_home.html", {})
