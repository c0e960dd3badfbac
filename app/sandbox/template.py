"""A file's chat template rendered in a child process, bounded in time, memory and output.

A GGUF file's chat template is a Jinja program its author wrote, and an uploaded file's author is
anyone: nested loops that never end, `'a' * 2**31` (which Jinja folds into a constant while it
compiles), a vocabulary of millions of merges that its tokenizer must read first. None of that
runs in the server. `render_chat(path, messages)` starts `app/sandbox/template_worker.py` in a
process of its own, which limits its own address space and CPU seconds before it reads the file,
builds the tokenizer when need be, compiles and renders the template in Jinja's immutable sandbox
with its output capped, and writes back plain JSON. The server waits at most `wall` seconds,
then kills the worker's process group; it reads at most REPLY_BYTES of its reply and checks
every field's type. While a worker runs, the request's thread waits on a pipe: the server keeps
answering, and a SIGTERM stops it within `wall` seconds.

Why not the learners' boundary (boundary.py: bubblewrap, seccomp, another uid)? A template is
not native code: Jinja's sandbox already refuses every attribute and call outside a safe few, so
what a template can do is use time and memory, and rlimits with a wall-clock kill bound those.
The worker must also read the file, which the learners' boundary keeps out on purpose, and the
Chat tab must work where the playground's boundary cannot be set up.

The BOS and EOS texts a worker sends back are kept per file (its identity: device, inode, size,
modification time), so a file's tokenizer is built once, not at every message.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache

import app
from app.i18n import _
from engine.models.chat import ChatTokens

BOOT = ("import runpy, sys; sys.path.insert(0, sys.argv[1]); "
        "runpy.run_module('app.sandbox.template_worker', run_name='__main__', alter_sys=True)")
REPLY_BYTES = 2 << 20  # the most read of a reply (a capped rendering, escaped: well under this)
AT_ONCE = 2  # workers rendering at the same time
SLOT_WAIT = 1.0  # seconds a request waits for a free worker slot before it is told to retry
KEPT_FILES = 64  # files whose BOS and EOS texts are kept
# the replies a worker may write (template_worker.py), by their first field: each one's fields
REPLIES = {"prompt": {"prompt": str, "bos": str, "eos": str},  # the rendering
           "error": {"error": str},  # the engine's message: what the file breaks
           "limit": {"limit": str}}  # the limit the worker ran into ("memory")


@dataclass(frozen=True, slots=True)
class TemplateLimits:
    cpu: int = 3  # seconds of CPU a worker may use: Python's start, the tokenizer, the template
    wall: float = 4.0  # seconds it may run, start to reply
    memory: int = 1 << 30  # bytes of address space besides the file's mapping


class TemplateRefused(ValueError):
    """The template could not be rendered within the limits, or the file breaks a rule (the
    message says which)."""


class TemplatesBusy(Exception):
    """Every worker slot stayed taken for the wait allowed."""


@dataclass(frozen=True, slots=True)
class _File:
    """A file by its identity: another file at the same path is another key."""

    path: str
    dev: int
    ino: int
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path) -> _File:
        st = os.stat(path)
        return cls(os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


_SPECIALS: LRUCache = LRUCache(KEPT_FILES)  # _File -> ChatTokens, from a worker's reply
_LOCK = threading.Lock()
_SLOTS = threading.BoundedSemaphore(AT_ONCE)


def render_chat(path: Path, messages: list[dict], limits: TemplateLimits = TemplateLimits()) -> str:
    """The conversation as the file's chat template renders it (TemplateRefused: why not;
    TemplatesBusy: no worker free in time)."""
    file = _File.of(path)
    with _LOCK:
        known = _SPECIALS.get(file)
    request = {"path": file.path, "messages": messages, "cpu": limits.cpu,
               "memory": limits.memory + file.size,  # (the worker maps the file)
               "specials": None if known is None else {"bos": known.bos, "eos": known.eos}}
    if not _SLOTS.acquire(timeout=SLOT_WAIT):
        raise TemplatesBusy()
    try:
        out, status, timed_out = _run(json.dumps(request).encode(), limits)
    finally:
        _SLOTS.release()
    if len(out) <= REPLY_BYTES and (timed_out or status in (-signal.SIGXCPU, -signal.SIGKILL)):
        raise TemplateRefused(_("The chat template did not finish within {wall} s ({cpu} s of "
                                "CPU), the most a template may take.").format(wall=limits.wall,
                                                                             cpu=limits.cpu))
    reply = _reply(out, status)
    if "limit" in reply:
        raise TemplateRefused(_("The chat template needs more than {mib} MiB of memory, the most "
                                "a template may use.").format(mib=limits.memory >> 20))
    if "error" in reply:
        raise TemplateRefused(reply["error"])
    with _LOCK:
        _SPECIALS[file] = ChatTokens(reply["bos"], reply["eos"])
    return reply["prompt"]


def _run(request: bytes, limits: TemplateLimits) -> tuple[bytes, int, bool]:
    """Start a worker, send the request, read its reply until it ends or `wall` passes: (at most
    REPLY_BYTES + 1 bytes of its stdout, its exit status, whether the wall-clock limit killed it).
    No worker outlives this call."""
    root = str(Path(os.path.abspath(app.__file__)).parent.parent)  # the packages this server runs
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    deadline = time.monotonic() + limits.wall
    proc = subprocess.Popen([sys.executable, "-I", "-c", BOOT, root, "chat-template"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                            env=env, cwd="/")
    stdin, stdout = proc.stdin, proc.stdout
    assert stdin is not None and stdout is not None  # (pipes)
    got = bytearray()
    timed_out = False
    try:
        stdin.write(request)  # (a few hundred bytes: the pipe takes them at once)
        stdin.close()
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            while len(got) <= REPLY_BYTES:
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                if not sel.select(left):
                    continue
                chunk = os.read(stdout.fileno(), 1 << 16)
                if not chunk:  # the worker closed its output: it is ending
                    break
                got += chunk
        if len(got) > REPLY_BYTES:  # (more than any reply: whatever it is, it is not read)
            _kill(proc)
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
    finally:
        if proc.returncode is None:
            _kill(proc)
            proc.wait()
        stdout.close()
    return bytes(got), proc.returncode, timed_out


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # (its own session: whatever it started goes too)
    except (ProcessLookupError, PermissionError):
        pass


def _reply(out: bytes, status: int) -> dict:
    """The worker's reply, every field checked: one of REPLIES, or TemplateRefused."""
    try:
        if len(out) > REPLY_BYTES:
            raise ValueError(f"more than {REPLY_BYTES} bytes")
        reply = json.loads(out)
        fields = next((f for kind, f in REPLIES.items() if kind in reply), None) \
            if isinstance(reply, dict) else None
        if status != 0 or fields is None or set(reply) != set(fields) or \
                not all(isinstance(reply[k], t) for k, t in fields.items()):
            raise ValueError(f"exit status {status}, {str(reply)[:80]}")
        if "prompt" in reply:
            reply["prompt"].encode("utf-8")  # (bytes that were not UTF-8 cannot be a prompt)
    except UnicodeEncodeError:
        raise TemplateRefused(_("The chat template wrote bytes that are not UTF-8 text.")) from None
    except ValueError as e:  # (json's errors too)
        raise TemplateRefused(_("The chat template's worker stopped without a usable answer "
                                "({why}).").format(why=e)) from None
    return reply
