"""What every route shares and nothing else: the templates, the error page, the logger, and the
middleware that times each response (`Server-Timing`).

Routes import this module and `app.deps`; `app.main` imports the routes. Nothing imports
`app.main`, so there is no circle.
"""

from __future__ import annotations

import logging
import time

from fastapi import Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app import i18n
from app.jobs import Progress
from app.settings import MAX_THREADS, PACKAGE

TEMPLATES_DIR = PACKAGE / "templates"
STATIC_DIR = PACKAGE / "static"

templates = Jinja2Templates(directory=TEMPLATES_DIR)
templates.env.globals["MAX_THREADS"] = MAX_THREADS
# gettext in templates: {{ _("...") }} and {% trans %}, in the request's language (app/i18n.py)
templates.env.add_extension("jinja2.ext.i18n")
templates.env.install_gettext_callables(i18n.gettext, i18n.ngettext, newstyle=True)  # type: ignore[attr-defined]  # (the i18n extension adds it at run time)
templates.env.globals.update(locale=i18n.current, LOCALES=i18n.LOCALES, HTML_LANG=i18n.HTML_LANG, note=i18n.note,
                              js_text=i18n.js_text, tr=i18n.gettext)  # tr: a message from data, without %-formatting
log = logging.getLogger("ggml-lens")


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    """Every error is a page with a readable message (never a traceback), in the request's
    language even when the error escaped the middleware that chose it."""
    i18n.use(i18n.pick(request.query_params.get("lang"), request.cookies.get(i18n.COOKIE),
                       request.headers.get("accept-language")))
    return templates.TemplateResponse(request, "pages/error.html",
                                      {"status": status, "message": message},
                                      status_code=status)


class ServerTiming:
    """Adds `Server-Timing: app;dur=<ms>` to every response: how long the app took to start
    answering (a plain ASGI middleware, so streamed uploads pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()

        async def timed(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"
            await send(message)

        await self.app(scope, receive, timed)


def client_of(request: Request) -> str:
    """Who asked (per-client limits of the job queue): the client's address."""
    return request.client.host if request.client else "?"


def go_to(request: Request, url: str) -> Response:
    """Send the browser to url: a 303, or for an htmx request (a swap, a poll) HX-Redirect."""
    if request.headers.get("HX-Request") == "true":
        return Response(status_code=200, headers={"HX-Redirect": url})
    return RedirectResponse(url, status_code=303)


def recording_page(request: Request, progress: Progress, **context) -> HTMLResponse:
    """A recording's page (202): its place in the queue (0: running, for how long, with the
    steps made so far); it polls itself (`url`) until the trace is kept."""
    return templates.TemplateResponse(request, "pages/recording.html", {
        "place": progress.place, "seconds": progress.seconds, "steps": progress.steps, **context},
        status_code=202)
