"""Every note the recorder and the kernels write is made from a template of engine/notes.py, so
the interface can tell it in another language: each part of each step's note and each thread's
note, in every walkthrough at 1 and 3 threads (the model one at 1), is matched by one."""

from __future__ import annotations

import ast
import pathlib

import pytest

from engine import notes
from engine.programs import PROGRAMS, trace_program

KERNELS = pathlib.Path(notes.__file__).parent / "compute" / "kernels"


def unmatched(text: str) -> list[str]:
    return [p for p in text.split("; ") if p and notes.parse(p) is None]


# the 3,000-step model walkthrough at its own thread count only
CASES = [(name, n) for name in sorted(PROGRAMS) for n in (1, 3) if not (name == "gemma3" and n == 3)]


@pytest.mark.parametrize("name,n_threads", CASES)
def test_every_note_of_a_walkthrough_has_a_template(name, n_threads):
    trace = trace_program(name, n_threads)
    missing = {p for s in trace.steps for p in unmatched(s.note)}
    missing |= {p for s in trace.steps for t in s.threads for p in unmatched(t.note or "")}
    assert missing == set()


def test_every_literal_share_note_of_a_kernel_is_a_template():
    found = 0
    for path in KERNELS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "note" and isinstance(node.value, ast.Constant):
                found += 1
                assert [p for p in node.value.value.split("; ") if notes.parse(p) is None] == [], path.name
    assert found >= 20


def test_parse_gives_the_values_back():
    text = notes.GALLOCR_GETS.format(name="x", size=64, where=notes.WHERE.format(id=0, name="CPU", chunk=0, offset=32))
    template, values = notes.parse(text)
    assert template == notes.GALLOCR_GETS and values["name"] == "x" and values["size"] == "64"
    assert notes.parse(values["where"]) == (notes.WHERE, {"id": "0", "name": "CPU", "chunk": "0", "offset": "32"})
    assert notes.parse("no template says this") is None
