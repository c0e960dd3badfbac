"""Recordings as jobs: a bounded in-process queue that runs them on its own threads, so a request
never waits for one. A job is keyed by its inputs (a job asked for twice runs once), each client
may have only a few queued or running at once, and a full queue answers at once (QueueFull, with
the seconds to wait before trying again) instead of making anyone wait.

This is the embedded queue (`make run`); app/workers.py is the same interface on a Redis queue
whose workers may be on other machines: `find(key)`, `submit(key, client)`, `wait(job,
seconds)`, `progress(job)`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Protocol

from fastapi import HTTPException

from app.i18n import _


class Pending(Exception):
    """A page's trace is being recorded as a job: `url` is its recording page (the app's handler
    sends the browser there)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.url = url


class QueueFull(Exception):
    """No room for another job (`client`: this client has its share queued already;
    `retry_after`: seconds until there likely is room)."""

    def __init__(self, client: bool, retry_after: int) -> None:
        super().__init__("client" if client else "full")
        self.client, self.retry_after = client, retry_after


class RecordingLost(Exception):
    """A recording's job ended without a trace (its worker died, or the trace was evicted
    meanwhile): asked again, it is recorded again."""


@dataclass(frozen=True, slots=True)
class Progress:
    """What a recording's page shows of its job."""

    place: int  # 0: running; else its place in the queue (1: next)
    seconds: int | None  # how long it has run
    steps: int  # the steps recorded so far


class Queue(Protocol):
    """What the app asks of a job queue: this module's JobQueue, or app/workers.py's RedisJobs."""

    def find(self, key: Any, client: str) -> Any: ...  # the job queued or running for key, or None
    def submit(self, key: Any, client: str) -> Any: ...  # the job recording key (QueueFull: no room)
    def wait(self, job: Any, seconds: float) -> Any: ...  # not None once it ended (raises its error)
    def progress(self, job: Any) -> Progress: ...


@dataclass
class Job:
    key: Hashable
    client: str
    queued: float = field(default_factory=time.monotonic)
    started: float | None = None
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None  # what work returned, or the exception it raised
    steps: int = 0  # progress: the steps a recording has made so far

    def count_step(self, *_: Any) -> None:
        """A recorder's on_step callback: one more step recorded."""
        self.steps += 1


class JobQueue:
    """`workers` threads run the jobs in order, each by `run(key, job)` (the job to report its
    progress); at most `capacity` wait, `per_client` per client."""

    def __init__(self, run: Callable[[Any, Job], Any], workers: int = 2, capacity: int = 16,
                 per_client: int = 2) -> None:
        self.run = run
        self.capacity, self.per_client, self.workers = capacity, per_client, workers
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._waiting: deque[Job] = deque()
        self._jobs: dict[Hashable, Job] = {}  # queued or running
        self._seconds = deque([5.0], maxlen=20)  # recent jobs' run times
        self._closed = False
        self._threads = [threading.Thread(target=self._work, daemon=True, name=f"job-{i}")
                         for i in range(workers)]
        for t in self._threads:
            t.start()

    def submit(self, key: Hashable, client: str) -> Job:
        """The job for key: the one queued or running, or a new one (QueueFull when there is no
        room for it, or its client already has per_client jobs)."""
        with self._lock:
            job = self._jobs.get(key)
            if job is not None:
                return job
            if sum(j.client == client for j in self._jobs.values()) >= self.per_client:
                raise QueueFull(True, self._wait(len(self._waiting)))
            if len(self._waiting) >= self.capacity or self._closed:
                raise QueueFull(False, self._wait(len(self._waiting)))
            job = Job(key, client)
            self._jobs[key] = job
            self._waiting.append(job)
            self._ready.notify()
            return job

    def find(self, key: Hashable, client: str = "") -> Job | None:
        """The job queued or running for key, or None."""
        with self._lock:
            return self._jobs.get(key)

    def wait(self, job: Job, seconds: float) -> Any:
        """What the job's run returned if it ends within `seconds` (what it raised is raised
        here), else None."""
        if not job.done.wait(seconds):
            return None
        if isinstance(job.result, BaseException):
            raise job.result
        return job.result

    def progress(self, job: Job) -> Progress:
        with self._lock:
            try:
                place = self._waiting.index(job) + 1
            except ValueError:
                place = 0
        seconds = int(time.monotonic() - job.started) if job.started is not None and place == 0 else None
        return Progress(place, seconds, job.steps)

    def close(self, wait: float = 0) -> None:
        """Take no more jobs and drop the waiting ones; wait up to `wait` seconds for the
        running ones to end."""
        with self._lock:
            self._closed = True
            self._waiting.clear()
            self._ready.notify_all()
        deadline = time.monotonic() + wait
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _wait(self, ahead: int) -> int:
        """Seconds until a job queued behind `ahead` others likely starts."""
        per = sum(self._seconds) / len(self._seconds)
        return max(1, math.ceil(per * (ahead // self.workers + 1)))

    def _work(self) -> None:
        while True:
            with self._lock:
                while not self._waiting and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                job = self._waiting.popleft()
                job.started = time.monotonic()
            try:
                job.result = self.run(job.key, job)
            except Exception as e:  # noqa: BLE001 - the job's own failure is its result
                job.result = e
            with self._lock:  # (the work kept what it made: no one sees neither job nor result)
                self._seconds.append(time.monotonic() - job.started)
                self._jobs.pop(job.key, None)
            job.done.set()


def busy(e: QueueFull) -> HTTPException:
    """The answer to a job that could not be queued: 429 when this client has enough queued,
    503 when the queue is full; both with Retry-After."""
    status, message = (429, _("You already have programs waiting to run; try again in {n} s.")) \
        if e.client else (503, _("Every worker is busy; try again in {n} s."))
    return HTTPException(status, message.format(n=e.retry_after), headers={"Retry-After": str(e.retry_after)})
