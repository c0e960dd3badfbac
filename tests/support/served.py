"""The app as a learner starts it, in a process of its own: `make run` in the checkout (its
defaults: the relative data directory `var`, the bundled model, no GGML_LENS_* variable), or
`ggml-lens serve` with settings of a test's choosing. What the red-team tests measure of it: how
fast it answers, how much its memory grew, and which processes it left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import httpx

from tests.support.classroom import _descendants, _listens, _wait
from tests.support.rpc_server import _free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout: where `make run` is typed
STARTUP = 120  # seconds the server may take to start (make checks its set-up first)


def rss(pid: int) -> int:
    """Bytes of a process's resident memory (VmRSS), 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class Served:
    """A running server: its URL, its process (the one that serves: `ggml-lens serve`) and its log."""

    url: str
    proc: subprocess.Popen
    log: Path

    @property
    def server_pid(self) -> int:
        """The pid of the serving Python process (under `make`, its child)."""
        for pid in [self.proc.pid, *_descendants(self.proc.pid)]:
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(part.endswith(b"ggml-lens") for part in cmd) and b"serve" in cmd:
                return pid
        raise RuntimeError(f"no ggml-lens serve process under {self.proc.pid}: {self.log_text()}")

    def rss(self) -> int:
        return rss(self.server_pid)

    def children(self) -> list[int]:
        """The processes the server started that are still running (workers, bubblewrap, dot)."""
        return _descendants(self.server_pid)

    def no_children_within(self, seconds: float) -> list[int]:
        """Wait up to `seconds` for the server's children to end; those still there."""
        deadline = time.monotonic() + seconds
        while (left := self.children()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return left

    def alive(self) -> bool:
        return self.proc.poll() is None and rss(self.server_pid) > 0

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:] if self.log.exists() else ""

    def client(self, timeout: float = 5.0) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout, follow_redirects=False)


def _clean_env(extra: dict[str, str] | None) -> dict[str, str]:
    """The environment of a shell where nothing was exported for ggml-lens."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GGML_LENS_", "PYTEST", "MAKE", "MFLAGS"))}
    return env | (extra or {})


@contextmanager
def _serving(argv: list[str], cwd: Path, env: dict[str, str], log: Path, port: int) -> Iterator[Served]:
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    served = Served(f"http://127.0.0.1:{port}", proc, log)
    try:
        try:
            _wait("the server", lambda: _listens(port), proc, STARTUP)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; its log:\n{served.log_text()}") from None
        yield served
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


@contextmanager
def make_run(log: Path) -> Iterator[Served]:
    """`make run` in the checkout, as the README says, on a free port (PORT is the Makefile's own
    variable); nothing else set."""
    port = _free_port()
    with _serving(["make", "--no-print-directory", "run", f"PORT={port}"], ROOT, _clean_env(None), log,
                  port) as served:
        yield served


@contextmanager
def serve(log: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = (),
          cwd: Path = ROOT) -> Iterator[Served]:
    """`ggml-lens serve` on a free port in `cwd`, with `env` added to a clean environment."""
    port = _free_port()
    argv = [str(Path(sys.executable).parent / "ggml-lens"), "serve", "--port", str(port), *args]
    with _serving(argv, cwd, _clean_env(env), log, port) as served:
        yield served
