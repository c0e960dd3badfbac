"""The web app factory: routers, templates, static files, and errors as readable pages."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.settings import ROOT, Settings

templates = Jinja2Templates(directory=ROOT / "templates")


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    app = FastAPI(title="ggml-lens", docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.mount("/static", StaticFiles(directory=ROOT / "static"), name="static")

    from app.routes import home

    app.include_router(home.router)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        return templates.TemplateResponse(request, "pages/error.html",
                                          {"status": exc.status_code, "message": exc.detail},
                                          status_code=exc.status_code)

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception) -> HTMLResponse:
        return templates.TemplateResponse(request, "pages/error.html",
                                          {"status": 500, "message": f"{type(exc).__name__}: {exc}"},
                                          status_code=500)

    return app
