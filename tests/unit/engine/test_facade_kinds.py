"""Every facade function declares what it is where it is defined (engine/core/api.py: `@query`,
`@op`, `@writes(...)`), and the recorder decides from that declaration alone, never from a name.

The recorder's view of every public facade function is golden data (golden/facade-kinds.json),
first written from the name lists and the ops/ directory rule that the declarations replaced, so
the refactor is seen to change nothing recorded; it changes only on purpose:
GGML_LENS_UPDATE_GOLDEN=1 rewrites it.
"""

from __future__ import annotations

import ast
import inspect
import json
import os
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from engine import ggml as G
from engine import ggml_alloc as GA
from engine import ggml_backend as GB
from engine import ggml_cpu as GC
from engine import ggml_opt as GO
from engine.core.api import Declaration, Kind, Writes, declaration_of, op, query, writes
from engine.core.tensor_data import set_data
from engine.trace import record
from engine.trace import recorder as recorder_module
from engine.trace.recorder import watched_functions

# ggml.h, ggml-backend.h, ggml-alloc.h, ggml-opt.h, ggml-cpu.h (ggml_util.py's functions reach
# programs through ggml.h's names)
HEADERS = (G, GB, GA, GO, GC)
GOLDEN = Path(__file__).parent / "golden" / "facade-kinds.json"
UPDATE = os.environ.get("GGML_LENS_UPDATE_GOLDEN") == "1"
TRACE_ROOM = Path(recorder_module.__file__).parent


def public_functions() -> dict[str, object]:
    """name -> object for everything the headers export that a program can call and that is not
    a class (a class such as ggml_init_params is a struct, not a function)."""
    out = {}
    for module in HEADERS:
        for name in module.__all__:
            obj = getattr(module, name)
            if callable(obj) and not inspect.isclass(obj):
                out[name] = obj
    return out


def test_every_public_facade_function_declares_exactly_one_kind():
    functions = public_functions()
    assert len(functions) > 600  # every header was read
    not_python = sorted(n for n, f in functions.items() if not inspect.isfunction(f))
    assert not not_python, f"the recorder sees Python functions only (their code objects): {not_python}"
    undeclared = sorted(n for n, f in functions.items() if declaration_of(f) is None)
    assert not undeclared, ("each facade function says what it is where it is defined "
                            f"(@query, @op or @writes(...), engine/core/api.py): {undeclared}")
    # the declaration is the function's own, not one made up for it by a facade
    for name, fn in functions.items():
        assert isinstance(declaration_of(fn), Declaration) and fn.__name__ == name


def test_a_second_declaration_is_refused():
    def ggml_twice(t):
        return t

    op(ggml_twice)
    with pytest.raises(TypeError, match="ggml_twice is declared twice"):
        query(ggml_twice)
    assert declaration_of(ggml_twice) == Declaration(Kind.OP)


def test_declarations_read_as_their_decorators():
    assert str(Declaration(Kind.QUERY)) == "query"
    assert str(declaration_of(G.ggml_add)) == "op"
    assert str(declaration_of(G.set_data)) == "writes DATA"
    assert str(declaration_of(GO.ggml_opt_fit)) == "writes PLACES OPT LOOP"


def recorder_view() -> dict[str, str]:
    """How the recorder treats a call of each public facade function made by a program."""
    watched = watched_functions()
    view = {}
    for name, fn in public_functions().items():
        w = watched.get(fn.__code__)
        view[name] = "not a step" if w is None else str(Declaration(w.kind, w.writes))
    return dict(sorted(view.items()))


def test_the_recorder_reads_the_declarations_as_golden():
    """What the recorder does for each facade function changes only on purpose (the golden data
    was first written by the name lists the declarations replaced)."""
    current = recorder_view()
    if UPDATE:
        GOLDEN.write_text(json.dumps(current, indent=1) + "\n")
    assert GOLDEN.exists(), "no golden facade kinds: run with GGML_LENS_UPDATE_GOLDEN=1"
    golden = json.loads(GOLDEN.read_text())
    changed = {n: (golden.get(n), current.get(n)) for n in golden.keys() | current.keys()
               if golden.get(n) != current.get(n)}
    assert not changed, f"(golden, now) for the functions whose recording changed: {changed}"


