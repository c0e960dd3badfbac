"""What every benchmark module shares: a timer and one table printer.

A benchmark module `bench/bench_<area>.py` defines `run(report)`; it calls
`report(name, ours_s, oracle_s, oracle)` once per row, with best-of-N wall times in seconds.
The ratio printed is ours / theirs: below 1.0 we are faster.
"""

from __future__ import annotations

import time
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


class Table:
    """Collects rows and prints them aligned as they come."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, float | None, str]] = []
        print(f"{'benchmark':<58} {'ours':>11} {'theirs':>11} {'ratio':>7}  vs")

    def __call__(self, name: str, ours: float, theirs: float | None, oracle: str = "ggml") -> None:
        self.rows.append((name, ours, theirs, oracle))
        theirs_s = f"{theirs * 1e3:9.3f}ms" if theirs is not None else f"{'-':>11}"
        ratio = f"{ours / theirs:7.2f}" if theirs else f"{'-':>7}"
        print(f"{name:<58} {ours * 1e3:9.3f}ms {theirs_s} {ratio}  {oracle}", flush=True)
