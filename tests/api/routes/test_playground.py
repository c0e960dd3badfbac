"""The playground over HTTP: the editor, Run, permalinks by the program's hash, refusals and
syntax errors at their line, errors as the trace's last step, the switch that turns it off, and a
server that keeps answering while a program runs into its limits."""

from __future__ import annotations

import html
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.playground import ProgramStore
from app.routes.playground import STARTER
from app.sandbox.run import Limits
from app.settings import Settings
from engine.models import bundled
from engine.programs import PROGRAMS, trace_program

VIEWS = Path(PROGRAMS["views-and-permute"].source_file).read_text()
MODEL = bundled.require(bundled.DATA_DIR).resolve()
LIMITS = Limits(cpu=3, wall=6)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A data directory with the bundled model in it (a link to the one `make setup` installs)."""
    d = tmp_path_factory.mktemp("data")
    (d / "models").mkdir()
    (d / "models" / MODEL.name).symlink_to(MODEL)
    return d


@pytest.fixture(scope="module")
def client(data):
    app = create_app(Settings(data_dir=data, programs=True))
    app.state.programs.limits = LIMITS
    yield TestClient(app)
    app.state.jobs.close(wait=60)  # no program of these tests runs on behind the next ones


def run(client, source: str, threads: int = 1):
    """Submit the program and follow its recording page until the debugger opens: the last
    response, a redirect to the step page (or the refusal, or the busy page)."""
    r = client.post("/programs", data={"source": source, "threads": str(threads)}, follow_redirects=False)
    if r.status_code == 303 and "/run?" in r.headers["location"]:
        r = until_recorded(client, r.headers["location"])
    return r


def until_recorded(client, url: str, seconds: float = 60):
    """GET a recording page (or a program's step page) until it redirects to a recorded step."""
    deadline = time.monotonic() + seconds
    while True:
        r = client.get(url, follow_redirects=False)
        if r.status_code == 303 and "/run?" in r.headers["location"]:
            url = r.headers["location"]
        elif r.status_code != 202:
            return r
        assert time.monotonic() < deadline, "the recording never finished"
        time.sleep(0.1)


def test_the_editor_opens_on_a_starter_a_fork_or_a_stored_program(client):
    r = client.get("/playground")
    assert r.status_code == 200 and "ggml_reshape_2d(ctx, a, 3, 4)" in html.unescape(r.text)
    assert '<script src="/static/codemirror-5.65.21.js"' in r.text
    r = client.get("/playground?from=views-and-permute")
    assert r.status_code == 200 and html.unescape(r.text).count("p = ggml_permute(ctx, x, 1, 0, 2, 3)") == 1
    assert 'id="refusal"' not in r.text
    r = client.get("/playground?program=" + "0" * 64)
    assert r.status_code == 404
    assert client.get("/playground?from=nope").status_code == 404
    assert client.get("/playground?program=" + "0" * 64).status_code == 404
    assert client.get("/playground?program=../etc").status_code == 422


def test_every_walkthrough_page_offers_an_editable_copy(client):
    r = client.get("/walkthroughs/views-and-permute/steps/3")
    assert 'href="/playground?from=views-and-permute"' in r.text and "Edit a copy" in r.text


def test_run_records_the_program_and_its_permalink_is_its_hash(client, data):
    source = VIEWS.replace("ggml_permute(ctx, x, 1, 0, 2, 3)", "ggml_permute(ctx, x, 2, 0, 1, 3)")
    r = run(client, source)
    digest = ProgramStore.digest(source)
    assert r.status_code == 303 and r.headers["location"] == f"/programs/{digest}/steps/0"
    assert (data / "programs" / f"{digest}.py").read_text() == source
    page = client.get(f"/programs/{digest}/steps/4")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "p = ggml_permute(ctx, x, 2, 0, 1, 3)" in text
    assert "nb = {16, 48, 4, 96}" in text  # the changed permute's strides, from the engine
    assert f'href="/playground?program={digest}"' in page.text  # Edit: back to the editor
    # another server process with the same store (a classmate's link) records it again: the
    # link shows the recording's page, then the same step
    other = TestClient(create_app(Settings(data_dir=data, programs=True)))
    first = other.get(f"/programs/{digest}/steps/4", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == f"/programs/{digest}/run?threads=1&step=4"
    waiting = other.get(first.headers["location"])
    assert waiting.status_code in (202, 200)  # (200: it was quick enough to be done)
    done = until_recorded(other, first.headers["location"])
    assert done.headers["location"] == f"/programs/{digest}/steps/4"
    again = other.get(done.headers["location"])
    assert again.status_code == 200 and "nb = {16, 48, 4, 96}" in html.unescape(again.text)
    assert client.get(f"/programs/{digest}/steps/99").status_code == 404
    assert client.get(f"/programs/{digest}").status_code == 200  # redirected to step 0
    assert client.get(f"/programs/{digest}/search?q=permute").status_code == 200


def test_windows_line_ends_give_the_same_program(client):
    r1, r2 = run(client, STARTER), run(client, STARTER.replace("\n", "\r\n"))
    assert r1.headers["location"] == r2.headers["location"]


def test_a_failed_assertion_is_the_last_step_at_its_line(client):
    source = STARTER.replace("ggml_reshape_2d(ctx, a, 3, 4)", "ggml_reshape_2d(ctx, a, 5, 4)")
    r = run(client, source)
    assert r.status_code == 303
    page = client.get(r.headers["location"])
    text = html.unescape(page.text)
    line = next(i + 1 for i, t in enumerate(source.splitlines()) if "ggml_reshape_2d" in t)
    m = re.search(r'class="line current error"[^>]*><span class="ln">(\d+)</span>', page.text)
    assert m and int(m.group(1)) == line
    assert ("ggml_reshape_2d: GGML_ASSERT(ggml_nelements(a) == ne0*ne1) failed: a ('a') has 12 elements, "
            "5×4 = 20") in text
    last = int(r.headers["location"].rsplit("/", 1)[1])
    assert last > 0 and client.get(r.headers["location"].replace(f"/steps/{last}", "/steps/1")).status_code == 200


@pytest.mark.parametrize("source, line, words", [
    ("def run(n_threads):\n    x = (\n", 2, "SyntaxError"),
    ("import os\n\ndef run(n_threads):\n    return {}\n", 1, "`import os` is refused"),
    ("def run(n_threads):\n    return ().__class__\n", 2, "`.__class__` is refused"),
    ("x = 1\nimport ctypes\n", 2, "`import ctypes` is refused"),
])
def test_refusals_and_syntax_errors_are_shown_in_the_editor_at_their_line(client, source, line, words):
    r = run(client, source)
    assert r.status_code == 422
    assert f'id="refusal" data-line="{line}"' in r.text
    assert words in html.unescape(r.text)
    assert html.escape(source, quote=False).strip() in r.text  # the program is kept in the editor


def test_a_program_that_never_ends_is_stopped_and_the_server_keeps_answering(client):
    looping = STARTER + "while True:\n    pass\n"
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("r", run(client, looping)))
    started = time.monotonic()
    worker.start()
    time.sleep(0.5)
    while worker.is_alive():  # meanwhile, every other page is served at once
        t = time.monotonic()
        assert client.get("/walkthroughs/simple-ctx/steps/1").status_code == 200
        assert time.monotonic() - t < 2
        time.sleep(0.3)
    worker.join()
    assert time.monotonic() - started < LIMITS.cpu + LIMITS.wall + 10
    r = result["r"]
    assert r.status_code == 303
    page = client.get(r.headers["location"])
    assert "the program used more than 3 s of CPU time" in page.text


def test_the_playground_is_off_unless_the_server_allows_it(data):
    off = TestClient(create_app(Settings(data_dir=data, programs=False)))
    assert off.get("/playground").status_code == 403
    assert "--allow-programs" in off.get("/playground").text
    assert run(off, STARTER).status_code == 403
    assert off.get(f"/programs/{ProgramStore.digest(STARTER)}/steps/0").status_code == 403
    assert "Edit a copy" not in off.get("/walkthroughs/simple-ctx/steps/0").text


def test_hashes_and_sizes_are_checked(client):
    assert client.get("/programs/" + "0" * 64 + "/steps/0").status_code == 404
    assert run(client, "x" * (64 * 1024 + 1)).status_code == 422
    assert client.get("/programs/../../etc/steps/0").status_code == 404


def test_lowering_simple_ctx_mem_size_triggers_ggmls_pool_message(client):
    """The accountant says how much of simple-ctx's `+ 1024` is used; the playground lets the
    learner lower it and meet ggml's message at the line that needed the room."""
    source = Path(PROGRAMS["simple-ctx"].source_file).read_text()
    assert "    ctx_size += 1024" in source
    r = run(client, source.replace("    ctx_size += 1024", "    ctx_size += 256"))
    page = html.unescape(client.get(r.headers["location"]).text)
    assert "not enough space in the context's memory pool" in page
    m = re.search(r'class="line current error"[^>]*><span class="ln">\d+</span>([^\n]*)', page)
    assert m and "ggml_mul_mat" in m.group(1)


@pytest.mark.parametrize("name", [n for n, p in PROGRAMS.items() if not p.steps_into])
def test_every_walkthrough_runs_unchanged_in_the_playground(client, name, monkeypatch):
    """Edit a copy, then Run: the copy is not refused, runs in the sandbox to its end (within the
    playground's own limits), and gives the walkthrough's own steps. (A walkthrough that steps
    into the engine's model builders offers no copy: a copy's steps are its own lines only.)"""
    monkeypatch.setattr(client.app.state.programs, "limits", Limits())
    editor = client.get(f"/playground?from={name}")
    assert editor.status_code == 200 and 'id="refusal"' not in editor.text
    source = Path(PROGRAMS[name].source_file).read_text()
    r = run(client, source, PROGRAMS[name].threads)
    assert r.status_code == 303 and "/steps/0" in r.headers["location"], r.headers.get("location")
    traces = client.app.state.traces
    trace = traces.kept(traces.program_key(ProgramStore.digest(source), PROGRAMS[name].threads))
    assert trace.error is None
    walkthrough = trace_program(name)
    assert [s.hash_bytes() for s in trace.steps[:-1]] == [s.hash_bytes() for s in walkthrough.steps[:-1]]
    last = client.get(f"/programs/{ProgramStore.digest(source)}/steps/{len(trace.steps) - 1}"
                      + ("" if PROGRAMS[name].threads == 1 else f"?threads={PROGRAMS[name].threads}"))
    assert last.status_code == 200 and 'id="returned"' in last.text


def test_a_plain_script_runs_and_its_last_step_shows_what_it_left(client):
    r = run(client, STARTER)
    assert r.status_code == 303
    digest = ProgramStore.digest(STARTER)
    trace = client.app.state.traces.kept(client.app.state.traces.program_key(digest, 1))
    assert trace.error is None and set(trace.outputs) == {"a", "b", "c"}
    page = html.unescape(client.get(f"/programs/{digest}/steps/{len(trace.steps) - 1}").text)
    returned = page[page.index('id="returned"'):]
    assert "c</code>" in returned and "4 × 3" in returned
    c_line = next(s.index for s in trace.steps if s.call.startswith("c = ggml_add"))
    assert f'made at step {c_line}' in returned  # where it came from
    assert [str(int(x)) for x in trace.outputs["c"][0]] == ["0", "2", "4"]


PRINTS = """import numpy as np

from engine.ggml import *

x = np.arange(6, dtype=np.float32).reshape(2, 3)
print(x)
print(repr(x.T), x.dtype, x.shape, np.float32(1.5), f"{x[1]}", np.finfo(np.float32).eps)
print(np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]), np.arange(2000))
"""


def test_a_program_prints_numpy_arrays_as_python_prints_them(client):
    """numpy's C code imports its printing module when an array is first printed; through the
    program's builtins that import was refused, and every print of an array ended the program."""
    r = run(client, PRINTS)
    assert r.status_code == 303
    trace = client.app.state.traces.kept(client.app.state.traces.program_key(ProgramStore.digest(PRINTS), 1))
    assert trace.error is None, trace.error
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    expected = "\n".join([str(x), " ".join(map(str, (repr(x.T), x.dtype, x.shape, np.float32(1.5), f"{x[1]}",
                                                      np.finfo(np.float32).eps))),
                          " ".join(map(str, (np.array([(1, 2.0)], dtype=[("a", "i4"), ("b", "f8")]),
                                             np.arange(2000)))), ""])
    assert trace.printed == expected
    page = html.unescape(client.get(f"/programs/{ProgramStore.digest(PRINTS)}/steps/0").text)
    assert "[[0. 1. 2.]\n [3. 4. 5.]]" in page


def test_a_slow_walkthrough_shows_its_recordings_progress(client, monkeypatch):
    """A new prompt for the model takes seconds: the step's URL answers at once with the
    recording's page (steps recorded so far), which opens the step when the trace is kept."""
    from app import traces

    monkeypatch.setattr(traces, "QUICK", 0.0)
    r = client.get("/walkthroughs/gemma3/steps/3?prompt=Two%20plus%20two%20is", follow_redirects=False)
    assert r.status_code == 303
    url = r.headers["location"]
    assert url.startswith("/walkthroughs/gemma3/recording?") and "step=3" in url
    seen = []
    deadline = time.monotonic() + 120
    while (page := client.get(url, follow_redirects=False)).status_code == 202:
        seen.append(int(re.search(r'data-steps="(\d+)"', page.text).group(1)))
        assert "Recording gemma3" in page.text and time.monotonic() < deadline
        time.sleep(0.2)
    assert page.status_code == 303
    assert page.headers["location"] == "/walkthroughs/gemma3/steps/3?prompt=Two%20plus%20two%20is"
    assert seen and seen == sorted(seen)  # the count only grows
    assert client.get(page.headers["location"]).status_code == 200


def test_without_the_boundary_the_playground_says_so_and_runs_nothing(data, monkeypatch):
    """Fail closed: on a machine where the kernel boundary cannot be set up (here: no bwrap),
    the editor says why and Run answers 503 without running anything."""
    from app.sandbox import boundary as B

    monkeypatch.setattr(B, "_PROBED", {})
    monkeypatch.setattr(B.shutil, "which", lambda name: None)
    c = TestClient(create_app(Settings(data_dir=data, programs=True)))
    page = html.unescape(c.get("/playground").text)
    assert 'id="missing"' in page and "bubblewrap (bwrap) is not installed" in page
    r = c.post("/programs", data={"source": STARTER + "\n# not run\n", "threads": "1"}, follow_redirects=False)
    assert r.status_code == 503 and "Programs cannot run on this server" in html.unescape(r.text)
    traces = c.app.state.traces
    assert traces.kept(traces.program_key(ProgramStore.digest(STARTER + "\n# not run\n"), 1)) is None
