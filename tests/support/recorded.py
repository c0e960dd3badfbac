"""Walkthrough traces recorded once per test process: the tests that only read a walkthrough's
trace (its notes, its golden data) share one recording instead of each making its own. The
model walkthroughs' traces hold hundreds of MB each: the two most recent are kept."""

from __future__ import annotations

from functools import cache, lru_cache

from engine.programs import PROGRAMS, trace_program
from engine.trace import Trace


def recorded(name: str, n_threads: int | None = None) -> Trace:
    """The walkthrough's trace at n_threads (its own count by default). Read it, never change it."""
    n = n_threads or PROGRAMS[name].threads
    return _recorded_model(name, n) if PROGRAMS[name].model else _recorded(name, n)


@cache
def _recorded(name: str, n_threads: int) -> Trace:
    return trace_program(name, n_threads)


@lru_cache(maxsize=2)
def _recorded_model(name: str, n_threads: int) -> Trace:
    return trace_program(name, n_threads)
