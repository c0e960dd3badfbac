"""Running a learner's program: in a confined worker process, never in the server.

`run_program(source, threads)` checks the program (check.py: a teaching aid that says early what
would be refused), starts the worker behind the kernel boundary (boundary.py), sends it the
request on stdin, waits at most the wall-clock limit (then kills bwrap's process group, and with
it the worker's PID namespace), reads at most `Limits.trace` bytes of its output, and decodes that
output as plain data (wire.py): the server never unpickles or executes anything a worker wrote.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from dataclasses import asdict

from app.sandbox.boundary import Boundary, BoundaryMissing, Limits, boundary, worker_env
from app.sandbox.check import check_program
from app.sandbox.wire import MalformedResult, decode
from engine.trace import Trace

__all__ = ["BoundaryMissing", "Limits", "ProgramFailed", "run_program", "start_worker"]

STDERR_KEPT = 8 << 10
STARTUP_WALL = 10  # seconds a worker may take to start (besides the program's wall-clock limit)


class ProgramFailed(Exception):
    """The worker could not give a trace (a limit killed it, or its output was refused)."""


def run_program(source: str, threads: int, limits: Limits = Limits(), gate: bool = True,
                unconfined: bool = False) -> Trace:
    """The program's trace (ProgramRefused before running, ProgramFailed if no trace came back,
    BoundaryMissing if the kernel boundary cannot be set up). `gate=False` turns off the check
    and the worker's Python gate: the sandbox's tests show the boundary holds without them."""
    if gate:
        check_program(source)
    b = boundary(unconfined)
    out, _, code, timed_out = start_worker(b, limits, {"source": source, "threads": threads,
                                                       "limits": asdict(limits), "gate": gate})
    if timed_out:
        raise ProgramFailed(f"the program ran longer than {limits.wall} s and was stopped")
    if len(out) > limits.trace:
        raise ProgramFailed("the worker wrote more than a trace may hold and was stopped")
    sig = -code if code < 0 else code - 128 if code > 128 else 0
    if sig or not out:
        raise ProgramFailed(_killed_by(sig, limits))
    try:
        result = decode(out, limits)
    except MalformedResult as e:
        raise ProgramFailed(f"the worker's output was refused: {e}") from None
    if isinstance(result, str):
        raise ProgramFailed(result)
    return result


def start_worker(b: Boundary, limits: Limits, request: dict) -> tuple[bytes, bytes, int, bool]:
    """Run one worker to its end: (stdout, at most limits.trace + 1 bytes of it; the head of
    stderr; the exit status; whether the wall-clock limit stopped it)."""
    request = {**request, "seccomp": base64.b64encode(b.bpf).decode(), "seccomp_nr": b.seccomp_nr,
               "drop_to": b.drop_to}
    scratch = None if b.confined else tempfile.mkdtemp(prefix="ggml-lens-program-")
    try:
        return _communicate(b, limits, request, scratch)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _communicate(b: Boundary, limits: Limits, request: dict, scratch: str | None):
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"} if b.confined else worker_env()
    proc = subprocess.Popen(b.command(limits), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, preexec_fn=b.preexec(limits), start_new_session=True,
                            close_fds=True, env=env, cwd=scratch or "/")
    out: list[bytes] = []
    err: list[bytes] = []

    def read(stream, into: list[bytes], cap: int) -> None:
        n = 0
        while chunk := stream.read(1 << 16):
            if n <= cap:
                into.append(chunk[:cap + 1 - n])
                n += len(chunk)
            elif into is out:  # more than any trace may be: whatever it is, it is not read
                _kill(proc)
                return

    readers = [threading.Thread(target=read, args=(proc.stdout, out, limits.trace), daemon=True),
               threading.Thread(target=read, args=(proc.stderr, err, STDERR_KEPT), daemon=True)]
    for r in readers:
        r.start()
    try:
        proc.stdin.write(json.dumps(request).encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass
    timed_out = False
    try:
        proc.wait(STARTUP_WALL + limits.wall)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill(proc)
        proc.wait()
    for r in readers:
        r.join(5)
    return b"".join(out), b"".join(err), proc.returncode, timed_out


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
    try:
        return f"the worker was stopped by signal {signal.Signals(sig).name}"
    except ValueError:
        return f"the worker stopped with status {128 + sig}"
