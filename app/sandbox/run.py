"""Running a learner's program: in a confined worker process, never in the server.

`run_program(source, threads)` checks the program (check.py: a teaching aid that says early what
would be refused), starts the worker behind the kernel boundary (boundary.py), sends it the
request on stdin, waits at most the wall-clock limit (then kills bwrap's process group, and with
it the worker's PID namespace), reads at most `Limits.trace` bytes of its output, and decodes that
output as plain data (wire.py): the server never unpickles or executes anything a worker wrote.
"""

from __future__ import annotations

import signal
from dataclasses import asdict
from pathlib import Path

from app.sandbox.boundary import BoundaryMissing, Limits, boundary, start_worker
from app.sandbox.check import check_program
from app.sandbox.wire import MalformedResult, decode
from app.store import file_identity
from engine.trace import Trace

__all__ = ["BoundaryMissing", "Limits", "ProgramFailed", "run_program"]


class ProgramFailed(Exception):
    """The worker could not give a trace (a limit killed it, or its output was refused)."""


def run_program(source: str, threads: int, limits: Limits = Limits(), gate: bool = True,
                unconfined: bool = False, model: Path | None = None) -> Trace:
    """The program's trace (ProgramRefused before running, ProgramFailed if no trace came back,
    BoundaryMissing if the kernel boundary cannot be set up). `gate=False` turns off the check
    and the worker's Python gate: the sandbox's tests show the boundary holds without them.
    `model`: the bundled model's file, which the worker may read (a copy of the gemma3 walkthrough);
    the worker refers to its mapped pages by the digest it is given here, and that file alone."""
    if gate:
        check_program(source)
    b = boundary(unconfined)
    request = {"source": source, "threads": threads, "limits": asdict(limits), "gate": gate}
    files: dict[str, Path] = {}  # digest -> the file the worker may refer to
    if model is not None and model.is_file():
        digest = request["model"] = file_identity(model)
        files[digest] = model
    out, err, code, timed_out = start_worker(b, limits, request, model)
    if timed_out:
        raise ProgramFailed(f"the program ran longer than {limits.wall} s and was stopped")
    if len(out) > limits.trace:
        raise ProgramFailed("the worker wrote more than a trace may hold and was stopped")
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig or not out:
        raise ProgramFailed(_killed_by(sig, code, limits) + _said(err))
    try:
        result = decode(out, limits, files.get)
    except MalformedResult as e:
        raise ProgramFailed(f"the worker's output was refused: {e}") from None
    if isinstance(result, str):
        raise ProgramFailed(result)
    return result


STDERR_SHOWN = 1500  # characters of the worker's stderr a failure shows (its end: the cause)


def _said(err: bytes) -> str:
    """What the worker (or bubblewrap, before it) wrote to stderr, for a failure's message."""
    text = err.decode("utf-8", "replace").strip()
    if not text:
        return ""
    return "; it said: " + (text if len(text) <= STDERR_SHOWN else "…" + text[-STDERR_SHOWN:])


def _killed_by(sig: int, code: int, limits: Limits) -> str:
    """Why a worker gave no trace, from how it ended (its stderr follows: the cause it gave)."""
    if sig in (signal.SIGXCPU, signal.SIGKILL):
        return f"the program used more than {limits.cpu} s of CPU time and was stopped"
    if sig == signal.SIGSEGV:
        return (f"the worker crashed (most likely out of memory: the limit is "
                f"{limits.memory >> 20:,} MB)")
    if sig == 0 and code != 0:
        return f"the worker could not run the program (exit status {code})"
    if sig == 0:
        return (f"the worker stopped without a trace (most likely out of memory: the limit is "
                f"{limits.memory >> 20:,} MB)")
    try:
        return f"the worker was stopped by signal {signal.Signals(sig).name}"
    except ValueError:
        return f"the worker stopped with status {128 + sig}"
