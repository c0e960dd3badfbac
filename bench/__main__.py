"""Run every `bench/bench_*.py` module (or those named on the command line) in one table."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import bench
from bench.common import Table


def main(argv: list[str]) -> int:
    names = sorted(m.name for m in pkgutil.iter_modules(bench.__path__) if m.name.startswith("bench_"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    table = Table()
    for name in names:
        importlib.import_module(f"bench.{name}").run(table)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
