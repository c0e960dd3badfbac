"""A classroom at once: two web processes and two workers, each with a data directory of its own
(as if on four machines), sharing only a real Redis (the queue, app/workers.py) and a local S3
server (the object store, app/objects.py). Learners are loopback addresses of their own.

Run on its own by `make test-classroom` (the processes are this module's, one set for all its
tests); `make load` runs the load at a larger size and prints the step pages' p95.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import quote

import numpy as np
import pytest
from gguf import GGUFWriter
from redis import Redis
from rq import Worker
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.serializers import JSONSerializer

from app.playground import ProgramStore
from app.routes.playground import STARTER
from app.traces import Recipe, TraceCache
from app.workers import RETRIES
from engine.programs import PROGRAMS
from tests.support.classroom import Classroom, _descendants, _listens, _wait
from tests.support.rpc_server import _die_with_parent, _free_port
from tests.support.load import Report, client, open_page, run_load


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    room = Classroom(tmp_path_factory.mktemp("classroom")).start()
    try:
        yield room
    finally:
        room.stop()


def _job(room: Classroom, recipe: Recipe) -> RQJob:
    with Redis.from_url(room.queue) as r:
        job = RQJob.fetch(recipe.digest, connection=r, serializer=JSONSerializer)
        job.results_list = job.results()
        return job


def _ok(report: Report) -> None:
    assert not report.errors, report.errors


def test_a_program_submitted_to_one_web_process_opens_by_its_permalink_on_the_other(room):
    source = STARTER + f"\n# {uuid.uuid4().hex}\n"
    digest = ProgramStore.digest(source)
    with client(1) as c:
        r = c.post(room.web(0) + "/programs", data={"source": source, "threads": "1"})
    assert r.status_code == 303 and r.headers["location"].startswith(f"/programs/{digest}/run")
    trace_file = room.root / "web1" / "traces" / f"{TraceCache.program_key(digest, 1).digest}.trace"
    assert not trace_file.exists()
    report = Report()
    with client(2) as c:
        page = open_page(c, "GET", room.web(1) + f"/programs/{digest}/steps/3", report)
    _ok(report)
    assert f"/programs/{digest}/steps/3" in str(page.url) and "ggml_add" in page.text
    assert trace_file.is_file()  # the trace web 1 read from the store


def test_a_file_uploaded_to_one_web_process_is_stepped_through_on_the_other(room, tmp_path):
    path = tmp_path / "mine.gguf"  # a file of a learner's own (not one of the fixtures every process has)
    w = GGUFWriter(str(path), "llama")
    w.add_name(uuid.uuid4().hex)
    w.add_tensor("token_embd.weight", np.arange(64, dtype=np.float32).reshape(8, 8))
    w.add_tensor("output.weight", np.ones((4, 8), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    with client(3) as c:
        r = c.post(room.web(0) + "/gguf", files={"file": ("mine.gguf", data)})
    assert r.status_code == 303 and digest in r.headers["location"]
    report = Report()
    with client(4) as c:
        page = open_page(c, "GET", room.web(1) + f"/walkthroughs/gguf-load/steps/7?file={digest}", report)
    _ok(report)
    assert f"file={digest}" in str(page.url) and "ggml_" in page.text
    # the worker that recorded it read the file from the store, as web process 1 did
    assert any((room.root / w / "uploads" / f"{digest}.gguf").is_file() for w in ("worker0", "worker1"))


def test_the_same_prompt_asked_for_by_twenty_learners_at_once_records_once(room):
    prompt = f"the class asks {uuid.uuid4().hex[:8]}"
    recipe = Recipe("minilm", PROGRAMS["minilm"].threads, None, prompt)
    report, pages = Report(), []

    def learner(n: int) -> None:
        with client(10 + n) as c:
            pages.append(open_page(c, "GET", room.web(n % 2) + f"/walkthroughs/minilm/steps/5?prompt={quote(prompt)}",
                                   report))

    learners = [threading.Thread(target=learner, args=(n,)) for n in range(20)]
    for t in learners:
        t.start()
    for t in learners:
        t.join()
    _ok(report)
    assert len(pages) == 20 and all(prompt.split()[-1] in p.text for p in pages)
    job = _job(room, recipe)
    assert job.get_status() == JobStatus.FINISHED
    assert sum((r.return_value or {}).get("recorded", False) for r in job.results_list) == 1  # recorded once


def test_a_worker_killed_mid_job_loses_nothing(room):
    recipe = Recipe("gemma3", PROGRAMS["gemma3"].threads)  # (its own: the load below steps through it too)
    report, pages = Report(), []
    url = room.web(0) + "/walkthroughs/gemma3/steps/100"
    learner = threading.Thread(target=lambda: pages.append(open_page(client(40), "GET", url, report)))
    learner.start()
    with Redis.from_url(room.queue) as r:
        deadline = time.monotonic() + 60
        while True:  # until a worker has taken the job
            try:
                job = RQJob.fetch(recipe.digest, connection=r, serializer=JSONSerializer)
                if job.get_status() == JobStatus.STARTED and job.worker_name:
                    break
            except Exception:  # noqa: BLE001 - not queued yet
                pass
            assert time.monotonic() < deadline, "no worker took the job"
            time.sleep(0.05)
        pid = next(w.pid for w in Worker.all(connection=r) if w.name == job.worker_name)
    victim = next(name for name, p in room.worker_pids().items() if p == pid)
    time.sleep(1.0)  # mid-recording
    room.kill(victim)
    learner.join()
    _ok(report)
    assert "/walkthroughs/gemma3/steps/100" in str(pages[0].url)
    job = _job(room, recipe)
    assert job.get_status() == JobStatus.FINISHED and job.retries_left == RETRIES - 1  # handed on once
    room.start_worker(int(victim[-1]))
    room.workers_ready(2)


def test_a_restarted_web_process_and_a_restarted_queue_serve_the_same_links(room):
    source = STARTER + f"\n# {uuid.uuid4().hex}\n"
    digest = ProgramStore.digest(source)
    links = [f"/programs/{digest}/steps/2",
             "/walkthroughs/simple-add/steps/4?threads=3&prompt="]
    report = Report()
    with client(50) as c:
        open_page(c, "POST", room.web(0) + "/programs", report, data={"source": source, "threads": "1"})
        before = [open_page(c, "GET", room.web(0) + link, report).text for link in links[1:]]
    _ok(report)
    room.kill("web0")
    room.kill("redis")  # it saves nothing: every job and claim is gone
    room.start_redis()
    room.start_web(0)
    with client(51) as c:
        after = [open_page(c, "GET", room.web(0) + link, report) for link in links]
    _ok(report)
    assert after[1].text.count("simple-add") == before[0].count("simple-add")
    with Redis.from_url(room.queue) as r:
        assert not r.keys("rq:job:*") and not r.keys("ggml-lens:*")  # from the store: nothing queued again
    # the workers came back to the new Redis: a new recording is recorded
    with client(52) as c:
        page = open_page(c, "GET", room.web(1) + "/walkthroughs/simple-ctx/steps/1?threads=5", report)
    _ok(report)
    assert page.status_code == 200


def test_a_hundred_learners_step_through_every_walkthrough_and_twenty_programs_without_an_error(room):
    report = run_load([room.web(0), room.web(1)], learners=100, programs=20, seed=1)
    print(f"{report.pages} pages, step pages served at once: {len(report.seconds)}, "
          f"p95 {report.p95() * 1000:.0f} ms")
    _ok(report)
    assert report.pages >= 100 * 5


def test_serve_with_workers_runs_web_processes_that_share_their_traces(tmp_path):
    """`ggml-lens serve --workers 2` without a queue: two web processes, each recording on its
    own threads, sharing the traces they record through the data directory."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GGML_LENS_")} | {"GGML_LENS_DATA": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port), "--workers", "2"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait("serve --workers 2", lambda: _listens(port), proc)
        report = Report()
        pages = [open_page(client(60 + n), "GET", base + "/walkthroughs/simple-ctx/steps/2?threads=2", report)
                 for n in range(8)]
        _ok(report)
        assert len({p.text.count("ggml_") for p in pages}) == 1
        assert len(list((tmp_path / "traces").glob("*.trace"))) == 1  # written once, for both
        assert len([p for p in _descendants(proc.pid) if "multiprocessing" in Path(f"/proc/{p}/cmdline")
                    .read_bytes().decode(errors="replace")]) >= 2  # the two web processes
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
