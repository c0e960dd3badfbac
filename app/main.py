"""The web app factory: shared objects, routers, static files, and errors as readable pages."""

from __future__ import annotations

import gc
from contextlib import asynccontextmanager

import anyio.to_thread

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException

from app import deps
from app.i18n import LocaleMiddleware, _
from app.jobs import Pending, RecordingLost
from app.routes import gguf, home, lessons, perplexity, playground, predict, walkthroughs
from app.routes import compare
from app.routes import plan as plan_routes
from app.views.debugger import kernel
from app.settings import Settings
from app.web import STATIC_DIR, ServerTiming, error_page, go_to, log
from engine.lanes import use_numpy


_TUNED = False
# threads for the routes (anyio's default is 40): a request that waits a moment for a recording
# sleeps in its thread, and a class that arrives at once must not queue behind those
REQUEST_THREADS = 200


@asynccontextmanager
async def _lifespan(app: FastAPI):
    anyio.to_thread.current_default_thread_limiter().total_tokens = REQUEST_THREADS
    yield


def _tune_collector() -> None:
    """Once per process: what exists when the first app is made is frozen out of the cyclic
    collector's sight, and young collections run every 10,000 allocations, so that a step page's
    short-lived objects are not promoted into full collections mid-request."""
    global _TUNED
    if not _TUNED:
        _TUNED = True
        gc.collect()
        gc.freeze()
        gc.set_threshold(10_000, 10, 10)


def create_app(settings: Settings | None = None) -> FastAPI:
    _tune_collector()
    kernel.warm()
    settings = settings or Settings.from_env()
    if settings.pure_numpy:
        use_numpy(True)
    app = FastAPI(title="ggml-lens", docs_url=None, redoc_url=None, lifespan=_lifespan)
    deps.install(app, settings)
    app.add_middleware(LocaleMiddleware)
    app.add_middleware(ServerTiming)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    app.include_router(home.router)
    app.include_router(walkthroughs.router)
    app.include_router(gguf.router)
    app.include_router(playground.router)
    app.include_router(lessons.router)
    app.include_router(predict.router)
    app.include_router(plan_routes.router)
    app.include_router(perplexity.router)
    app.include_router(compare.router)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> HTMLResponse:
        response = error_page(request, exc.status_code, str(exc.detail))
        response.headers.update(exc.headers or {})  # Retry-After
        return response

    @app.exception_handler(Pending)
    async def pending(request: Request, exc: Pending) -> Response:
        return go_to(request, exc.url)

    @app.exception_handler(RecordingLost)
    async def lost(request: Request, exc: RecordingLost) -> HTMLResponse:
        return error_page(request, 503, str(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> HTMLResponse:
        where = "; ".join(f"{'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())
        return error_page(request, 422, _("The request is not valid: {where}").format(where=where))

    @app.exception_handler(Exception)
    async def any_error(request: Request, exc: Exception) -> HTMLResponse:
        log.exception("error serving %s", request.url.path)
        return error_page(request, 500, _("Something went wrong: {error}").format(error=f"{type(exc).__name__}: {exc}"))

    return app

