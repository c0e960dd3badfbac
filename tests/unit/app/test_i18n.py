"""The Chinese interface: every message translated, no template text left outside the catalogue,
the language chosen as the issue asks, the engine's notes told in Chinese."""

from __future__ import annotations

import html
import re

import pytest
from babel.messages.pofile import read_po
from jinja2 import Environment

from app import i18n
from app.messages import extract, po_path
from app.settings import PACKAGE
from engine import notes

TEMPLATES = sorted((PACKAGE / "templates").rglob("*.html"))
PLACEHOLDER = re.compile(r"%\((\w+)\)[sd]|\{(\w+)\}")
CJK = re.compile(r"[\u4e00-\u9fff]")


def zh_catalog():
    with open(po_path("zh"), "rb") as f:
        return read_po(f, locale="zh_Hans_CN")


def placeholders(text: str) -> set[str]:
    return {a or b for a, b in PLACEHOLDER.findall(text)}


def test_every_message_is_translated_with_the_same_placeholders():
    catalog = zh_catalog()
    wanted = [m for m in extract() if m.id]
    assert len(wanted) > 300
    problems = []
    for m in wanted:
        t = catalog.get(m.id)
        if t is None or not t.string or (isinstance(t.string, tuple) and not all(t.string)) or t.fuzzy:
            problems.append(f"untranslated: {m.id!r}")
            continue
        ids = m.id if isinstance(m.id, tuple) else (m.id,)
        strs = t.string if isinstance(t.string, tuple) else (t.string,)
        for s in strs:
            if placeholders(s) != placeholders(ids[0]):
                problems.append(f"placeholders differ: {ids[0]!r} -> {s!r}")
    assert problems == []


# words a template may show in any language: identifiers, units, names of things
ALLOWED = {"ggml", "lens", "htmx", "GGUF", "DAG", "KV", "CPU", "API", "ne", "nb", "op", "src", "hex",
           "dot", "svg", "µs", "ms", "id", "kB", "MB", "GB", "px", "nbsp", "ggml-lens", "sha", "gdb"}


def visible_text(source: str) -> list[str]:
    """The text of a template a browser would show (and title/aria-label/placeholder/alt values),
    outside gettext: Jinja blocks, expressions and comments, tags, and trans blocks removed."""
    s = re.sub(r"{%-?\s*trans\b.*?{%-?\s*endtrans\s*-?%}", " ", source, flags=re.S)
    s = re.sub(r"{#.*?#}", " ", s, flags=re.S)
    s = re.sub(r"{{.*?}}", " ", s, flags=re.S)
    s = re.sub(r"{%.*?%}", " ", s, flags=re.S)
    s = re.sub(r"<(script|style)\b.*?</\1>", " ", s, flags=re.S)
    attrs = re.findall(r'\b(?:title|aria-label|placeholder|alt)="([^"]*)"', s)
    s = re.sub(r"<[^>]*>", " ", s)
    return [html.unescape(x) for x in [s, *attrs]]


def untranslated_words(text: str) -> list[str]:
    """English words: identifiers (with _ . or digits), abbreviations and ALLOWED names excepted."""
    tokens = re.findall(r"[\w.'-]+", text)
    words = [t.strip(".'-") for t in tokens if not re.search(r"[_\d]|\w\.\w", t)]
    return [w for w in words if re.fullmatch(r"[A-Za-z][A-Za-z'-]*[A-Za-z]", w) and w not in ALLOWED
            and not w.isupper()]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: str(p.relative_to(PACKAGE / "templates")))
def test_no_template_holds_an_untranslated_string(path):
    found = [w for text in visible_text(path.read_text()) for w in untranslated_words(text)]
    assert found == [], f"wrap these in _() or {{% trans %}}: {sorted(set(found))}"


def test_the_checker_finds_bare_text():
    assert untranslated_words(" ".join(visible_text('<p title="Next step">{{ _("ok") }} Hello</p>'))) == \
        ["Hello", "Next", "step"]
    assert untranslated_words(" ".join(visible_text("{% trans %}Hello{% endtrans %} ggml_init"))) == []


def test_templates_parse_with_the_i18n_extension():
    env = Environment(extensions=["jinja2.ext.i18n"])
    for path in TEMPLATES:
        env.parse(path.read_text())


@pytest.mark.parametrize("query,cookie,accept,want", [
    (None, None, None, "en"),
    (None, None, "zh-CN,zh;q=0.9,en;q=0.8", "zh"),
    (None, None, "en-US,en;q=0.9,zh-CN;q=0.8", "en"),
    (None, None, "de-DE,zh-Hans;q=0.5", "zh"),
    (None, None, "zh;q=0, en;q=0.1", "en"),
    (None, "zh", "en-US", "zh"),
    ("en", "zh", "zh-CN", "en"),
    ("xx", None, "zh-TW", "zh"),
    (None, None, "garbage;q=abc", "en"),
])
def test_the_language_of_a_request(query, cookie, accept, want):
    assert i18n.pick(query, cookie, accept) == want


def test_engine_notes_are_told_in_chinese():
    where = notes.WHERE.format(id=0, name="CPU", chunk=0, offset=64)
    text = notes.GALLOCR_GETS.format(name="kq-0", size=4096, where=where) + "; " + notes.RETURNED
    token = i18n.use("zh")
    try:
        said = i18n.note(text)
    finally:
        i18n._current.reset(token)
    assert CJK.search(said) and "kq-0" in said and "4096" in said and "CPU" in said and "64" in said
    assert "gallocr: 'kq-0' gets" not in said and "the program returned" not in said
    assert i18n.note(text) == text  # English stays as the engine wrote it
    token = i18n.use("zh")
    try:
        assert i18n.note("x = ggml_add(ctx, a, b); y = 2") == "x = ggml_add(ctx, a, b); y = 2"
    finally:
        i18n._current.reset(token)
