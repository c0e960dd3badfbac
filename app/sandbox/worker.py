"""`python -m app.sandbox.worker SCRATCH`: record one learner's program, in a process of its own.

The web server starts this module (app/sandbox/run.py) with hard resource limits already set and
the scratch directory as its working directory. It reads the request (JSON: the program, the
thread count, the limits) on stdin and writes the result on stdout: b"T" and a pickled Trace, or
b"E" and a message. Before the program runs, the gate closes:

- everything the engine will need is imported, then any further import is refused;
- an audit hook (which cannot be removed) refuses opening files for writing outside the scratch
  directory and reading outside it and Python's own installation, subprocesses, fork and exec,
  sockets, and loading or calling C code through ctypes;
- the program's builtins lack open, eval, exec, getattr and the rest check.py refuses, and its
  imports give restricted copies of the allowed modules;
- a CPU-time and a wall-clock alarm, the printed-output limit and the step cap raise
  ProgramStopped inside the program, so the trace keeps every step before it.
"""

from __future__ import annotations

import ast
import builtins
import importlib
import io
import json
import os
import pickle
import pkgutil
import resource
import signal
import sys
import types
from pathlib import Path

import numpy as np

import engine
from app.sandbox.check import FACADES, REFUSED_ATTRIBUTES, REFUSED_NAMES, check_program
from engine.errors import ProgramStopped

PROGRAM_FILE = "program.py"
NUMPY_SUBMODULES = ("random", "linalg", "fft")
REFUSED_EVENTS = ("os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
                  "os.kill", "os.killpg", "os.putenv", "os.unsetenv", "subprocess.", "pty.", "socket.",
                  "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.call_function",
                  "ctypes.set_errno", "ctypes.get_errno", "sys.remote_exec", "webbrowser.", "urllib.",
                  "http.", "ftplib.", "smtplib.", "import", "winreg.", "_posixsubprocess.",
                  "os.chdir", "os.chroot", "os.setuid", "os.setgid", "resource.setrlimit", "signal.")
PATH_EVENTS = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
               "os.symlink", "os.truncate", "os.utime", "os.listdir", "os.scandir", "shutil.", "glob.",
               "os.listxattr", "os.getxattr", "os.setxattr", "os.removexattr", "os.walk", "os.fwalk")
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


