"""What every benchmark module shares: timers and one table printer.

A benchmark module `bench/bench_<area>.py` defines `run(report)`; it calls
`report(name, ours_s, oracle_s, oracle, goal=...)` once per row, with wall times in seconds
(best of N for the plain rows, the median of three runs for the rows that carry a goal).
The ratio printed is ours / theirs: below 1.0 we are faster. A goal is printed beside its row
with whether this run met it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable


def best_time(fn: Callable[[], object], repeat: int = 5, min_time: float = 0.05) -> float:
    """Best-of-`repeat` wall time of fn(), each sample looping until `min_time` has passed."""
    best = float("inf")
    for _ in range(repeat):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / n)
    return best


def median_of(measure: Callable[[], float], runs: int = 3) -> float:
    """The median of `runs` measurements (each a number measure() returns)."""
    return statistics.median(measure() for _ in range(runs))


@dataclass(frozen=True, slots=True)
class Goal:
    """A row's goal: ours / theirs at most `ratio`, ours at most `seconds`, or (a speed-up row)
    ours / theirs at least `at_least`."""

    ratio: float | None = None
    seconds: float | None = None
    nbytes: int | None = None  # ours at most this many bytes (a memory row)
    at_least: float | None = None

    def text(self) -> str:
        if self.ratio is not None:
            return f"<= {self.ratio:g}x"
        if self.seconds is not None:
            return f"<= {self.seconds * 1e3:g}ms" if self.seconds < 1 else f"<= {self.seconds:g}s"
        if self.nbytes is not None:
            return f"<= {self.nbytes / 2**30:g}GiB"
        return f">= {self.at_least:g}x theirs"

    def met(self, ours: float, theirs: float | None) -> bool | None:
        if self.seconds is not None:
            return ours <= self.seconds
        if self.nbytes is not None:
            return ours <= self.nbytes
        if not theirs:
            return None
        if self.ratio is not None:
            return ours / theirs <= self.ratio
        return ours / theirs >= self.at_least


class Table:
    """Collects rows and prints them aligned as they come."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float | None, str, Goal | None]] = []
        print(f"{'benchmark':<62} {'ours':>11} {'theirs':>11} {'ratio':>7}  {'vs':<10} goal")

    def __call__(self, name: str, ours: float, theirs: float | None, oracle: str = "ggml",
                 goal: Goal | None = None, unit: str = "s") -> None:
        """unit "s": times in seconds (printed in ms); "x": speed-ups (printed as they are); "B":
        bytes (printed in MiB)."""
        self.rows.append((name, ours, theirs, oracle, goal))
        show = {"s": lambda v: f"{v * 1e3:9.3f}ms", "x": lambda v: f"{v:10.2f}x",
                "B": lambda v: f"{v / 2**20:8.1f}MiB"}[unit]
        theirs_s = show(theirs) if theirs is not None else f"{'-':>11}"
        ratio = f"{ours / theirs:7.2f}" if theirs else f"{'-':>7}"
        verdict = ""
        if goal is not None:
            met = goal.met(ours, theirs)
            verdict = f"{goal.text()} ({'met' if met else 'not met' if met is not None else '?'})"
        print(f"{name:<62} {show(ours)} {theirs_s} {ratio}  {oracle:<10} {verdict}", flush=True)
