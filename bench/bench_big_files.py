"""Files of the sizes learners bring (bench/big_files.py: Llama-3-shaped 1B, 3B and 8B files in
Q4_K, written once and cached), the engine against llama.cpp on the same file, each side in a
process of its own (bench/big_run.py): llama.cpp's default path (weights mapped and repacked,
flash attention), -c 4096, 1 thread; then the `model` walkthrough recorded on the file as the
server records it, and 40 random step pages served.

Rows, each with the big-files issue's goal (the first three the median of three processes a side):
- `generate`'s peak resident memory against llama.cpp's (<= 1.2x);
- start: from the process's start to the first token's logits (<= 2x);
- decode per token after a 6-token prompt (<= 1.2x);
- the walkthrough recorded (prompt of 6 tokens + 1): <= 5 s for 1B, <= 30 s for 8B;
- the server's anonymous resident memory after recording, beyond the file's pages (<= 0.5 GiB);
- the p95 of 40 random step pages (<= 100 ms).

GGML_LENS_BENCH_SIZES picks the sizes (default "1B 3B 8B"; the 8B file takes 5 GB of disk).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import time

from bench.common import Goal

N_DECODE = 16
THREADS = 1
N_CTX = 4096
PAGES = 40


def _run(engine: str, path: str) -> dict:
    """One side's figures, each the median of three processes."""
    runs = []
    for _ in range(3):
        t0 = time.time()
        out = subprocess.run([sys.executable, "-m", "bench.big_run", engine, path, str(N_DECODE),
                              str(THREADS), str(N_CTX)], check=True, capture_output=True, text=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        got["start"] = got["first"] - t0
        runs.append(got)
    return {key: statistics.median(r[key] for r in runs) for key in ("start", "per_token", "peak")}


def _anon() -> int:
    """The process's resident memory that is no file's pages: anonymous and shared memory (the
    trace's mirror of repacked weights is a memory file)."""
    total = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon:", "RssShmem:")):
                total += int(line.split()[1]) * 1024
    return total


def _walkthrough(path: str) -> tuple[float, int, float]:
    """Record the model walkthrough through the app (its defaults), then serve 40 random step
    pages: (seconds recording, anonymous memory it left, p95 of the pages in seconds)."""
    import tempfile
    from pathlib import Path

    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    models = Path(path).parent
    with tempfile.TemporaryDirectory() as data:
        client = TestClient(create_app(Settings(data_dir=Path(data), models_dir=models)))
        digest = next(f.digest for f in client.app.state.store.models() if f.name == Path(path).name)
        prompt = "The capital of France is"
        traces = client.app.state.traces
        before = _anon()
        t0 = time.perf_counter()
        client.get(f"/walkthroughs/model?file={digest}&prompt={prompt}")
        while (trace := traces.kept(traces.key("model", None, digest, prompt, ()))) is None:
            time.sleep(0.1)  # (a job: the page polls until the trace is kept)
        recorded = time.perf_counter() - t0
        left = _anon() - before
        n = len(trace.steps)
        times = []
        for k in random.Random(0).sample(range(n), min(PAGES, n)):
            t = time.perf_counter()
            client.get(f"/walkthroughs/model/steps/{k}?file={digest}&prompt={prompt}")
            times.append(time.perf_counter() - t)
        times.sort()
        return recorded, left, times[int(0.95 * (len(times) - 1))]


def run(report) -> None:
    from bench.big_files import big_file

    try:
        import llama_cpp  # noqa: F401
        oracle = "llama.cpp"
    except ImportError:
        oracle = None
    for size in os.environ.get("GGML_LENS_BENCH_SIZES", "1B 3B 8B").split():
        path = str(big_file(size))
        ours = _run("ours", path)
        theirs = _run("llama.cpp", path) if oracle else None
        name = f"llama3 {size} Q4_K, -c {N_CTX}, {THREADS} thread"
        report(f"{name}: peak resident memory", ours["peak"], theirs and theirs["peak"],
               oracle or "-", Goal(ratio=1.2), unit="B")
        report(f"{name}: start (load + 6-token prompt)", ours["start"], theirs and theirs["start"],
               oracle or "-", Goal(ratio=2))
        report(f"{name}: decode per token", ours["per_token"], theirs and theirs["per_token"],
               oracle or "-", Goal(ratio=1.2))
        recorded, left, p95 = _walkthrough(path)
        report(f"llama3 {size}: model walkthrough recorded", recorded, None, "-",
               Goal(seconds=5 if size == "1B" else 30))
        report(f"llama3 {size}: server memory after recording, beyond the file's", left, None, "-",
               Goal(nbytes=1 << 29), unit="B")
        report(f"llama3 {size}: step page p95 of {PAGES}", p95, None, "-", Goal(seconds=0.1))