class BoundedText(io.TextIOBase):
    """The program's stdout and stderr: kept up to `limit` characters, then ProgramStopped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        self.size += len(s)
        if self.size > self.limit:
            raise ProgramStopped(f"the program printed more than {self.limit:,} characters")
        self.parts.append(s)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def preload() -> None:
    """Import the engine's modules now (not the walkthroughs or models, which read files and
    other packages), so nothing the program calls imports later."""
    for info in pkgutil.walk_packages(engine.__path__, "engine."):
        if not info.name.startswith(("engine.programs", "engine.models")):
            importlib.import_module(info.name)


def restricted_module(name: str) -> types.ModuleType:
    """A copy of an allowed module holding its public names, less the refused attributes."""
    real = importlib.import_module(name)
    names = getattr(real, "__all__", None) or [n for n in vars(real) if not n.startswith("_")]
    out = types.ModuleType(name)
    for n in names:
        if n.startswith("_") or n in REFUSED_ATTRIBUTES:
            continue
        value = getattr(real, n)
        if isinstance(value, types.ModuleType):
            if name == "numpy" and n in NUMPY_SUBMODULES:
                value = restricted_module(f"numpy.{n}")
            else:
                continue
        setattr(out, n, value)
    out.__all__ = [n for n in vars(out) if not n.startswith("_")]
    return out


def restricted_builtins(modules: dict[str, types.ModuleType]) -> dict:
    """The builtins a program sees: the safe ones, and an import that hands out the copies."""
    safe = {n: v for n, v in vars(builtins).items() if not n.startswith("_") and n not in REFUSED_NAMES}
    package = types.ModuleType("engine")  # `import engine.ggml` binds this package copy
    for name, mod in modules.items():
        if name.startswith("engine."):
            setattr(package, name.split(".", 1)[1], mod)

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: A002
        if level or name not in modules:
            raise ImportError(f"the playground may import only {', '.join(modules)}, not {name!r}")
        if name.startswith("engine.") and not fromlist:
            return package
        return modules[name]

    safe["__import__"] = guarded_import
    safe["__build_class__"] = builtins.__build_class__  # class statements (a struct, as in C)
    safe["__name__"] = "builtins"
    return safe


def close_the_gate(scratch: Path) -> None:
    """Install the audit hook: from here on, the process may touch only its scratch directory."""
    scratch = scratch.resolve()
    readable = tuple({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   Path(engine.__file__).parent, Path(np.__file__).parent)})

    def inside(path, roots) -> bool:
        if isinstance(path, int):  # an already open descriptor
            return False
        try:
            p = Path(os.fsdecode(path)).resolve()
        except (TypeError, ValueError, OSError):
            return False
        return any(p == r or r in p.parents for r in roots)

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None, None))[:3]
            writes = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & WRITE_FLAGS)
            if not inside(path, (scratch,)) and (writes or not inside(path, readable)):
                raise PermissionError(f"the sandbox refuses to open {path!r}: a program may use files "
                                      f"only in its scratch directory")
        elif event.startswith(REFUSED_EVENTS):
            raise PermissionError(f"the sandbox refuses {event}: no processes, network, C calls or "
                                  f"imports beyond the facades, numpy and math")
        elif event.startswith(PATH_EVENTS):
            if not all(inside(a, (scratch,)) for a in args[:1] if isinstance(a, (str, bytes, os.PathLike))):
                raise PermissionError(f"the sandbox refuses {event} outside the scratch directory")

    sys.addaudithook(hook)


def stop_with(message: str):
    def handler(signum, frame):
        raise ProgramStopped(message)
    return handler


def main() -> None:
    scratch = Path.cwd()
    request = json.loads(sys.stdin.buffer.read(4 << 20))
    source, n_threads = request["source"], int(request["threads"])
    limits = request["limits"]
    out = sys.stdout.buffer
    printed = BoundedText(int(limits["output"]))

    # the server checked it, and a worker checks again; only the sandbox's own tests turn this
    # off, to show that the gate below stops what the check would have refused
    tree = check_program(source) if request.get("check", True) else ast.parse(source)
    path = scratch / PROGRAM_FILE
    path.write_text(source, encoding="utf-8")
    code = compile(tree, str(path), "exec")
    preload()
    from engine.trace import record

    modules = {name: restricted_module(name) for name in (*FACADES, "numpy", "math")}
    namespace = {"__name__": "program", "__builtins__": restricted_builtins(modules)}

    def program(n_threads: int) -> dict:
        exec(code, namespace)  # noqa: S102 - the checked program, under the gate
        return namespace["run"](n_threads=n_threads)

    signal.signal(signal.SIGXCPU, stop_with(f"the program used more than {limits['cpu']} s of CPU time"))
    signal.signal(signal.SIGALRM, stop_with(f"the program ran longer than {limits['wall']} s"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a too large file is an OSError, not a kill
    cpu_hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    used = int(usage.ru_utime + usage.ru_stime)  # the imports' CPU time: the program's comes after
    resource.setrlimit(resource.RLIMIT_CPU, (used + int(limits["cpu"]), cpu_hard))
    signal.alarm(int(limits["wall"]))
    sys.stdout = sys.stderr = printed
    close_the_gate(scratch)
    trace = record(program, str(path), "program", n_threads, step_cap=int(limits["steps"]))
    signal.alarm(0)
    trace.printed = printed.text()
    data = pickle.dumps(trace, protocol=5)
    if len(data) > int(limits["trace"]):
        out.write(b"E" + (f"the trace is {len(data):,} bytes, more than the limit of "
                          f"{int(limits['trace']):,}: record fewer steps or smaller tensors").encode())
    else:
        out.write(b"T" + data)
    out.flush()


if __name__ == "__main__":
    try:
        main()
    except MemoryError:
        sys.__stdout__.buffer.write(b"E" + b"the program ran out of memory")
    except BaseException as e:  # noqa: BLE001 - whatever stops the worker, the server is told why
        sys.__stdout__.buffer.write(b"E" + f"{type(e).__name__}: {e}".encode())
    sys.__stdout__.flush()
    os._exit(0)
