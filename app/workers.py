"""Recordings on a Redis queue, for a class on several machines: `ggml-lens serve --queue
redis://…` gives the web processes RedisJobs (the embedded JobQueue's interface, app/jobs.py),
and `ggml-lens worker --queue redis://…` starts a worker that records.

The queue is RQ: Redis alone, a job found by its id from any process with its status and its
place in the queue, a worker that forks a child per job (a recording's memory goes back to the
system when it ends), and retries of jobs whose worker died. (Dramatiq keeps no job status or
position without extra middleware; Celery's Redis transport hands a lost task out again only
after its visibility timeout, an hour by default.)

A job's id is its key's digest (app/traces.py: a Recipe to record, or a Dump to make). Its
argument and result are JSON (RQ's JSONSerializer: nothing read back from Redis is unpickled); a
recording's trace goes to the shared trace files (app/tracefiles.py), which the web processes
decode with every size capped, a dump's text is the job's result. A key asked for twice runs
once: the first asker claims the digest (SET NX) and enqueues it, the others follow the job it
made.

A worker killed mid-job stops sending heartbeats; HEARTBEAT + GRACE seconds later its job's
execution has expired, and the next cleanup of the started jobs (a worker's maintenance, or a web
process following the job) hands it to another worker, RETRIES times; after that the learner
reads that the recording failed, and asking again records it again.
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Any

import msgspec
from redis import Redis
from rq import Queue, Retry, Worker, get_current_job
from rq.exceptions import NoSuchJobError
from rq.job import Job as RQJob
from rq.job import JobStatus
from rq.registry import StartedJobRegistry
from rq.serializers import JSONSerializer

from app.i18n import _
from app.jobs import Progress, QueueFull, RecordingLost
from app.traces import Dump, Recipe, TraceCache

QUEUE = "ggml-lens"
CLAIM = "ggml-lens:claim:"  # + a key's digest: the time it was enqueued (SET NX)
CLIENT = "ggml-lens:client:"  # + a client: the digests of its recent jobs
CLAIM_TTL = 3600  # s a claim lasts: a finished trace is found in the trace files first
JOB_TIMEOUT = 900  # s a recording may run on a worker
RETRIES = 2  # times a job whose worker died is handed to another
HEARTBEAT = 2  # s between a busy worker's heartbeats
GRACE = 6  # s after its last heartbeat that a job counts as abandoned
MAINTENANCE = 5  # s between a worker's cleanups of the started jobs
POLL = 0.1  # s between looks at a job that a request waits for
NICE = 10  # a worker's scheduling priority, below the web processes'
ACTIVE = (JobStatus.QUEUED, JobStatus.STARTED, JobStatus.SCHEDULED, JobStatus.DEFERRED)
log = logging.getLogger("ggml-lens")


@dataclass(frozen=True, slots=True)
class RemoteJob:
    """A job of the Redis queue, as a web process follows it."""

    id: str  # the key's digest
    key: Recipe | Dump
    client: str  # who asked


@dataclass(frozen=True, slots=True)
class Task:
    """What a worker does for one kind of key."""

    function: str  # what it runs, given the key as JSON
    in_result: bool  # its product is the job's result (a dump's text), not a trace file


TASKS = {Recipe: Task("app.workers.record_job", in_result=False),
         Dump: Task("app.workers.dump_job", in_result=True)}


class RedisJobs:
    """The web side: jobs queued in Redis, recorded by `ggml-lens worker` processes; at most
    `capacity` waiting, `per_client` per client queued or running."""

    def __init__(self, url: str, capacity: int = 64, per_client: int = 2) -> None:
        self.redis = Redis.from_url(url)
        self.queue = Queue(QUEUE, connection=self.redis, serializer=JSONSerializer)
        self.capacity, self.per_client = capacity, per_client

    def find(self, key: Recipe | Dump, client: str) -> RemoteJob | None:
        """The job queued or running for key (in any process), or one that ended with its
        product in its result (a dump's text), or None; followed for client."""
        job = RemoteJob(key.digest, key, client)
        found = self._job(job)
        status = found.get_status(refresh=False) if found is not None else None
        return job if status in ACTIVE or status == JobStatus.FINISHED and TASKS[type(key)].in_result else None

    def submit(self, key: Recipe | Dump, client: str) -> RemoteJob:
        """The job recording `key`: the one some process queued, or a new one (QueueFull when
        there is no room, or this client already has per_client jobs)."""
        digest = key.digest
        old = self._job(RemoteJob(digest, key, client))
        if old is not None and old.get_status(refresh=False) not in ACTIVE:
            # it ended, yet its trace is asked for again: the trace was evicted (or it failed)
            self.redis.delete(CLAIM + digest)
        if self.redis.set(CLAIM + digest, time.time(), nx=True, ex=CLAIM_TTL):
            try:
                self._room(client)
                self.queue.enqueue(TASKS[type(key)].function, msgspec.to_builtins(key), job_id=digest,
                                   retry=Retry(max=RETRIES), job_timeout=JOB_TIMEOUT, result_ttl=CLAIM_TTL,
                                   failure_ttl=CLAIM_TTL, description=key.name)
            except BaseException:
                self.redis.delete(CLAIM + digest)
                raise
            with self.redis.pipeline() as p:
                p.sadd(CLIENT + client, digest)
                p.expire(CLIENT + client, CLAIM_TTL)
                p.execute()
        return RemoteJob(digest, key, client)

    def _room(self, client: str) -> None:
        if self.queue.count >= self.capacity:
            raise QueueFull(False, self._wait(self.queue.count))
        ids = sorted(x.decode() if isinstance(x, bytes) else x for x in self.redis.smembers(CLIENT + client))
        jobs = RQJob.fetch_many(ids, connection=self.redis, serializer=JSONSerializer)
        active = [j for j in jobs if j is not None and j.get_status(refresh=False) in ACTIVE]
        gone = set(ids) - {j.id for j in active}
        if gone:
            self.redis.srem(CLIENT + client, *gone)
        if len(active) >= self.per_client:
            raise QueueFull(True, self._wait(self.queue.count))

    def _wait(self, ahead: int) -> int:
        """Seconds until a job queued behind `ahead` others likely starts (5 s a job)."""
        workers = max(1, Worker.count(connection=self.redis, queue=self.queue))
        return max(1, math.ceil(5 * (ahead // workers + 1)))

    def _job(self, job: RemoteJob) -> RQJob | None:
        try:
            return RQJob.fetch(job.id, connection=self.redis, serializer=JSONSerializer)
        except NoSuchJobError:
            return None

    def wait(self, job: RemoteJob, seconds: float) -> bool | str | None:
        """Once the job has ended within `seconds`: True (a recording: its trace is written),
        or a dump's text; else None. A bad input raises ValueError, a job that ended without
        its product RecordingLost (and asking again runs it again); a job that is not in Redis
        and no one is queueing is queued again."""
        deadline = time.monotonic() + seconds
        while True:
            found = self._job(job)
            status = found.get_status(refresh=False) if found is not None else None
            if found is not None and status == JobStatus.FINISHED:
                result = found.return_value() or {}
                if "error" in result:
                    self.redis.delete(CLAIM + job.id)
                    raise ValueError(str(result["error"])[:2000])
                return result.get("text", True)
            if found is not None and status in (JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED):
                self.redis.delete(CLAIM + job.id)
                raise RecordingLost(self._why(found))
            if found is None and self._unqueued(job):
                self.submit(job.key, job.client)  # (QueueFull if there is still no room)
            if time.monotonic() >= deadline:
                return None
            if status == JobStatus.STARTED:
                StartedJobRegistry(queue=self.queue).cleanup()  # (its worker may have died)
            time.sleep(POLL)

    def _unqueued(self, job: RemoteJob) -> bool:
        """True for a job Redis does not hold and no one is about to queue: not claimed (its
        claimer found no room in the queue), or claimed more than a moment ago (the claimer
        queues right after claiming: Redis lost it). Its claim is dropped."""
        claimed = self.redis.get(CLAIM + job.id)
        if claimed is not None and time.time() - float(claimed) <= 10:
            return False
        self.redis.delete(CLAIM + job.id)
        return True

    @staticmethod
    def _why(found: RQJob) -> str:
        failure = found.latest_result()
        text = failure.exc_string if failure is not None and failure.exc_string else ""
        if "AbandonedJobError" in text:
            return _("The workers recording this stopped before it ended ({n} tries); reload the page to "
                     "record it again.").format(n=RETRIES + 1)
        last = text.strip().splitlines()[-1] if text.strip() else _("no reason given")
        return _("The recording failed on its worker: {why}").format(why=last[:500])

    def progress(self, job: RemoteJob) -> Progress:
        found = self._job(job)
        if found is None:
            return Progress(1, None, 0)
        status = found.get_status(refresh=False)
        if status == JobStatus.QUEUED:
            return Progress((found.get_position() or 0) + 1, None, 0)
        if status != JobStatus.STARTED:
            return Progress(1 if status in ACTIVE else 0, None, 0)
        StartedJobRegistry(queue=self.queue).cleanup()
        started = found.started_at.timestamp() if found.started_at else time.time()
        return Progress(0, int(time.time() - started), int(found.meta.get("steps", 0)))


# --- the worker's side ------------------------------------------------------------------------

_cache: TraceCache | None = None  # the worker's, made before it takes its first job
PROGRESS_EVERY = 0.5  # s between the progress a recording reports


def record_job(recipe: dict) -> dict:
    """A job: record the recipe's trace into the trace files: {"recorded": true}, or false when
    another job wrote it meanwhile; {"error": …} for a bad input (the learner's page says it)."""
    assert _cache is not None and _cache.files is not None, "record_job runs in `ggml-lens worker`"
    key = msgspec.convert(recipe, Recipe)
    if _cache.files.has(key.digest):
        return {"recorded": False}
    job, steps, last = get_current_job(), 0, time.monotonic()

    def on_step(*_: Any) -> None:
        nonlocal steps, last
        steps += 1
        if job is not None and time.monotonic() - last > PROGRESS_EVERY:
            last = time.monotonic()
            job.meta["steps"] = steps
            job.save_meta()

    try:
        _cache.record(key, on_step=on_step)
    except (ValueError, KeyError) as e:
        return {"error": str(e)}
    return {"recorded": True}


def dump_job(key: dict) -> dict:
    """A job: make a walkthrough's eval-callback dump: {"text": …}, or {"error": …} for a bad
    input."""
    assert _cache is not None, "dump_job runs in `ggml-lens worker`"
    try:
        return {"text": _cache.make_dump(msgspec.convert(key, Dump))}
    except (ValueError, KeyError) as e:
        return {"error": str(e)}


class LensWorker(Worker):
    """RQ's forking worker with a short heartbeat: a job whose worker died is handed on within
    seconds, not RQ's default minute."""

    def get_heartbeat_ttl(self, job: RQJob, working_time: float = 0.0) -> int:
        return HEARTBEAT + GRACE


def run_worker(cache: TraceCache, url: str, burst: bool = False) -> None:
    """Record jobs from the queue at `url` until stopped (`burst`: until it is empty), at a
    lower priority (NICE): a web process on the same machine answers its pages first."""
    global _cache
    _cache = cache
    os.nice(NICE)
    redis = Redis.from_url(url)
    worker = LensWorker([Queue(QUEUE, connection=redis, serializer=JSONSerializer)], connection=redis,
                        serializer=JSONSerializer, job_monitoring_interval=HEARTBEAT,
                        maintenance_interval=MAINTENANCE)
    worker.work(burst=burst, logging_level="WARNING", with_scheduler=False)
