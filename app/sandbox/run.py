"""Running a learner's program: in a worker process with limits, never in the server.

`run_program(source, threads)` checks the program (check.py), starts `python -m
app.sandbox.worker` in a new session with hard limits on memory, CPU time, file size and open
files, a scratch directory as its working directory and a bare environment, waits at most the
wall-clock limit (then kills the whole session), reads at most the trace limit from its output,
and unpickles the trace with an unpickler that makes only the engine's step records. Inside the
worker the program meets the same limits as exceptions, so what it did before a limit stays
steppable.

What this does not guarantee: it is not a kernel sandbox (no seccomp, namespaces or separate
user). A flaw in CPython or numpy that lets Python code reach raw memory without the names the
gate refuses would run with the server's user rights, inside the limits. Serve the playground
beyond localhost (`--allow-programs`) only where that risk is acceptable.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from app.sandbox.check import check_program
from engine.trace import Trace

@dataclass(frozen=True, slots=True)
class Limits:
    cpu: int = 30  # seconds of CPU time the program may use (all threads)
    wall: int = 45  # seconds it may run
    memory: int = 3 << 30  # bytes of address space of the whole worker (numpy and the engine take ~1 GB)
    output: int = 64 << 10  # characters it may print
    steps: int = 5_000  # steps its trace may have
    trace: int = 64 << 20  # bytes of its pickled trace
    file_size: int = 16 << 20  # bytes of any file it writes in its scratch directory
    startup: int = 20  # seconds of CPU the worker may spend starting (imports) before the program


class ProgramFailed(Exception):
    """The worker could not give a trace (a limit killed it, or the trace was too large)."""


SAFE_CLASSES = {("engine.trace", "Trace")}
SAFE_MODULES = ("engine.steps",)


class TraceUnpickler(pickle.Unpickler):
    """Makes nothing but the trace's own records: a worker's output is never trusted."""

    def find_class(self, module: str, name: str):
        if (module, name) in SAFE_CLASSES or (module in SAFE_MODULES and not name.startswith("_")):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"a trace holds no {module}.{name}")


def run_program(source: str, threads: int, limits: Limits = Limits(), check: bool = True) -> Trace:
    """The program's trace (ProgramRefused before running, ProgramFailed if no trace came back).
    `check=False` skips the server's check (the tests use it to show the worker's own gate)."""
    if check:
        check_program(source)
    scratch = Path(tempfile.mkdtemp(prefix="ggml-lens-program-"))
    try:
        return _run(source, threads, limits, scratch, check)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(source: str, threads: int, limits: Limits, scratch: Path, check: bool) -> Trace:
    def set_limits() -> None:  # in the child, before it runs Python
        cpu = limits.startup + limits.cpu + 5
        for what, value in ((resource.RLIMIT_AS, limits.memory), (resource.RLIMIT_CPU, cpu),
                            (resource.RLIMIT_FSIZE, limits.file_size), (resource.RLIMIT_NOFILE, 256),
                            (resource.RLIMIT_CORE, 0)):
            resource.setrlimit(what, (value, value))

    env = {"PATH": "/usr/bin:/bin",
           "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "LANG": "C.UTF-8"}
    request = json.dumps({"source": source, "threads": threads, "limits": asdict(limits),
                          "check": check}).encode()
    proc = subprocess.Popen([sys.executable, "-I", "-m", "app.sandbox.worker"], cwd=scratch, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            preexec_fn=set_limits, start_new_session=True, close_fds=True)
    chunks: list[bytes] = []
    cap = limits.trace + (1 << 20)

    def read() -> None:
        n = 0
        while n <= cap:
            b = proc.stdout.read(1 << 20)
            if not b:
                return
            chunks.append(b)
            n += len(b)
        _kill(proc)  # more than any trace may be: whatever it is, it is not read

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        proc.stdin.write(request)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    reader.join(limits.wall + limits.startup + 10)
    if reader.is_alive():
        _kill(proc)
        reader.join(5)
        raise ProgramFailed(f"the program ran longer than {limits.wall} s and was stopped")
    code = proc.wait()
    data = b"".join(chunks)
    if len(data) > cap:
        raise ProgramFailed("the worker wrote more than a trace may hold and was stopped")
    if code < 0 or not data:
        raise ProgramFailed(_killed_by(-code if code < 0 else 0, limits))
    if data[:1] == b"E":
        raise ProgramFailed(data[1:4096].decode("utf-8", "replace"))
    try:
        trace = TraceUnpickler(io.BytesIO(data[1:])).load()
    except Exception as e:  # noqa: BLE001 - anything a broken or hostile worker wrote
        raise ProgramFailed(f"the worker's trace could not be read: {e}") from None
    if not isinstance(trace, Trace):
        raise ProgramFailed("the worker returned something that is not a trace")
    return trace


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _killed_by(sig: int, limits: Limits) -> str:
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return f"the program used more than {limits.cpu} s of CPU time and was stopped"
    if sig == signal.SIGSEGV:
        return (f"the worker crashed (most likely out of memory: the limit is "
                f"{limits.memory >> 20:,} MB)")
    if sig == 0:
        return (f"the worker stopped without a trace (most likely out of memory: the limit is "
                f"{limits.memory >> 20:,} MB)")
    return f"the worker was stopped by signal {signal.Signals(sig).name}"
