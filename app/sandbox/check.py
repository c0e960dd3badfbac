"""The first gate a learner's program passes: read, never run.

A program is parsed, then its syntax tree is walked: only the ggml facades, engine.resources,
the model builders and walkthroughs, numpy and math may be imported, and names and attributes
that lead to the interpreter's internals (any `_`-prefixed attribute, `eval`, `getattr`, frame
and code attributes, numpy's pickle, memory-map and pointer functions, `str.format`'s attribute
lookups) are refused, each with its line and a sentence saying what is allowed. The worker
(app/sandbox/worker.py) enforces the same rules again at run time. Neither is the boundary: the
kernel is (boundary.py); these explain early, at the line, what a program here is for.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

# what a program may import: the headers' facades, C's float functions (sinf, expf, …), the doors
# to files (engine.resources), the simulated second device, numpy and math; and the model
# builders, tokenizers and walkthroughs, by prefix
FACADES = ("engine.ggml", "engine.ggml_alloc", "engine.ggml_backend", "engine.ggml_cpu", "engine.ggml_opt",
           "engine.libm", "engine.resources", "engine.backend.accel")
MODULES = (*FACADES, "numpy", "math")
PREFIXES = ("engine.models.", "engine.programs.")


def importable(name: str | None) -> bool:
    return name is not None and (name in MODULES or name.startswith(PREFIXES))

# builtins that reach the interpreter, the file system or the terminal
REFUSED_NAMES = frozenset({
    "eval", "exec", "compile", "__import__", "getattr", "setattr", "delattr", "hasattr",
    "globals", "locals", "vars", "dir", "breakpoint", "input", "help", "exit", "quit", "memoryview",
    "copyright", "credits", "license", "classmethod", "staticmethod", "property", "super", "type",
    "object",
})
# attributes that reach frames, code, the file system or raw memory (besides every `_` name)
REFUSED_ATTRIBUTES = frozenset({
    # frames, code objects, generators and coroutines, tracebacks
    "gi_frame", "gi_code", "gi_yieldfrom", "gi_running", "cr_frame", "cr_code", "cr_await",
    "ag_frame", "ag_code", "ag_await", "f_back", "f_builtins", "f_code", "f_globals", "f_locals",
    "f_trace", "tb_frame", "tb_next", "co_code", "co_consts", "co_names", "mro", "with_traceback",
    # string formatting that looks attributes up by name ("{0.__class__}".format(x))
    "format", "format_map",
    # numpy: raw pointers, pickles, files, memory maps, compiled code
    "ctypes", "ctypeslib", "tofile", "dump", "dumps", "load", "loads", "save", "savez",
    "savez_compressed", "savetxt", "loadtxt", "genfromtxt", "memmap", "open_memmap", "lib", "f2py",
    "distutils", "testing", "DataSource", "fromregex", "from_dlpack",
})


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a program was not run: where (1-based line, 0-based column) and the rule."""

    line: int
    column: int
    message: str
    syntax: bool = False  # a syntax error (the program could not even be read)

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


class ProgramRefused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        self.refusal = refusal
        super().__init__(str(refusal))


ALLOWED = ("a program may import only " + ", ".join(MODULES) + ", engine.models.* and engine.programs.* "
           "(as the walkthroughs do: "
           "`from engine.ggml import *`, `import numpy as np`, `import math`), and may not use "
           "names or attributes that start with `_`, nor eval, exec, compile, getattr and the "
           "other builtins that reach the interpreter; numpy's pickle, memory-map and pointer "
           "functions are refused too")


def check_program(source: str) -> ast.Module:
    """The program's syntax tree, if it may run; ProgramRefused (with the line) otherwise."""
    try:
        tree = ast.parse(source, filename="program.py")
    except SyntaxError as e:
        raise ProgramRefused(Refusal(e.lineno or 1, max((e.offset or 1) - 1, 0),
                                     f"SyntaxError: {e.msg}", syntax=True)) from None
    except ValueError as e:  # a NUL byte in the source
        raise ProgramRefused(Refusal(1, 0, f"SyntaxError: {e}", syntax=True)) from None
    refused = [(_where(node), why) for node in ast.walk(tree) if (why := _why_refused(node)) is not None]
    if refused:  # the first in reading order (in a chain a.b.c: a.b before .c)
        (line, column, _), why = min(refused, key=lambda r: r[0])
        raise ProgramRefused(Refusal(line, column, f"{why}; {ALLOWED}"))
    return tree


def is_module(tree: ast.Module) -> bool:
    """A module whose run(n_threads) the debugger calls, like a walkthrough; else a script, whose
    statements are the program (it reads `n_threads`; the tensors it leaves in its variables are
    its outputs)."""
    return any(isinstance(n, ast.FunctionDef) and n.name == "run" for n in tree.body)


def _where(node: ast.AST) -> tuple[int, int, int]:
    return (getattr(node, "lineno", 1), getattr(node, "col_offset", 0),
            getattr(node, "end_col_offset", 0) or 0)


def _why_refused(node: ast.AST) -> str | None:
    if isinstance(node, ast.Import):
        for alias in node.names:
            if not importable(alias.name):
                return f"`import {alias.name}` is refused"
    elif isinstance(node, ast.ImportFrom):
        if node.level or not importable(node.module):
            return f"`from {'.' * node.level}{node.module or ''} import …` is refused"
        for alias in node.names:
            if alias.name.startswith("_"):
                return f"importing `{alias.name}` is refused"
    elif isinstance(node, ast.Name):
        if node.id.startswith("_") and node.id != "_":  # (a lone `_` is a name for what is not used)
            return f"the name `{node.id}` is refused (names starting with `_` reach the interpreter)"
        if node.id in REFUSED_NAMES:
            return f"`{node.id}` is refused"
    elif isinstance(node, ast.Attribute):
        if node.attr.startswith("_"):
            return (f"the attribute `.{node.attr}` is refused (attributes starting with `_` reach "
                    f"the interpreter)")
        if node.attr in REFUSED_ATTRIBUTES:
            return f"the attribute `.{node.attr}` is refused"
    elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if node.name.startswith("_"):
            return f"the name `{node.name}` is refused (names starting with `_` reach the interpreter)"
        if isinstance(node, ast.ClassDef) and node.keywords:
            return "a class with keywords (a metaclass) is refused"
        if isinstance(node, ast.AsyncFunctionDef):
            return "async functions are refused"
    elif isinstance(node, ast.arg) and node.arg.startswith("_"):
        return f"the parameter `{node.arg}` is refused (names starting with `_` reach the interpreter)"
    elif isinstance(node, ast.keyword) and node.arg is not None and node.arg.startswith("_"):
        return f"the keyword `{node.arg}` is refused"
    elif isinstance(node, (ast.Global, ast.Nonlocal)):
        if any(n.startswith("_") for n in node.names):
            return "names starting with `_` are refused"
    elif isinstance(node, (ast.Await, ast.Yield, ast.YieldFrom)):
        return "generators and coroutines are refused (their frames reach the interpreter)"
    elif isinstance(node, ast.alias) and node.asname is not None and node.asname.startswith("_"):
        return f"the name `{node.asname}` is refused"
    elif isinstance(node, ast.MatchClass | ast.MatchMapping):
        return "class and mapping patterns are refused"
    return None
