"""The recorder and the debugger's pages: record time and size of a big trace, state rebuild time,
server time per step page. Nothing here has a ggml counterpart, so rows print without a ratio."""

from __future__ import annotations

import importlib.util
import random
import statistics
import tempfile
import time
from pathlib import Path

from engine.trace import record

BIG = '''
import numpy as np
from engine.ggml import *

N_NODES = 2000

def run(n_threads=1):
    n = 6250  # 25 KB of f32 per tensor: 2000 nodes write 50 MB
    ctx = ggml_init(ggml_init_params(mem_size=60 * 1024 * 1024, mem_buffer=None, no_alloc=False))
    x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, n)
    set_data(x, np.ones(n, dtype=np.float32))
    y = x
    for i in range(N_NODES):
        y = ggml_add(ctx, y, x)
    gf = ggml_new_graph_custom(ctx, 4096, False)
    ggml_build_forward_expand(gf, y)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {}
'''


def _load(src: str):
    path = Path(tempfile.mkdtemp(prefix="ggml-lens-bench-")) / "big_program.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("big_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod, str(path)


def run(report) -> None:
    mod, path = _load(BIG)
    t0 = time.perf_counter()
    trace = record(mod.run, path, "big", 1)
    took = time.perf_counter() - t0
    stored = sum(len(p.data) for s in trace.steps for p in s.patches)
    report(f"record a 2000-node graph over 50 MB ({len(trace.steps)} steps, "
           f"{stored / 2**20:.0f} MB kept)", took, None, "-")
    rng = random.Random(0)
    times = []
    for k in [rng.randrange(len(trace.steps)) for _ in range(20)] + [len(trace.steps) - 1]:
        t0 = time.perf_counter()
        trace.state_at(k)
        times.append(time.perf_counter() - t0)
    report("rebuild the state at a step of it (p50)", statistics.median(times), None, "-")
    report("rebuild the state at a step of it (max)", max(times), None, "-")

    from fastapi.testclient import TestClient

    from app.main import create_app
    from engine.programs import PROGRAMS

    client = TestClient(create_app())
    for name in PROGRAMS:
        first = client.get(f"/walkthroughs/{name}/steps/0")
        for _ in range(600):  # a long recording runs as a job: its progress page comes first
            if 'max="' in first.text:
                break
            time.sleep(0.5)
            first = client.get(f"/walkthroughs/{name}/steps/0")
        n = int(first.text.split('max="')[1].split('"')[0]) + 1
        steps = list(range(n)) if n <= 60 else sorted(random.Random(1).sample(range(n), 60))
        times = []
        for k in steps:
            t0 = time.perf_counter()
            client.get(f"/walkthroughs/{name}/steps/{k}", headers={"HX-Request": "true"})
            times.append(time.perf_counter() - t0)
        times.sort()
        p95 = times[min(len(times) - 1, int(0.95 * len(times)))]
        report(f"step page {name} p50 (p95 {p95 * 1e3:.0f} ms)", statistics.median(times), None,
               "-")

    # the GGUF inspector on the largest fixture: upload, then open its page (first and warm)
    from engine.programs import FIXTURES_DIR

    data = (FIXTURES_DIR / "minilm-q8_0.gguf").read_bytes()
    t0 = time.perf_counter()
    r = client.post("/gguf", files={"file": ("minilm.gguf", data)}, follow_redirects=False)
    report("inspector: upload the 25 MB MiniLM GGUF", time.perf_counter() - t0, None, "-")
    url = r.headers["location"]
    t0 = time.perf_counter()
    client.get(url)
    report("inspector: open its page, first time", time.perf_counter() - t0, None, "-")
    warm = []
    for _ in range(10):
        t0 = time.perf_counter()
        client.get(url)
        warm.append(time.perf_counter() - t0)
    report("inspector: open its page again (p50)", statistics.median(warm), None, "-")
