"""The panel table (app/views/debugger/panels.py) is the one place a debugger panel is added: every
partial is a panel of it or named as none, and the page renders each panel once, in its order,
with the tab bar listing its tabs and their labels."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app import i18n
from app.main import create_app
from app.settings import Settings
from app.views.debugger import panels
from app.views.debugger.chat import ChatView
from app.views.debugger.panels import LAYOUT, NOT_PANELS, PANELS, Place
from app.web import TEMPLATES_DIR

TAB = re.compile(r'<button type="button" role="tab" class="tab" data-panel="([^"]+)" '
                 r'aria-controls="([^"]+)">([^<]*)</button>')


@pytest.fixture(scope="module")
def client(model_data):
    return TestClient(create_app(Settings(data_dir=model_data)))


def test_every_partial_is_a_panel_or_named_as_none():
    partials = {p.name for p in (Path(TEMPLATES_DIR) / panels.PARTIALS).glob("*.html")}
    in_table = [p.template for p in PANELS]
    assert len(in_table) == len(set(in_table)), "a partial in two panels"
    assert not set(in_table) & set(NOT_PANELS), "a panel named as none"
    assert partials == set(in_table) | set(NOT_PANELS), "a partial neither a panel nor named"
    ids = [p.id for p in PANELS]
    assert len(ids) == len(set(ids)), "two panels with one id"


def test_a_view_model_is_built_by_one_function():
    """Two panels may read one view-model (the Prompt and the Next token tab read `answer`),
    built once; two different functions under one name would show one panel another's data."""
    built: dict[str, object] = {}
    for p in PANELS:
        for m in p.models:
            assert built.setdefault(m.name, m.build) is m.build, m.name


def test_a_tab_has_a_label_and_no_other_panel_has_one():
    for p in PANELS:
        assert bool(p.label) == (p.place == Place.TAB), p.id
    placed = (LAYOUT.top, LAYOUT.left, LAYOUT.right, LAYOUT.tabs)
    assert LAYOUT.tabs and sum(map(len, placed)) == len(PANELS), "a panel in no place"


def _rendered(text: str) -> list[str]:
    """The panels' ids in the order the page shows them (each as often as it shows it)."""
    ids = {p.id for p in PANELS}
    return [i for i in re.findall(r'<(?:section|nav) id="([^"]+)"', text) if i in ids]


# the pages that show every panel between them, with the optional panels each shows: a model's
# (the prompt, the next token) and a training's (its charts, the buffers, the memory plan); the
# chat tab (a file's chat template) is shown on both by a stand-in view-model
PAGES = [("/walkthroughs/gemma3/steps/0", {"answer", "nexttoken", "chat"}),
         ("/walkthroughs/mnist-train/steps/105", {"training", "buffers", "plan", "chat"}),
         ("/walkthroughs/repack/steps/33", {"buffers", "repacked", "chat"})]  # (y5: w in CPU_REPACK)


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("htmx", [False, True])
@pytest.mark.parametrize("url,optional", PAGES, ids=[u for u, _ in PAGES])
def test_the_page_renders_each_panel_once_in_the_tables_order(client, monkeypatch, url, optional,
                                                              htmx, lang):
    chat = ChatView("{{ messages }}", "/walkthroughs/gemma3/chat", "")
    monkeypatch.setattr(panels, "chat_view", lambda trace, where, path: chat)
    r = client.get(f"{url}?lang={lang}", headers={"HX-Request": "true"} if htmx else {})
    assert r.status_code == 200, r.text[:300]
    expected = [p.id for p in PANELS if not p.optional or p.id in optional]
    assert _rendered(r.text) == expected
    # the tab bar: the tabs shown, in the table's order, each labelled in the page's language
    said = i18n.translations(lang).gettext
    labels = [(p.id, p.id, said(p.label)) for p in LAYOUT.tabs if p.id in expected]
    assert labels[0][2] == ("Struct" if lang == "en" else "结构体")
    assert TAB.findall(r.text) == labels
    assert f'data-tab="{LAYOUT.tabs[0].id}"' in r.text  # the tab shown first


def test_an_empty_optional_tab_is_left_out(client, monkeypatch):
    """A tab whose view-model is empty shows neither its button nor its panel."""
    monkeypatch.setattr(panels, "training_view", lambda trace: None)
    text = client.get("/walkthroughs/mnist-train/steps/105").text
    assert "training" not in _rendered(text)
    assert "training" not in [tab for tab, _, _ in TAB.findall(text)]
