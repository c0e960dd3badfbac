"""Recorded traces, kept in a small LRU by (program, threads, input).

A trace is a pure function of its inputs, so any worker can record it again: nothing here is state a
second worker could not rebuild. Recording is serialised per key, so two requests for the same
trace record it once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from app.settings import MAX_THREADS
from engine.evaldump import eval_dump
from engine.programs import PROGRAMS, trace_program
from engine.trace import State, Trace

TraceKey = tuple[str, int, str | None]  # program, threads, input file


class TraceCache:
    def __init__(self, size: int, fixtures_dir: Path | None = None) -> None:
        self.size = size
        self.fixtures_dir = fixtures_dir  # where a program's default input file is
        self._traces: OrderedDict[TraceKey, Trace] = OrderedDict()
        self._keys: dict[int, TraceKey] = {}  # id of a cached trace -> its key
        self._states: OrderedDict[tuple[TraceKey, int], State] = OrderedDict()
        self._lock = threading.Lock()
        self._recording: dict[TraceKey, threading.Lock] = {}
        self._dumps: dict[TraceKey, str] = {}

    def trace(self, name: str, threads: int | None, path: str | None = None) -> Trace:
        """The trace of a walkthrough (KeyError for an unknown name, ValueError for bad threads).

        `path` is the input file of a walkthrough that reads one (gguf-load, minilm); without
        it such a walkthrough reads its fixture from `fixtures_dir`."""
        key = self._key(name, threads, path)
        name, n, path = key
        with self._lock:
            if key in self._traces:
                self._traces.move_to_end(key)
                return self._traces[key]
            lock = self._recording.setdefault(key, threading.Lock())
        with lock:
            with self._lock:
                if key in self._traces:
                    return self._traces[key]
            trace = trace_program(name, n, **({"path": path} if path else {}))
            with self._lock:
                self._traces[key] = trace
                self._keys[id(trace)] = key
                while len(self._traces) > self.size:
                    _, old = self._traces.popitem(last=False)
                    self._keys.pop(id(old), None)
            return trace

    def _key(self, name: str, threads: int | None, path: str | None) -> TraceKey:
        prog = PROGRAMS[name]
        n = threads or prog.threads
        if not 1 <= n <= MAX_THREADS:
            raise ValueError(f"threads must be between 1 and {MAX_THREADS}, not {n}")
        if path is None and prog.reads and self.fixtures_dir is not None:
            path = str(self.fixtures_dir / prog.reads)
        return (name, n, path)

    def eval_dump(self, name: str, threads: int | None, path: str | None = None) -> str:
        """The program's computed nodes as llama.cpp's eval callback prints them (a run without
        recording), kept like the traces."""
        key = self._key(name, threads, path)
        with self._lock:
            if key in self._dumps:
                return self._dumps[key]
        text = eval_dump(PROGRAMS[name].load().run, n_threads=key[1],
                         **({"path": key[2]} if key[2] else {}))
        with self._lock:
            self._dumps[key] = text
            while len(self._dumps) > self.size:
                self._dumps.pop(next(iter(self._dumps)))
        return text

    def state(self, trace: Trace, k: int) -> State:
        """The rebuilt state after step k (cached: a page and its partials share it)."""
        with self._lock:
            key = (self._keys.get(id(trace), ("", 0, trace.hash)), k)
            if key in self._states:
                self._states.move_to_end(key)
                return self._states[key]
        state = trace.state_at(k)
        with self._lock:
            self._states[key] = state
            while len(self._states) > 2 * self.size:
                self._states.popitem(last=False)
        return state
