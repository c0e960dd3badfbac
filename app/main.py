"""The web app factory: routers, templates, static files, and errors as readable pages."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.settings import ROOT, Settings

templates = Jinja2Templates(directory=ROOT / "templates")
log = logging.getLogger("ggml-lens")


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """Every error is a page with a readable message (never a traceback)."""
    return templates.TemplateResponse(request, "pages/error.html",
                                      {"status": status, "message": message},
                                      status_code=status)


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(title="ggml-lens", docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.mount("/static", StaticFiles(directory=ROOT / "static"), name="static")

    from app.routes import gguf, home, walkthroughs

    app.include_router(home.router)
    app.include_router(walkthroughs.router)
    app.include_router(gguf.router)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return error_page(request, exc.status_code, str(exc.detail))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> HTMLResponse:
        where = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        return error_page(request, 422, f"The request is not valid: {where}")

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception) -> HTMLResponse:
        log.exception("error serving %s", request.url.path)
        return error_page(request, 500, f"Something went wrong: {type(exc).__name__}: {exc}")

    return app
