"""The interface's languages: English (the source strings) and Simplified Chinese.

Strings are marked where they are written: `_("...")` in Python (`N_` for a constant translated
later), `{{ _("...") }}` and `{% trans %}` in templates. Their translations are a standard gettext
catalogue, `app/locale/zh/LC_MESSAGES/messages.po`, read with Babel when first needed; the .po file
is the only source (no compiled .mo to keep in step).

A request's language: `?lang=` when the switch sets it (then remembered in the `lang` cookie),
else the cookie, else the browser's Accept-Language, else English. It lives in a context variable
for the request, so views and templates translate without passing it around.

The engine records its step and thread notes as data, a template's key and its values
(engine/core/notes.py); `note()` tells them with the translated templates.
"""

from __future__ import annotations

import gettext as _gettext
import io
from collections.abc import Iterable
from contextvars import ContextVar
from functools import cache

from babel import negotiate_locale
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from starlette.datastructures import MutableHeaders
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.settings import PACKAGE
from engine.core.notes import Note, tell

LOCALES = {"en": "English", "zh": "简体中文"}
HTML_LANG = {"en": "en", "zh": "zh-Hans"}
LIST_COMMA = {"en": ", ", "zh": "，"}  # between the items of a list in a sentence
DEFAULT = "en"
COOKIE = "lang"
LOCALE_DIR = PACKAGE / "locale"

_current: ContextVar[str] = ContextVar("locale", default=DEFAULT)


@cache
def translations(locale: str) -> _gettext.NullTranslations:
    """The catalogue of a locale, compiled in memory from its .po file."""
    if locale == DEFAULT:
        return _gettext.NullTranslations()
    with open(LOCALE_DIR / locale / "LC_MESSAGES" / "messages.po", "rb") as f:
        catalog = read_po(f, locale="zh_Hans_CN" if locale == "zh" else locale)
    buf = io.BytesIO()
    write_mo(buf, catalog)
    buf.seek(0)
    return _gettext.GNUTranslations(buf)


def current() -> str:
    return _current.get()


def use(locale: str):
    """Set the language of the running request (returns the token to reset it with)."""
    return _current.set(locale if locale in LOCALES else DEFAULT)


def gettext(message: str) -> str:
    return translations(_current.get()).gettext(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    return translations(_current.get()).ngettext(singular, plural, n)


_ = gettext


def N_(message: str) -> str:  # noqa: N802 - gettext's name
    """Marks a constant for the catalogue; it is translated where it is shown, with _()."""
    return message


# the sentences the page scripts write (app/static/text.js reads them from the page)
JS_TEXT = {"found": N_("{n} found"), "none_found": N_("none found"),
           "sending_head": N_("sending the first {n} of {size} bytes…"),
           "server_answered": N_("the server answered {status}"), "sending": N_("sending…"),
           "bytes_range": N_("bytes {lo} to {hi} ({n} of {size})")}


def js_text() -> dict[str, str]:
    return {k: gettext(v) for k, v in JS_TEXT.items()}


def pick(query_lang: str | None, cookie: str | None, accept_language: str | None) -> str:
    """The language of a request: the switch, the remembered choice, the browser's wish (its
    Accept-Language tags by their q weights, matched by Babel's negotiate_locale)."""
    for choice in (query_lang, cookie):
        if choice in LOCALES:
            return choice
    wishes: list[tuple[float, int, str]] = []
    for part in (accept_language or "").split(","):
        tag, _sep, params = part.strip().partition(";")
        weight = params.strip().removeprefix("q=") if params.strip().startswith("q=") else "1"
        try:
            q = float(weight)
        except ValueError:
            q = 0.0
        if tag.strip() and q > 0:
            wishes.append((-q, len(wishes), tag.strip().lower()))
    return negotiate_locale([tag for *_, tag in sorted(wishes)], list(LOCALES), sep="-") or DEFAULT


class LocaleMiddleware:
    """Chooses each request's language; a `?lang=` choice is remembered in a cookie. Pages vary
    by language, which the Vary and Content-Language headers say."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        conn = HTTPConnection(scope)
        query = conn.query_params.get("lang")
        locale = pick(query, conn.cookies.get(COOKIE), conn.headers.get("accept-language"))
        token = use(locale)

        async def tagged(message: Message) -> None:
            if message["type"] == "http.response.start":
                h = MutableHeaders(scope=message)
                h["Content-Language"] = HTML_LANG[locale]
                h.append("Vary", "Accept-Language, Cookie")
                if query in LOCALES:
                    h.append("Set-Cookie", f"{COOKIE}={query}; Path=/; Max-Age=31536000; SameSite=Lax")
            await send(message)

        try:
            await self.app(scope, receive, tagged)
        finally:
            _current.reset(token)


def note(notes: Iterable[Note]) -> str:
    """Engine notes in the request's language: each template told with its translation, filled
    with the same values (ggml's own words, verbatim notes, stay as they are)."""
    return tell(notes, gettext, LIST_COMMA[_current.get()])
