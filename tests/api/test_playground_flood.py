"""A flood of submissions over real HTTP on loopback: 60 clients (each from its own loopback
address) submit looping programs at once while another client opens the playground. The submit
route answers at once (the run is a job: 303 to its page, or 503 with Retry-After when the queue
is full), and the other client's pages stay fast."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
import uvicorn

from app.main import create_app
from app.routes.playground import STARTER
from app.sandbox.run import Limits
from app.settings import Settings

CLIENTS = 60


@pytest.fixture
def server(tmp_path):
    app = create_app(Settings(data_dir=tmp_path, programs=True, run_queue=16, runs_per_client=2))
    app.state.programs.limits = Limits(cpu=2, wall=4)
    config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", limit_concurrency=1000)
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    port = srv.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        app.state.jobs.close(wait=60)  # the looping programs still running end by their limits
        srv.should_exit = True
        thread.join(30)


def client(n: int) -> httpx.Client:
    """A client from loopback address 127.0.0.<n>: a learner of its own."""
    return httpx.Client(transport=httpx.HTTPTransport(local_address=f"127.0.0.{n}"), timeout=30)


def test_sixty_looping_programs_leave_the_playground_fast_for_another_client(server):
    base, app = server
    answers: list[httpx.Response] = []
    seconds: list[float] = []

    def submit(n: int) -> None:
        looping = STARTER + f"while True:\n    x = {n}\n"
        with client(n + 10) as c:
            t = time.monotonic()
            r = c.post(base + "/programs", data={"source": looping, "threads": "1"}, follow_redirects=False)
            seconds.append(time.monotonic() - t)
            answers.append(r)

    flood = [threading.Thread(target=submit, args=(n,)) for n in range(CLIENTS)]
    for t in flood:
        t.start()
    worst = 0.0
    with client(200) as other:
        for _ in range(20):  # while the flood arrives and the first runs take both cores
            t = time.monotonic()
            r = other.get(base + "/playground")
            worst = max(worst, time.monotonic() - t)
            assert r.status_code == 200
            time.sleep(0.1)
    for t in flood:
        t.join(60)
    print(f"GET /playground at most {worst:.3f} s during the flood")
    assert worst < 1.0, f"GET /playground took {worst:.2f} s during the flood"
    assert len(answers) == CLIENTS and max(seconds) < 10
    queued = [r for r in answers if r.status_code == 303]
    busy = [r for r in answers if r.status_code == 503]
    assert len(queued) + len(busy) == CLIENTS
    assert 16 <= len(queued) <= 16 + 2 + 2  # the queue's room and the runs taken off it meanwhile
    assert all(r.headers["location"].startswith("/programs/") and "/run?" in r.headers["location"]
               for r in queued)
    assert all(int(r.headers["Retry-After"]) >= 1 and "try again in" in r.text for r in busy)
    # a queued program's page says where it is
    with client(11) as c:
        page = c.get(base + queued[-1].headers["location"])
        assert page.status_code in (200, 202) and "Recording your program" in page.text


def test_one_client_may_queue_only_a_few_programs(server):
    base, _ = server
    with client(50) as c:
        codes = [c.post(base + "/programs", data={"source": STARTER.replace("4, 3)", f"4, {n})"),
                                                  "threads": "1"}, follow_redirects=False).status_code
                 for n in range(3, 7)]
    assert codes[:2] == [303, 303] and 429 in codes[2:]
