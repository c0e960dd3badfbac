"""One name, one definition (STYLE.md): no public class or function name is defined at the top
level of two modules of the engine or the app, so `grep "def name"` or `grep "class Name"` finds
the one it means. Where two modules hold one concept, one defines it and the other imports it;
where they hold two, the one that is not ggml's name is renamed for what it is (ggml's facade
functions and ggml.h's structs keep ggml's names). Read from the source with ast, like
test_import_graph.py: top-level `def`s and `class`es, also those under a top-level `if` or `try`.

The walkthrough programs (engine/programs/*.py but its __init__) are not read: each is a script a
learner reads alone, and `run` is the name the walkthrough table calls in every one of them.

The exceptions are few, and each says why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app")
SCRIPTS = "engine/programs"  # a walkthrough's own names: each program is read alone

# name: why it may be defined in more than one module
ALLOWED = {
    "main": "each a process's entry point (the CLI, the sandbox's workers), run as `python -m`",
    "product": "each repacked family's product(layout, packed, ne00, ne01, x, out) (kernels/"
               "repack_q8_0.py, repack_q8_k.py): kernels/repack.py's product_of picks one by the "
               "layout's activations",
    "takes": "each of MUL_MAT's special paths' gate (kernels/tiled.py, hadamard.py), called by "
             "its module's name as ggml-cpu.c asks each path in turn",
    "header": "each C header generator's text (engine/quants/grids_c.py, types_c.py), called "
              "by its module's name, grids_c.header() beside grids_c.HEADER, the file it writes",
}


def _definitions(tree: ast.Module):
    """The module's top-level defs and classes, also those under a top-level if/try."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield node
        elif isinstance(node, (ast.If, ast.Try)):
            yield from _definitions(ast.Module(body=node.body + node.orelse, type_ignores=[]))


def definitions() -> dict[str, list[str]]:
    """Every public top-level name -> the files defining it ("path:line")."""
    found: dict[str, list[str]] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if rel.parent.as_posix() == SCRIPTS and rel.name != "__init__.py":
                continue
            for node in _definitions(ast.parse(path.read_text(), str(path))):
                if not node.name.startswith("_"):
                    found.setdefault(node.name, []).append(f"{rel.as_posix()}:{node.lineno}")
    return found


def duplicates() -> dict[str, list[str]]:
    return {name: where for name, where in definitions().items() if len(where) > 1}


def test_no_public_name_is_defined_twice():
    unexplained = {name: where for name, where in duplicates().items() if name not in ALLOWED}
    assert not unexplained, ("public names defined in more than one module (merge them if one "
                             "concept, rename the one that is not ggml's name if two, or say in "
                             f"ALLOWED why not): {unexplained}")


def test_every_exception_is_still_needed():
    stale = sorted(ALLOWED.keys() - duplicates().keys())
    assert not stale, f"defined once now: remove them from ALLOWED: {stale}"


def test_the_reader_finds_a_second_definition(tmp_path, monkeypatch):
    """The reader sees classes and functions at the top level and under an if or a try, leaves
    private names, methods and the walkthrough programs alone."""
    room = tmp_path / "engine" / "room"
    programs = tmp_path / "engine" / "programs"
    for d in (room, programs):
        d.mkdir(parents=True)
    (room / "a.py").write_text("class Span:\n    def record(self): ...\n"
                               "def record(): ...\ndef _hidden(): ...\n")
    (room / "b.py").write_text("try:\n    class Span: ...\nexcept ImportError:\n    pass\n"
                               "if True:\n    def _hidden(): ...\nelse:\n    def run(): ...\n")
    (programs / "walk.py").write_text("def run(): ...\ndef record(): ...\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", ("engine",))
    assert duplicates() == {"Span": ["engine/room/a.py:1", "engine/room/b.py:2"]}
