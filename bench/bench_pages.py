"""The debugger's step pages as a learner gets them, through the app (FastAPI's TestClient, in
process): a walkthrough recorded once and its first page served, then 40 steps at random
(random.Random(0)) asked for as whole pages, and 40 others (random.Random(1)) as htmx asks for
them when stepping: the debugger's root, then the graph's SVG when the step shows another
drawing (graphviz draws it on first sight). Rows print the p95 of 40; the row with a goal is the
median of three such p95s, each of 40 other steps (random.Random(0), (2) and (3)), served one
after another by the same app. Nothing here has a ggml counterpart.

`python -m bench pages`; GGML_LENS_BENCH_PROFILE=1 profiles the steps with pyinstrument.
"""

from __future__ import annotations

import os
import random
import re
import time

from bench.common import Goal

N_STEPS = 40
_SVG = re.compile(r'hx-get="([^"]*/graph/[0-9a-f]{16}\.svg[^"]*)"')


def run(report) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings
    from engine.models.bundled import BundledModelError, require

    client = TestClient(create_app(Settings.from_env()))
    _walk(report, client, "minilm", "")
    try:
        require(Settings.from_env().data_dir)
    except BundledModelError as e:
        print(f"gemma3: {e}")
        return
    _walk(report, client, "gemma3", "then=506")


def _walk(report, client, name: str, query: str) -> None:
    """Record `name` (its first page waits for it), then time N_STEPS random steps."""
    cache = client.app.state.traces
    then = tuple(int(x) for x in query.removeprefix("then=").split(",")) if query else ()
    recipe = cache.key(name, None, None, None, then)
    t0 = time.perf_counter()
    trace = cache.kept(recipe) or cache.record(recipe)
    recorded = time.perf_counter() - t0
    base = f"/walkthroughs/{name}/steps"
    q = f"?{query}" if query else ""
    t0 = time.perf_counter()
    first = client.get(f"{base}/0{q}")
    assert first.status_code == 200, first.status_code
    report(f"{name}: recorded ({len(trace.steps)} steps), first page", recorded + time.perf_counter() - t0,
           None, "-")
    htmx = {"HX-Request": "true"}
    profiler = _profiler()
    runs = [_pages(client, f"{base}/{{}}{q}", random.Random(seed).sample(range(len(trace.steps)), N_STEPS))
            for seed in ((0, 2, 3) if name == "gemma3" else (0,))]
    shown = ""  # the drawing on the page: htmx keeps it (hx-preserve) while its key is the same
    swaps, svgs = [], []
    for k in random.Random(1).sample(range(len(trace.steps)), N_STEPS):
        t0 = time.perf_counter()
        r = client.get(f"{base}/{k}{q}", headers=htmx)
        swaps.append(time.perf_counter() - t0)
        svg = _SVG.search(r.text)
        if svg and svg.group(1) != shown:
            t0 = time.perf_counter()
            client.get(svg.group(1).replace("&amp;", "&"))
            svgs.append(time.perf_counter() - t0)
            shown = svg.group(1)
    if profiler is not None:
        profiler.stop()
        profiler.print(show_all=False)
    middle = sorted(runs)[len(runs) // 2]  # the run whose page p95 is the median
    report(f"{name}: a step's page, p95 of {N_STEPS}" + (f", median of {len(runs)} runs" if len(runs) > 1 else "")
           + f" (server {middle[1] * 1e3:.0f} ms, CPU {middle[2] * 1e3:.0f} ms"
           + (f"; p95s {', '.join(f'{r[0] * 1e3:.0f}' for r in runs)} ms" if len(runs) > 1 else "") + ")",
           middle[0], None, "-", Goal(seconds=0.05) if name == "gemma3" else None)
    report(f"{name}: a step as htmx swaps it (the debugger's root), p95 of {N_STEPS}", _p95(swaps), None, "-")
    if svgs:
        report(f"{name}: the graph's SVG when a swap shows another drawing ({len(svgs)} of {N_STEPS}), p95",
               _p95(svgs), None, "-")


def _pages(client, url: str, steps: list[int]) -> tuple[float, float, float]:
    """The p95s of these steps' whole pages: as the client waits, as the server's own timing says,
    and as the process's CPU (what a busy machine does not add)."""
    pages, servers, cpus = [], [], []
    for k in steps:
        t0, c0 = time.perf_counter(), time.process_time()
        r = client.get(url.format(k))
        pages.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
        assert r.status_code == 200, (k, r.status_code)
        servers.append(float(r.headers["Server-Timing"].split("dur=")[1]) / 1e3)
    return _p95(pages), _p95(servers), _p95(cpus)


def _p95(times: list[float]) -> float:
    return sorted(times)[min(len(times) - 1, int(0.95 * len(times)))]


def _profiler():
    if not os.environ.get("GGML_LENS_BENCH_PROFILE"):
        return None
    from pyinstrument import Profiler

    profiler = Profiler(interval=0.0005)
    profiler.start()
    return profiler
