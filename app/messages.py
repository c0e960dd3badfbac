"""The interface's message catalogue: every string a learner reads, gathered from the code.

    python -m app.messages      # (or `make messages`) brings app/locale/*/messages.po up to date

Gathers `_()`, `N_()` and `ngettext()` in app/ (Python and templates, with Babel), the engine's
note templates (engine/core/notes.py), its step kinds, and the meaning of each field of each quantized
block (the block explainer shows them) and what each walkthrough teaches (the first line of its
docstring, on the home page). New strings join each .po file untranslated; strings no
longer in the code are dropped. tests/unit/app/test_i18n.py fails while any is untranslated.
"""

from __future__ import annotations

from datetime import datetime, timezone

from babel.messages.catalog import Catalog
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po, write_po

from app.i18n import DEFAULT, LOCALE_DIR, LOCALES
from app.settings import PACKAGE
from engine.compute.kernel_card import summary_of
from engine.compute.kernels import KERNELS
from engine.core import notes
from engine.programs import PROGRAMS
from engine.quants import QUANT_KINDS
from engine.trace.steps import StepKind

METHODS = [("**/templates/**.html", "jinja2.ext:babel_extract"), ("**.py", "python")]
OPTIONS = {"**/templates/**.html": {"extensions": "jinja2.ext.i18n", "newstyle_gettext": "true"}}
KEYWORDS = {"_": None, "N_": None, "gettext": None, "ngettext": (1, 2)}  # {% trans %} is gettext()
SKIP = ("messages.py", "cli.py")
STAMP = datetime(2026, 11, 25, tzinfo=timezone.utc)  # this file; the command line speaks English


def extract() -> Catalog:
    """Every message of the interface, with where it comes from."""
    catalog = Catalog(project="ggml-lens", locale=None)
    for filename, lineno, message, comments, context in extract_from_dir(
            PACKAGE, METHODS, options_map=OPTIONS, keywords=KEYWORDS,
            callback=None, strip_comment_tags=True):
        if filename.rsplit("/", 1)[-1] in SKIP:
            continue
        catalog.add(message, locations=[(f"app/{filename}", lineno)], auto_comments=comments,
                    context=context)
    engine = [(t, "engine/core/notes.py") for t in notes.TEMPLATES.values()]
    engine += [(k.value, "engine/trace/steps.py") for k in StepKind]
    engine += [(meaning, "engine/quants") for kind in QUANT_KINDS.values() for _field, meaning in kind.fields]
    engine += [(p.teaches, f"engine/programs/{p.module}.py") for p in PROGRAMS.values()]
    engine += [(summary_of(k.fn), k.fn.__module__.replace(".", "/") + ".py") for k in KERNELS.values()]
    for text, where in engine:
        if text:
            catalog.add(text, locations=[(where, 0)])
    return catalog


def po_path(locale: str):
    return LOCALE_DIR / locale / "LC_MESSAGES" / "messages.po"


def update() -> dict[str, int]:
    """Merge the extracted messages into each language's .po file; untranslated count each."""
    template = extract()
    missing = {}
    for locale in LOCALES:
        if locale == DEFAULT:
            continue
        path = po_path(locale)
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "rb") as f:
                catalog = read_po(f, locale="zh_Hans_CN" if locale == "zh" else locale)
        else:
            catalog = Catalog(locale="zh_Hans_CN" if locale == "zh" else locale, project="ggml-lens")
        catalog.update(template, no_fuzzy_matching=True)
        catalog.obsolete.clear()
        catalog.fuzzy = False  # the header: Babel marks a new one fuzzy, and a fuzzy header is skipped
        catalog.header_comment = (f"# The {LOCALES[locale]} interface of ggml-lens (app/messages.py keeps it in step "
                                  "with the code).")
        catalog.version, catalog.msgid_bugs_address = "1", ""
        catalog.creation_date = catalog.revision_date = STAMP  # a rerun changes only what changed
        catalog.last_translator = catalog.language_team = "ggml-lens"
        with open(path, "wb") as f:
            write_po(f, catalog, width=100, omit_header=False, sort_output=False, include_lineno=False)
        missing[locale] = sum(1 for m in catalog if m.id and not m.string)
    return missing


if __name__ == "__main__":
    for locale, n in update().items():
        print(f"{po_path(locale)}: {n} message(s) to translate")
