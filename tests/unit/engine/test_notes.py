"""Every note the recorder and the kernels write is one of engine/core/notes.py's templates with its
values: each note of each step and of each thread's share, in every walkthrough at its own thread
count and at 3 threads (the model one at its own), has a known key and fills exactly its template's
placeholders (a verbatim
note, ggml's own words, is for the step that stopped a program: none of these stops)."""

from __future__ import annotations

import string

import pytest

from engine.core import notes
from engine.core.notes import Note, tell
from engine.programs import PROGRAMS
from tests.support.recorded import recorded

# (its own count: the recording the golden test reads too; the 3,000-step model walkthrough at that only)
CASES = [(name, n) for name, p in sorted(PROGRAMS.items())
         for n in sorted({p.threads} | ({3} if not p.model else set()))]


def placeholders(template: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(template) if f}


def with_nested(n: Note):
    """A note and the notes its values hold."""
    yield n
    for _, v in n.args:
        for x in v if isinstance(v, tuple) else (v,):
            if isinstance(x, Note):
                yield from with_nested(x)


@pytest.mark.parametrize("name,n_threads", CASES)
def test_every_note_of_a_walkthrough_fills_a_template(name, n_threads):
    trace = recorded(name, n_threads)
    assert trace.error is None
    used = [n for s in trace.steps for top in s.notes for n in with_nested(top)]
    used += [n for s in trace.steps for t in s.threads for top in t.notes for n in with_nested(top)]
    assert used
    for n in used:
        assert n.key in notes.TEMPLATES, n
        assert sorted(k for k, _ in n.args) == sorted(placeholders(notes.TEMPLATES[n.key])), n
    assert all(tell(s.notes) for s in trace.steps)  # every step says something, in English


def test_english_is_the_templates_filled_and_joined():
    where = Note.of("where", id=0, name="CPU", chunk=0, offset=64)
    parts = (Note.of("gallocr_gets", name="k; v", size=4096, where=where), Note("returned"))
    assert tell(parts) == "gallocr: 'k; v' gets 4096 bytes at buffer 0 (CPU), chunk 0, offset 64; the program returned"
    passed = Note.of("sched_pass", title=Note("pass_4"), counts=(Note.of("pass_count", n=3, b=0, name="CPU"),
                                                                 Note.of("pass_count", n=1, b=1, name="GPU0")))
    assert tell([passed]) == ("ggml_backend_sched pass 4: sources and views follow their nodes: 3 to backend 0 "
                              "(CPU), 1 to backend 1 (GPU0)")
    assert tell([Note.verbatim("GGML_ASSERT(a {b}) failed")]) == "GGML_ASSERT(a {b}) failed"


@pytest.mark.parametrize("make, rule", [
    (lambda: Note("no such template"), "one of engine/core/notes.py's templates"),
    (lambda: Note.of("wrote"), r"fills \['n'\]"),
    (lambda: Note.of("wrote", n=1, m=2), r"fills \['n'\]"),
    (lambda: Note("wrote", (("n", 1), ("n", 2))), r"fills \['n'\]"),
    (lambda: Note("wrote", (("n", [1]),)), "value of type"),
    (lambda: Note.verbatim(3), "value of type"),
    (lambda: Note.of("sched_pass", title=Note("pass_1"), counts=("1 to backend 0",)), "value of type"),
    (lambda: Note.of("sched_pass", title=Note.of("sched_pass", title=Note("pass_1"), counts=()), counts=()),
     "nests a note that holds notes"),
])
def test_a_note_that_breaks_a_rule_is_refused(make, rule):
    with pytest.raises((ValueError, TypeError), match=rule):
        make()
