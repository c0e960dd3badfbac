"""Simulated learners on a classroom (tests/support/classroom.py): each from a loopback address
of its own, on a web process picked at random, opens a walkthrough and steps to random steps of
it (waiting on the recording page like a browser when a trace is still being recorded); some
submit a program of their own instead and step through it. A page that does not end in 200 is
an error. A learner reads each page a few seconds (THINK) before the next step; the p95 is of
those steps (each step page on a web process picked at random, served at once: the first page of
a walkthrough may wait for its recording, and is not counted).

`python -m tests.support.load [LEARNERS] [PROGRAMS]` (`make load`) starts a classroom of two web
processes and two workers and prints the step pages' p95; the classroom test runs the same with
its own bound and asserts no errors (timings are not asserted in tests).
"""

from __future__ import annotations

import random
import re
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from app.routes.playground import STARTER
from engine.programs import PROGRAMS

WAIT = 240.0  # seconds a learner waits for one page (a recording included)
STEPS_EACH = 4  # step pages each learner opens after the first
THINK = (2.0, 6.0)  # seconds a learner reads a page before the next step (uniform)


@dataclass
class Report:
    seconds: list[float] = field(default_factory=list)  # step pages served at once (no recording)
    slow: list[tuple[float, float, str, str]] = field(default_factory=list)  # (at, seconds, url, server)
    errors: list[str] = field(default_factory=list)
    pages: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def p95(self) -> float:
        return statistics.quantiles(self.seconds, n=20)[-1] if len(self.seconds) >= 2 else float("nan")


def client(n: int) -> httpx.Client:
    """A learner at loopback address 127.0.<n // 250>.<n % 250 + 2>."""
    address = f"127.0.{n // 250}.{n % 250 + 2}"
    return httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=60)


def _request(c: httpx.Client, method: str, url: str, **kw) -> httpx.Response:
    """One request; a GET whose reused connection the server had just closed (its keep-alive
    ran out while the learner read) is sent again once, as a browser does."""
    try:
        return c.request(method, url, follow_redirects=True, **kw)
    except httpx.TransportError:
        if method != "GET":
            raise
        return c.request(method, url, follow_redirects=True, **kw)


def open_page(c: httpx.Client, method: str, url: str, report: Report, timed: bool = False,
              **kw) -> httpx.Response:
    """The page at url, following redirects and polling a recording page (202) until it sends the
    learner on; its time counted (`timed`) when it came at once."""
    deadline = time.monotonic() + WAIT
    t = time.monotonic()
    r = _request(c, method, url, **kw)
    waited = False
    while time.monotonic() < deadline:
        if r.status_code == 202:  # the recording page: it polls itself every second
            time.sleep(1.0)
            r = _request(c, "GET", str(r.url))
        elif r.status_code in (429, 503) and "retry-after" in r.headers:  # busy: asked to come back
            time.sleep(min(10.0, float(r.headers["retry-after"])))
            r = _request(c, method, url, **kw)
        else:
            break
        waited = True
    with report.lock:
        report.pages += 1
        if r.status_code != 200:
            said = re.search(r'<section role="alert" class="error">.*?<p>(.*?)</p>', r.text, re.S)
            report.errors.append(f"{method} {url}: {r.status_code} {said.group(1) if said else r.text[:300]!r}")
        elif timed and not waited and "/steps/" in str(r.url):
            report.seconds.append(time.monotonic() - t)
            if report.seconds[-1] > 0.3:
                report.slow.append((t, report.seconds[-1], str(r.url), r.headers.get("server-timing", "")))
    return r


def last_step(page: str) -> int:
    m = re.search(r'name="step" min="0" max="(\d+)"', page)
    return int(m.group(1)) if m else 0


def learner(n: int, webs: list[str], report: Report, program: bool, rng: random.Random) -> None:
    base = rng.choice(webs)
    with client(n) as c:
        if program:
            source = STARTER + f"\n# learner {n}\n"
            r = open_page(c, "POST", base + "/programs", report, data={"source": source, "threads": "1"})
        else:
            name = rng.choice(list(PROGRAMS))
            r = open_page(c, "GET", f"{base}/walkthroughs/{name}/steps/0", report)
        if r.status_code != 200:
            return
        at = str(r.url).split("?")[0].rsplit("/steps/", 1)[0]
        query = str(r.url).partition("?")[2]
        last = last_step(r.text)
        for _ in range(STEPS_EACH):
            time.sleep(rng.uniform(*THINK))
            k = rng.randint(0, last)
            open_page(c, "GET", f"{rng.choice(webs).rstrip('/')}{at[len(base):]}/steps/{k}"
                      + (f"?{query}" if query else ""), report, timed=True)


def run_load(webs: list[str], learners: int = 100, programs: int = 20, seed: int = 0,
             at_once: int | None = None) -> Report:
    """`learners` learners (`programs` of them submit a program), `at_once` at a time (all by
    default: a class at the same hour)."""
    rng, report = random.Random(seed), Report()
    who = [(n, n < programs, random.Random(rng.random())) for n in range(learners)]
    rng.shuffle(who)
    queue = list(who)
    lock = threading.Lock()

    def run() -> None:
        while True:
            with lock:
                if not queue:
                    return
                n, program, r = queue.pop()
            try:
                learner(n, webs, report, program, r)
            except httpx.HTTPError as e:
                with report.lock:
                    report.errors.append(f"learner {n}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=run) for _ in range(at_once or learners)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return report


def main() -> int:
    from tests.support.classroom import Classroom

    learners = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    programs = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    with tempfile.TemporaryDirectory() as tmp:
        room = Classroom(Path(tmp)).start()
        try:
            t = time.monotonic()
            report = run_load([room.web(0), room.web(1)], learners, programs)
            took = time.monotonic() - t
        finally:
            room.stop()
    print(f"{learners} learners ({programs} with a program of their own) on 2 web processes and 2 workers: "
          f"{report.pages} pages in {took:.0f} s, {len(report.errors)} errors; step pages served at once: "
          f"{len(report.seconds)}, p95 {report.p95() * 1000:.0f} ms (goal: <= 300 ms)")
    for e in report.errors[:10]:
        print("  error:", e)
    start = min((at for at, *_ in report.slow), default=0)
    for at, seconds, url, server in sorted(report.slow, key=lambda x: x[1])[-12:]:
        print(f"  {seconds * 1000:6.0f} ms at {at - start:5.1f} s ({server}): {url}")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
