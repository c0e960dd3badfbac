"""A classroom on one machine, for the classroom test and `make load`: a real Redis (Debian's
redis-server), a local S3 server (moto's server mode), web processes and workers, each with a data
directory of its own, as if each were on a machine of its own: they share only Redis and the
object store. Every process is started in a session of its own (a SIGKILL to its group takes a
worker's forked job with it) and dies with the process that started it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from app.settings import Settings
from engine.models.bundled import model_path
from tests.support.rpc_server import _die_with_parent, _free_port

BUCKET = "lens"
STARTUP = 60  # seconds a process may take to start


def _wait(what: str, ready, proc: subprocess.Popen | None, timeout: float = STARTUP) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} was not ready within {timeout} s")
        time.sleep(0.1)


def _listens(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def _descendants(pid: int) -> list[int]:
    """The pids of a process's children, their children, and so on (from /proc)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


class Classroom:
    def __init__(self, root: Path, webs: int = 2, workers: int = 2) -> None:
        self.root = root
        self.n_webs, self.n_workers = webs, workers
        self.redis_port, self.s3_port = _free_port(), _free_port()
        self.web_ports = [_free_port() for _ in range(webs)]
        self.queue = f"redis://127.0.0.1:{self.redis_port}/0"
        self.store = f"s3://{BUCKET}/class"
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = root / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        # the bundled model, as each machine installs it
        self.model = model_path(Settings.from_env().data_dir).resolve()

    # --- processes ------------------------------------------------------------------------------

    def _env(self, name: str) -> dict[str, str]:
        data = self.root / name
        if self.model.is_file() and not (data / "models").exists():
            (data / "models").mkdir(parents=True)
            os.symlink(self.model, data / "models" / self.model.name)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GGML_LENS_", "AWS_"))}
        return env | {"GGML_LENS_DATA": str(data), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}",
                      "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                      "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def _start(self, name: str, argv: list[str], nice: int = 0) -> subprocess.Popen:
        def child() -> None:
            _die_with_parent()
            os.nice(nice)

        log = open(self.logs / f"{name}.log", "ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self._env(name),
                                start_new_session=True, preexec_fn=child, cwd=self.root)
        self.procs[name] = proc
        return proc

    def start_redis(self) -> None:
        proc = self._start("redis", ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no"])
        _wait("redis-server", lambda: _listens(self.redis_port), proc)

    def start_s3(self) -> None:
        moto = shutil.which("moto_server", path=str(Path(sys.executable).parent))
        # (below the web processes' priority: the object store stands for a service of its own)
        proc = self._start("s3", [moto, "-H", "127.0.0.1", "-p", str(self.s3_port)], nice=10)
        _wait("moto_server", lambda: _listens(self.s3_port), proc)
        httpx.put(f"http://127.0.0.1:{self.s3_port}/{BUCKET}").raise_for_status()

    def start_web(self, i: int) -> None:
        proc = self._start(f"web{i}", [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1",
                                       "--port", str(self.web_ports[i]), "--queue", self.queue,
                                       "--store", self.store])
        _wait(f"web process {i}", lambda: self._answers(i), proc)

    def _answers(self, i: int) -> bool:
        try:
            return httpx.get(self.web(i) + "/", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self, i: int) -> None:
        self._start(f"worker{i}", [sys.executable, "-m", "app.cli", "worker", "--queue", self.queue,
                                   "--store", self.store])

    def workers_ready(self, n: int) -> None:
        from redis import Redis
        from rq import Worker

        with Redis.from_url(self.queue) as r:
            _wait(f"{n} workers", lambda: Worker.count(connection=r) >= n, None)

    def start(self) -> Classroom:
        self.start_redis()
        self.start_s3()
        for i in range(self.n_workers):
            self.start_worker(i)
        for i in range(self.n_webs):
            self.start_web(i)
        self.workers_ready(self.n_workers)
        return self

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        """Send `sig` to the process, its group and every descendant (a worker's forked job is
        in a group of its own), as if its machine went down; reap it."""
        proc = self.procs.pop(name)
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.killpg(pid, sig) if pid == proc.pid else os.kill(pid, sig)
            except ProcessLookupError:
                pass
        proc.wait(30)

    def stop(self) -> None:
        for name in reversed(list(self.procs)):  # the web processes and workers before Redis
            self.kill(name, signal.SIGKILL)

    def web(self, i: int) -> str:
        return f"http://127.0.0.1:{self.web_ports[i]}"

    def worker_pids(self) -> dict[str, int]:
        return {name: p.pid for name, p in self.procs.items() if name.startswith("worker")}
