"""What recording costs the server, against the red team's cases (issue 48, items 3, 7 and 8).
Everything that records is a job of the queue: the eval-callback dump too (asked twice, made
once; 429 or 503 when there is no room; every request answered at once). The server's memory
grows with the trace, not with what a program or a worker claims: a forged head is counted at
what it decodes to, checkpoints copy a few times what the steps wrote (not a pool of 512 MiB the
program asked for), and what a process keeps fits one budget (GGML_LENS_MEMORY_LIMIT). And
X-Forwarded-For names the client only from a proxy named by --forwarded-allow-ips.

The cases about the server's time, memory and processes run against one served app
(tests/support/served.py), each measured against the memory before it; the rest in-process."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from urllib.parse import quote

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient

from app import traces
from app.jobs import QueueFull
from app.main import create_app
from app.sandbox.boundary import Limits
from app.sandbox.wire import HEAD_LIMIT, Head, PatchRef, _frame, decode
from app.settings import Settings
from app.tracefiles import SUFFIX, TraceFiles
from app.traces import Dump, Recipe, TraceCache
from engine.models import bundled
from engine.programs import FIXTURES_DIR
from engine.trace import Trace
from engine.trace import states as T
from engine.compute.shares import ShareKind
from engine.trace.steps import ContextMeta, Patch, Step, StepKind, ThreadShare
from tests.support.classroom import _listens, _wait
from tests.support.rpc_server import _die_with_parent, _free_port
from tests.support.served import Served, serve

MiB = 1 << 20
ANSWER = 5.0  # seconds the server may take to answer any request of these cases
MODEL = bundled.require(bundled.DATA_DIR).resolve()
# the red team's eight gemma3 prompts: each a different recipe, each a dump of ~5 s
PROMPTS = [f"Question {k}: " + " ".join(["The history of Paris is long and"] * 10) for k in range(8)]
DUMPS_GROWTH = 1280 * MiB  # what two dumps of gemma3 at once may add (eight at once added 3 GB)
C21_GROWTH = 128 * MiB  # what opening the steps of the c21 program may add (its checkpoint: 512 MiB)
# the red team's c21: a pool of 512 MiB that 4,500 small steps write 4 KiB of each (an 18 MB
# trace whose first rebuild copied the whole pool)
C21 = '''"""A pool of 512 MiB touched by many small steps."""

import numpy as np

from engine.ggml import *

ctx = ggml_init(ggml_init_params(mem_size=512 * 1024 * 1024, mem_buffer=None, no_alloc=False))
t = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1024)
for i in range(4500):
    set_data(t, np.full(1024, i + 1, dtype=np.float32))
'''


# --- forged heads: what a worker's output can make the server decode -------------------------

STEPS = Limits().steps  # a learner's trace has at most this many steps (and two more)
POOL = (ContextMeta(1, 1 << 32, 1 << 20, None, False),)  # the one pool the forged patches lie in


def _ranges(per_step: int, item: tuple, item_bytes: int) -> tuple:
    return item * (per_step // item_bytes)


# the densest shapes a head can take: a thread's ranges of negative fixints (one byte each, an int
# object each), of intervals [0, 0] (three bytes, a record), of tiles named by two-letter strings
# (ten bytes, three records and a string); steps of 1-byte patches
SHAPES = {
    "negative fixints": lambda n: (
        [ThreadShare(0, ShareKind.INTERLEAVED, _ranges(n, (-7,), 1), 0.0, ())], []),
    "empty intervals": lambda n: (
        [ThreadShare(0, ShareKind.ROWS, _ranges(n, ((0, 0),), 3), 0.0, ())], []),
    "string tiles": lambda n: (
        [ThreadShare(0, ShareKind.CHUNKS, _ranges(n, (("ab", (0, 0), (0, 0)),), 10), 0.0, ())], []),
    "tiny patches": lambda n: ([], [PatchRef(1, 64 * i % (1 << 20), 1) for i in range(n // 22)]),
}


def forged(shape: str, head_bytes: int) -> bytes:
    """A worker's output whose head is about `head_bytes`: steps (STEPS of them for a head of
    8 MB, fewer for a smaller one) holding the shape's records."""
    n_steps = min(STEPS, head_bytes // 1600)

    def payload(n: int) -> bytes:
        threads, refs = SHAPES[shape](n)
        steps = [Step(k, StepKind.CALL, "x", 1, (), contexts=POOL if k == 0 else (), threads=tuple(threads))
                 for k in range(n_steps)]
        head = Head(ok=True, program="forged", source="x = 1\n", steps=steps, patches=[refs] * n_steps)
        return _frame(head, [b"\1"] * (len(refs) * n_steps))

    bare = len(payload(0))
    data = payload((head_bytes - bare) // n_steps)
    assert len(data) - bare <= head_bytes <= HEAD_LIMIT
    return data


def _traced(make):
    """What make() returns, and the bytes it holds on to as tracemalloc counts them."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        made = make()
        gc.collect()
        return made, tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("shape, head_bytes", [("negative fixints", HEAD_LIMIT - 64 * 1024),
                                                ("empty intervals", MiB), ("string tiles", MiB),
                                                ("tiny patches", MiB)])
def test_a_forged_head_is_counted_at_least_at_what_it_decodes_to(shape: str, head_bytes: int) -> None:
    """The red team's 8 MB head decoded to ~170 MB that no budget counted: a decoded trace's
    held bytes are at least what it holds (its steps, patches and index), within 8x of it."""
    data = forged(shape, head_bytes)

    def decoded() -> Trace:
        trace = decode(data, Limits(trace=1 << 30))
        trace._index()  # (what a kept trace builds on its first page)
        return trace

    trace, held = _traced(decoded)
    print(f"{shape}: a head of {head_bytes / MiB:.1f} MiB holds {held / MiB:.0f} MiB decoded, "
          f"counted {trace.held_bytes / MiB:.0f} MiB")
    assert held > 5 * head_bytes  # (a shape that decodes to much: the count is put to the test)
    assert held <= trace.held_bytes <= 8 * held


def test_the_kept_traces_fit_the_memory_limit(tmp_path: Path) -> None:
    """Ten forged traces read back by a web process (the red team's ten programs held 1.65 GB):
    what the cache keeps of them fits its memory limit, the least recently used let go."""
    files = TraceFiles(tmp_path / "traces", 1 << 30)
    recipes = [Recipe(traces.PROGRAM_PREFIX + f"{k:064x}", 1) for k in range(10)]
    data = forged("negative fixints", 1 * MiB)
    for recipe in recipes:
        (files.root / f"{recipe.digest}{SUFFIX}").write_bytes(data)
    limit = 160 * MiB
    cache = TraceCache(32, files=files, memory=limit)

    def read_all() -> list[bool]:
        return [cache.shared(r) is not None for r in recipes]

    found, held = _traced(read_all)
    kept = [r for r in recipes if cache.kept(r) is not None]
    print(f"10 forged traces of ~{data.__len__() / MiB:.0f} MiB each read: {len(kept)} kept, "
          f"holding {held / MiB:.0f} MiB")
    assert all(found) and kept == recipes[-len(kept):] and len(kept) < len(recipes)
    assert held <= limit


def _small_steps_trace(pool: int, steps: int, write: int) -> Trace:
    """c21's trace, made by hand: one pool of `pool` bytes, then `steps` steps that each write
    `write` bytes at its start (other values each time)."""
    out = [Step(0, StepKind.CALL, "ctx = ggml_init(...)", 1, (),
                contexts=(ContextMeta(1, 1 << 32, pool, None, False),))]
    for k in range(1, steps):
        out.append(Step(k, StepKind.CALL, "set_data(t, ...)", 2, (),
                        patches=(Patch(1, 0, np.full(write, k % 251, np.uint8).tobytes()),)))
    return Trace("c21", "", 1, out)


def test_checkpoints_copy_a_few_times_what_the_steps_wrote() -> None:
    """A pool of 512 MiB that 4,500 steps write 4 KiB of each: no checkpoint copies the pool
    (its first rebuild copied all of it); a state replays the steps instead, to the same bytes."""
    trace = _small_steps_trace(512 * MiB, 4500, 4096)
    last = trace.state_at(len(trace.steps) - 1)
    assert trace.recorded_bytes < 20 * MiB
    assert trace.held_bytes - trace.recorded_bytes <= T.checkpoint_budget(trace.recorded_bytes) <= 80 * MiB
    pool = last.contexts[1].pool
    assert bytes(pool[:4096]) == bytes([4499 % 251]) * 4096 and not pool[4096:1 << 20].any()
    # a pool the steps write much of is still checkpointed, within the same budget
    busy = _small_steps_trace(4 * MiB, 300, 256 * 1024)
    busy.state_at(len(busy.steps) - 1)
    assert len(busy._checkpoints()) > 10
    assert busy.held_bytes - busy.recorded_bytes <= T.checkpoint_budget(busy.recorded_bytes)


# --- the eval-callback dump as a job, in-process ------------------------------------------------

class Gate:
    """eval_dump's stand-in: each run says which prompt it made and waits for the gate to open."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.runs: list[str] = []

    def __call__(self, run, prompt: str | None = None, **_) -> str:
        self.runs.append(prompt)
        self.open.wait(10)
        return f"common_debug_cb_eval: {prompt}\n"


def test_a_dump_is_a_job_made_once_with_the_queues_limits(tmp_path: Path, monkeypatch) -> None:
    """Eight prompts from one client (the red team's eight ran at once in the request threads):
    two jobs, each answered at once with its page, six 429; the same prompt again follows its
    job; another client's waits in the queue, the next finds it full (503); each is made once,
    then kept."""
    gate = Gate()
    monkeypatch.setattr(traces, "eval_dump", gate)
    monkeypatch.setattr(traces, "QUICK", 0.2)
    app = create_app(Settings(data_dir=tmp_path, fixtures_dir=FIXTURES_DIR, runs_at_once=2, run_queue=1,
                              runs_per_client=2))
    a, b, c = (TestClient(app, client=(f"10.0.0.{k}", 50000), follow_redirects=False) for k in (1, 2, 3))

    def url(k: int) -> str:
        return f"/walkthroughs/minilm/eval-callback.txt?prompt=prompt+{k}"

    try:
        asked = [a.get(url(k)) for k in range(8)]  # one client asks for eight:
        assert [r.status_code for r in asked] == [202] * 2 + [429] * 6  # two run, each answered with its page
        assert f'hx-get="{url(0)}"' in asked[0].text and int(asked[2].headers["Retry-After"]) >= 1
        r = a.get(url(0))  # asked again: the same job (no third for this client)
        assert r.status_code == 202 and "It has been running for" in r.text
        assert b.get(url(10)).status_code == 202  # another client's waits in the queue (one place)
        r = c.get(url(11))
        assert r.status_code == 503 and int(r.headers["Retry-After"]) >= 1
        r = a.get(url(0), headers={"HX-Request": "true"})  # a poll waits for nothing and polls on
        assert r.status_code == 202 and 'hx-trigger="every 1s"' in r.text
        gate.open.set()
        for client, k in ((a, 0), (a, 1), (b, 10)):
            deadline = time.monotonic() + 10
            while (r := client.get(url(k))).status_code == 202:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert r.status_code == 200 and r.text == f"common_debug_cb_eval: prompt {k}\n"
            assert 'filename="minilm-eval-callback.txt"' in r.headers["content-disposition"]
        assert sorted(gate.runs) == ["prompt 0", "prompt 1", "prompt 10"]  # each made once
        r = a.get(url(0), headers={"HX-Request": "true"})  # the poll once it is made: a link to it
        assert r.status_code == 200 and 'hx-trigger="every 1s"' not in r.text
        assert 'download="minilm-eval-callback.txt"' in r.text
        assert a.get(url(0)).status_code == 200 and len(gate.runs) == 3  # kept: not made again
        assert a.get("/walkthroughs/minilm/eval-callback.txt?file=" + "0" * 64).status_code == 404
    finally:
        gate.open.set()
        app.state.jobs.close(wait=10)


def test_a_dump_is_a_job_of_the_redis_queue_too(tmp_path: Path) -> None:
    """The same on a classroom's Redis queue: asked twice, queued once; the per-client and
    queue limits; made by `ggml-lens worker`, the same text as made here."""
    from app.workers import RedisJobs

    port = _free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], stdout=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    try:
        _wait("redis-server", lambda: _listens(port), redis)
        url = f"redis://127.0.0.1:{port}/0"
        cache = TraceCache(4, FIXTURES_DIR)
        cache.jobs = RedisJobs(url, capacity=2, per_client=1)
        key = Dump(cache.key("minilm", 2, prompt="a prompt of mine"))
        job = cache.dump(key, "a", wait=0)
        assert cache.dump(key, "a", wait=0) == job  # asked twice: one job
        with pytest.raises(QueueFull) as mine:
            cache.dump(Dump(cache.key("minilm", 2, prompt="another")), "a", wait=0)
        other = Dump(cache.key("minilm", 2, prompt="a third"))
        assert cache.dump(other, "b", wait=0) != job  # another client's: the queue's second
        with pytest.raises(QueueFull) as full:
            cache.dump(Dump(cache.key("minilm", 2, prompt="a fourth")), "c", wait=0)
        assert mine.value.client and not full.value.client
        env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_LENS_")}
        subprocess.run([sys.executable, "-m", "app.cli", "worker", "--queue", url, "--burst"], timeout=120,
                       env=env | {"GGML_LENS_DATA": str(tmp_path)}, check=True, preexec_fn=_die_with_parent)
        text = cache.dump(key, "a", wait=10)
        assert text == TraceCache(4, FIXTURES_DIR).make_dump(key)  # made here, without a queue
        assert text.startswith("common_debug_cb_eval:") and cache.kept_dump(key) == text
        assert cache.dump(other, "b", wait=10) != text
    finally:
        redis.kill()
        redis.wait()


# --- against the served app: time, memory, processes ------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data directory with the bundled model in it (a link to the one `make setup` installs)."""
    d = tmp_path_factory.mktemp("data")
    (d / "models").mkdir()
    (d / "models" / MODEL.name).symlink_to(MODEL)
    return d


@pytest.fixture(scope="module")
def served(data: Path) -> Served:
    """`ggml-lens serve` on localhost as a learner starts it: the playground on, no proxy trusted."""
    with serve(data.parent / "served.log", env={"GGML_LENS_DATA": str(data)}) as s:
        yield s


def held(s: Served) -> int:
    """The memory the server holds: its resident bytes, and the bytes of its memory files (a
    checkpoint's pool is a memfd, resident only where a state maps and reads it)."""
    pid, files = s.server_pid, 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            if os.readlink(fd).startswith("/memfd:"):
                files += os.stat(fd).st_blocks * 512
        except OSError:
            continue  # (closed meanwhile)
    return s.rss() + files


class Peak:
    """The most memory the server held while the block ran, sampled every 50 ms."""

    def __init__(self, s: Served) -> None:
        self.s, self.most, self._done = s, held(s), threading.Event()

    def __enter__(self) -> Peak:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._done.wait(0.05):
            self.most = max(self.most, held(self.s))

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def timed_get(url: str, base: str, **kw) -> tuple[httpx.Response, float]:
    with httpx.Client(base_url=base, timeout=ANSWER) as c:
        t = time.monotonic()
        r = c.get(url, **kw)
        return r, time.monotonic() - t


def dump_url(prompt: str) -> str:
    return f"/walkthroughs/gemma3/eval-callback.txt?prompt={quote(prompt)}"


def until_made(s: Served, url: str, seconds: float = 120) -> httpx.Response:
    """GET a dump (each answer within ANSWER) until it is the file."""
    deadline = time.monotonic() + seconds
    while True:
        r, took = timed_get(url, s.url)
        assert took < ANSWER and r.status_code in (200, 202), (r.status_code, took)
        if r.status_code == 200:
            return r
        assert time.monotonic() < deadline, "the dump was never made"
        time.sleep(0.5)


def test_eight_dumps_at_once_are_two_jobs_and_six_refusals(served: Served) -> None:
    """The red team's eight gemma3 prompts at once (+3 GB, each answered only when its run
    ended): every request is answered within 5 s, two are jobs (the client's share), the rest
    429 with Retry-After, although each names another X-Forwarded-For (not believed from
    loopback by default: one client); the same prompt again is the same job."""
    s = served
    before = held(s)
    answers: dict[int, tuple[httpx.Response, float]] = {}
    errors: list[tuple[int, str]] = []

    def ask(k: int) -> None:
        try:
            answers[k] = timed_get(dump_url(PROMPTS[k]), s.url, headers={"X-Forwarded-For": f"10.9.8.{k}"})
        except httpx.TimeoutException as e:  # (not answered within ANSWER)
            errors.append((k, repr(e)))

    with Peak(s) as peak:
        asking = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
        for t in asking:
            t.start()
        for t in asking:
            t.join()
        assert errors == []
        took = {k: round(t, 1) for k, (_, t) in answers.items()}
        status = {k: r.status_code for k, (r, _) in answers.items()}
        assert max(took.values()) < ANSWER, took
        ran = [k for k, code in status.items() if code in (200, 202)]
        assert len(ran) == 2 and sorted(status.values())[2:] == [429] * 6, status
        assert all(int(r.headers["Retry-After"]) >= 1 for r, _ in answers.values() if r.status_code == 429)
        again, t = timed_get(dump_url(PROMPTS[ran[0]]), s.url, headers={"X-Forwarded-For": "10.9.8.99"})
        assert again.status_code in (200, 202) and t < ANSWER  # (a third job would be refused)
        for k in ran:
            r = until_made(s, dump_url(PROMPTS[k]))
            assert r.text.startswith("common_debug_cb_eval:") and "gemma3-eval-callback.txt" in \
                r.headers["content-disposition"]
    growth = peak.most - before
    print(f"eight gemma3 dumps asked at once: {status}, answered in {took} s; the server grew "
          f"{growth / MiB:.0f} MiB at most")
    assert growth < DUMPS_GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_a_big_pool_touched_by_small_steps_is_not_copied(served: Served) -> None:
    """c21: an 18 MB trace of a program whose pool is 512 MiB; opening its steps (the first
    rebuild made its checkpoints) grows the server by less than C21_GROWTH."""
    s = served
    with s.client(timeout=ANSWER) as c:
        r = c.post("/programs", data={"source": C21, "threads": "1"})
        assert r.status_code == 303, r.text
        url, deadline = r.headers["location"], time.monotonic() + 120
        while "/steps/" not in url:  # the recording's page, until the debugger opens
            r = c.get(url)
            assert r.status_code in (202, 303), r.text
            url = r.headers.get("location", url)
            assert time.monotonic() < deadline, "the program was never recorded"
            time.sleep(0.5)
        base = url.split("/steps/")[0]
        before = held(s)
        with Peak(s) as peak:
            for n in (4502, 4400, 4499, 4200, 100, 2000, 4501):  # (4502: the program's end)
                r, took = timed_get(f"{base}/steps/{n}", s.url)
                assert r.status_code == 200 and took < ANSWER, (n, r.status_code, took)
        growth = peak.most - before
    print(f"c21's steps opened: the server grew {growth / MiB:.0f} MiB at most")
    assert growth < C21_GROWTH
    assert s.no_children_within(5) == [] and s.alive()


def test_x_forwarded_for_names_the_client_only_from_a_trusted_proxy(data: Path) -> None:
    """With --forwarded-allow-ips=127.0.0.1 (a proxy on this machine) each X-Forwarded-For is
    a client of its own: two addresses each run one dump, a second from one of them is refused
    (GGML_LENS_RUNS_PER_CLIENT=1)."""
    env = {"GGML_LENS_DATA": str(data), "GGML_LENS_RUNS_PER_CLIENT": "1"}
    with serve(data.parent / "proxied.log", env=env, args=("--forwarded-allow-ips=127.0.0.1",)) as s:
        answers: dict[str, httpx.Response] = {}

        def ask(name: str, prompt: str, address: str) -> None:
            answers[name] = timed_get(dump_url(prompt), s.url, headers={"X-Forwarded-For": address})[0]

        asking = [threading.Thread(target=ask, args=("a", PROMPTS[0], "10.1.1.1")),
                  threading.Thread(target=ask, args=("b", PROMPTS[1], "10.2.2.2"))]
        for t in asking:
            t.start()
        for t in asking:
            t.join()
        again, _ = timed_get(dump_url(PROMPTS[2]), s.url, headers={"X-Forwarded-For": "10.1.1.1"})
        status = {k: r.status_code for k, r in answers.items()}
        assert status == {"a": 202, "b": 202} and again.status_code == 429, (status, again.status_code)
        assert s.alive()