def test_the_trace_room_names_no_facade_function():
    """The recorder and its collaborators keep no list of function names that a rename would
    silently leave behind: no string in engine/trace/ is a facade function's name or a prefix
    of one (`"ggml_opt_"`); docstrings may name them."""
    names = set(public_functions())
    found = []
    for path in sorted(TRACE_ROOM.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value
                if word in names or word.isidentifier() and word.startswith(("ggml_", "gguf_")):
                    found.append(f"{path.name}:{node.lineno}: {word!r}")
    assert not found, found


def test_a_ggml_cpu_h_setter_is_a_step(tmp_path):
    """ggml-cpu.h's own setters write a tensor's data, and a program's call to one says so."""
    text = ("from engine.ggml import *\n"
            "from engine.ggml_cpu import *\n"
            "def run(n_threads=1):\n"
            "    ctx = ggml_init(ggml_init_params(mem_size=1 << 16))\n"
            "    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 3, 2)\n"
            "    ggml_set_f32_nd(a, 1, 1, 0, 0, 2.5)\n"
            "    n = ggml_cpu_has_avx2() + ggml_get_f32_nd(a, 1, 1, 0, 0)\n"
            "    return {'a': a}\n")
    trace = recorded(tmp_path / "nd.py", text)
    calls = [s for s in trace.steps if s.kind == "call"]
    assert [s.line for s in calls] == [4, 5, 6]  # the queries of line 7 are no steps
    wrote = calls[-1].notes[0]
    assert wrote.key == "wrote_data" and dict(wrote.args)["fn"] == "ggml_set_f32_nd"
    assert 0 < sum(len(p.data) for p in calls[-1].patches) <= 4  # (bytes of) one float32 of a's
    assert trace.outputs["a"] == [[0.0, 0.0, 0.0], [0.0, 2.5, 0.0]]


def recorded(src, text: str):
    """The trace of the program `text`, run from the file `src` (its lines are the steps' lines)."""
    src.write_text(text)
    ns: dict = {}
    exec(compile(text, str(src), "exec"), ns)
    return record(ns["run"], str(src), src.stem)


# --- the declaration, not the name, decides --------------------------------------------------

@writes(Writes.DATA)
def fill_with_sevens(t):
    """A data setter under a name no list ever held."""
    set_data(t, np.full(4, 7, dtype=np.float32))  # (a call inside the engine: not a step)


def fill_undeclared(t):
    """The same, declaring nothing."""
    set_data(t, np.full(4, 7, dtype=np.float32))


PROGRAM = """\
from engine.ggml import *
from facade_with_new_names import fill_undeclared, fill_with_sevens


def run(n_threads=1):
    ctx = ggml_init(ggml_init_params(mem_size=1 << 16))
    a = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4)
    fill_undeclared(a)
    fill_with_sevens(a)
    return {"a": a}
"""


def test_a_function_is_recorded_as_it_declares_whatever_its_name(tmp_path, monkeypatch):
    """A header exporting new names: the declared setter's call is a step saying it wrote the
    tensor's data; the undeclared one's is no step at all."""
    header = types.ModuleType("facade_with_new_names")
    header.fill_with_sevens, header.fill_undeclared = fill_with_sevens, fill_undeclared
    header.__all__ = ["fill_with_sevens", "fill_undeclared"]
    monkeypatch.setitem(sys.modules, header.__name__, header)
    monkeypatch.setattr(recorder_module, "FACADES", (*recorder_module.FACADES, header))
    trace = recorded(tmp_path / "renamed.py", PROGRAM)
    calls = [s for s in trace.steps if s.kind == "call"]
    assert [s.line for s in calls] == [6, 7, 9]  # ggml_init, the tensor, fill_with_sevens
    wrote = calls[-1].notes[0]
    assert wrote.key == "wrote_data" and dict(wrote.args)["fn"] == "fill_with_sevens"
    assert trace.outputs["a"] == [7.0] * 4
