"""No module of the engine or the app imports another module's private name (`from x import
_name`): what a module shares, it names publicly, so that renaming a private helper never breaks
a stranger. Read from the source with ast, like test_import_graph.py, every import (also those
inside functions). gettext's `_` is no private name. The tests may reach into a module's private
helpers to test them; they are not read.

The exceptions are few, and each says why."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "app")
NOT_PRIVATE = {"_"}  # gettext's marker (app.i18n)

# (importing module, imported module, name): why it may
ALLOWED = {
    ("engine.lanes", "engine", "_lanes"): "the compiled C extension, which lanes.py wraps",
    ("engine.libm", "engine", "_libm"): "the compiled C extension, which libm.py wraps",
    ("engine.compute.cpu_api", "engine.core.tensor_data", "_element_view"):
        "ggml-cpu's element access, left for the compute room's pass of this refactor",
    ("engine.compute.cpu_api", "engine.core.tensor_data", "_from_f32"):
        "ggml-cpu's element access, left for the compute room's pass of this refactor",
    ("engine.compute.cpu_api", "engine.core.tensor_data", "_to_f32"):
        "ggml-cpu's element access, left for the compute room's pass of this refactor",
    ("engine.trace.backend", "engine.backend.buffer", "_BUFFERS"):
        "the recorder walks the buffers in the order made, with the freed ones; left for the "
        "trace room's pass of this refactor (backend.buffer.live_buffers() is the public view)",
}


def _module_name(path: Path) -> tuple[str, list[str]]:
    """A file's module name, and the package its relative imports start from."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
        return ".".join(parts), parts
    return ".".join(parts), parts[:-1]


def private_imports() -> set[tuple[str, str, str]]:
    """Every (importing module, imported module, private name) in the packages."""
    found = set()
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name, package = _module_name(path)
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if not isinstance(node, ast.ImportFrom):
                    continue
                base = node.module or ""
                if node.level:
                    base = ".".join(package[:len(package) - node.level + 1] + ([base] if base else []))
                for a in node.names:
                    private = a.name.startswith("_") and not a.name.startswith("__")
                    if private and a.name not in NOT_PRIVATE:
                        found.add((name, base, a.name))
    return found


def test_no_module_imports_another_modules_private_name():
    unexplained = sorted(private_imports() - ALLOWED.keys())
    assert not unexplained, ("private names imported across modules (make them public, or say "
                             f"in ALLOWED why not): {unexplained}")


def test_every_exception_is_still_needed():
    stale = sorted(ALLOWED.keys() - private_imports())
    assert not stale, f"no longer imported: remove them from ALLOWED: {stale}"


def test_the_reader_finds_a_private_import(tmp_path, monkeypatch):
    """The reader sees relative and absolute imports, inside functions too, and leaves `_` and
    dunder names alone."""
    pkg = tmp_path / "engine" / "room"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\nfrom .b import _hidden, shown\n"
                              "def f():\n    from engine.room.b import _inner as x\n"
                              "from app.i18n import _\nfrom .b import __version__\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PACKAGES", ("engine",))
    assert private_imports() == {("engine.room.a", "engine.room.b", "_hidden"),
                                 ("engine.room.a", "engine.room.b", "_inner")}
