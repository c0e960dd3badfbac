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
from engine.core.notes import Note, tell
from engine.trace import record

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


@pytest.fixture
def zh():
    token = i18n.use("zh")
    yield
    i18n._current.reset(token)


def test_engine_notes_are_told_in_chinese(zh):
    where = Note.of("where", id=0, name="CPU", chunk=0, offset=64)
    parts = (Note.of("gallocr_gets", name="kq-0", size=4096, where=where), Note("returned"))
    assert i18n.note(parts) == "gallocr：“kq-0”在缓冲区 0（CPU），分块 0，偏移 64处获得 4096 字节; 程序已返回"
    passed = Note.of("sched_pass", title=Note("pass_4"), counts=(Note.of("pass_count", n=3, b=0, name="CPU"),
                                                                 Note.of("pass_count", n=1, b=1, name="GPU0")))
    said = i18n.note([passed])
    assert CJK.search(said) and "，" in said and "to backend" not in said and "follow their nodes" not in said
    # ggml's own words stay as they are
    assert i18n.note([Note.verbatim("x = ggml_add(ctx, a, b); y = 2")]) == "x = ggml_add(ctx, a, b); y = 2"


def test_engine_notes_stay_english_in_english():
    parts = (Note.of("gallocr_gets", name="kq-0", size=4096, where=Note.of("where", id=0, name="CPU", chunk=0,
                                                                           offset=64)), Note("returned"))
    assert i18n.note(parts) == tell(parts) == \
        "gallocr: 'kq-0' gets 4096 bytes at buffer 0 (CPU), chunk 0, offset 64; the program returned"


PROGRAM = """
from engine.ggml import *


def run(n_threads=1):
    ctx = ggml_init(ggml_init_params(mem_size=1 << 16, mem_buffer=None, no_alloc=False))
    kv = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    ggml_set_name(kv, "k; v")
    return {}
"""


def test_a_tensor_named_with_the_parts_separator_is_told_in_chinese(tmp_path, zh):
    """A note is data: a name holding "; " (the English parts' separator) is one value, not two
    parts of a sentence."""
    path = tmp_path / "kv_program.py"
    path.write_text(PROGRAM)
    namespace: dict = {}
    exec(compile(PROGRAM, str(path), "exec"), namespace)
    trace = record(namespace["run"], str(path), "kv")
    (named,) = [s for s in trace.steps if "ggml_set_name" in s.call]
    assert tell(named.notes) == "set name of 'k; v' from '' to 'k; v'"
    assert i18n.note(named.notes) == "把“k; v”的 name 从 '' 改为 'k; v'"
