"""Recorded traces, kept in a small LRU by (program, threads, input).

A trace is a pure function of its inputs, so any worker can record it again: nothing here is state a
second worker could not rebuild. Recording is serialised per key, so two requests for the same
trace record it once.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from engine.programs import PROGRAMS, trace_program
from engine.trace import State, Trace

MAX_THREADS = 8


class TraceCache:
    def __init__(self, size: int) -> None:
        self.size = size
        self._traces: OrderedDict[tuple, Trace] = OrderedDict()
        self._states: OrderedDict[tuple, State] = OrderedDict()
        self._lock = threading.Lock()
        self._recording: dict[tuple, threading.Lock] = {}

    def trace(self, name: str, threads: int | None, path: str | None = None) -> Trace:
        """The trace of a walkthrough (KeyError for an unknown name, ValueError for bad threads).

        `path` is the input file of a walkthrough that reads one (gguf-load)."""
        prog = PROGRAMS[name]
        n = threads or prog.threads
        if not 1 <= n <= MAX_THREADS:
            raise ValueError(f"threads must be between 1 and {MAX_THREADS}, not {n}")
        key = (name, n, path)
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
            trace.cache_key = key  # names its rebuilt states in self._states
            with self._lock:
                self._traces[key] = trace
                while len(self._traces) > self.size:
                    self._traces.popitem(last=False)
            return trace

    def state(self, trace: Trace, k: int) -> State:
        """The rebuilt state after step k (cached: a page and its partials share it)."""
        key = (trace.cache_key if hasattr(trace, "cache_key") else trace.hash, k)
        with self._lock:
            if key in self._states:
                self._states.move_to_end(key)
                return self._states[key]
        state = trace.state_at(k)
        with self._lock:
            self._states[key] = state
            while len(self._states) > 2 * self.size:
                self._states.popitem(last=False)
        return state
