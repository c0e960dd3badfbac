"""The app exactly as the README starts it: `make run` in the checkout, nothing exported (the
relative data directory `var`, the bundled model, the playground on because it listens on
localhost). From there a learner runs the starter program, steps a walkthrough, uploads a GGUF
file, loads it in gguf-load, steps the model walkthrough and a program that reads the bundled
model. Every other test passes an absolute temporary data directory; this one is what ships.
"""

from __future__ import annotations

import html
import re
import time

import pytest

from app.routes.playground import STARTER
from engine.programs import FIXTURES_DIR
from tests.support.served import make_run

RECORDING = 180  # seconds a recording may take on a loaded machine (the model walkthrough's)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with make_run(tmp_path_factory.mktemp("make-run") / "server.log") as served:
        with served.client(timeout=60) as client:
            client.served = served
            yield client


def follow(client, url: str) -> tuple[str, object]:
    """GET url, following redirects and recording pages (202, polled) until a page answers."""
    deadline = time.monotonic() + RECORDING
    while True:
        r = client.get(url)
        if r.status_code in (301, 302, 303, 307):
            url = r.headers["location"]
        elif r.status_code == 202 or "HX-Redirect" in r.headers:
            url = r.headers.get("HX-Redirect", url)
            time.sleep(0.2)
        else:
            return url, r
        assert time.monotonic() < deadline, f"{url} was still recording after {RECORDING} s"


def last_step(client, url: str) -> str:
    """The text of the last step of the trace whose step page is `url`."""
    n = int(re.search(r'name="step" min="0" max="(\d+)"', client.get(url).text).group(1))
    r = client.get(re.sub(r"/steps/\d+", f"/steps/{n}", url))
    assert r.status_code == 200, r.text[-2000:]
    return html.unescape(r.text)


def test_the_starter_program_runs_in_the_sandbox(app):
    r = app.get("/playground")
    assert r.status_code == 200 and "n_threads" in html.unescape(r.text)
    assert "Programs cannot run on this server" not in r.text, r.text
    r = app.post("/programs", data={"source": STARTER, "threads": "2"})
    assert r.status_code == 303, r.text[-2000:]
    url, page = follow(app, r.headers["location"])
    assert page.status_code == 200 and url.startswith("/programs/"), (url, page.text[-2000:])
    text = last_step(app, url)
    assert "the worker" not in text, text[-3000:]  # (no failure: the trace of the program itself)
    assert "ggml_graph_compute_with_ctx" in text and 'current error"' not in text


def test_a_walkthrough_steps(app):
    url, page = follow(app, "/walkthroughs/simple-ctx")
    assert page.status_code == 200 and "/walkthroughs/simple-ctx/steps/0" in url
    assert "ggml_init" in html.unescape(page.text)


def test_an_upload_opens_and_gguf_load_reads_it(app):
    data = (FIXTURES_DIR / "ggml-vocab-llama-spm.gguf").read_bytes()
    r = app.post("/gguf", files={"file": ("vocab.gguf", data, "application/octet-stream")})
    assert r.status_code == 303, r.text[-2000:]
    digest = r.headers["location"].rstrip("/").split("/")[-1]
    assert re.fullmatch(r"[0-9a-f]{64}", digest)
    page = app.get(f"/gguf/{digest}")
    assert page.status_code == 200 and "key-value pairs" in page.text and "Load into a context" in page.text
    url, step = follow(app, f"/walkthroughs/gguf-load?file={digest}")
    assert step.status_code == 200 and "/walkthroughs/gguf-load/steps/0" in url, step.text[-2000:]
    assert f"file={digest}" in url


def test_the_model_walkthrough_runs_the_bundled_model(app):
    url, page = follow(app, "/walkthroughs/gemma3")
    assert page.status_code == 200 and "/walkthroughs/gemma3/steps/0" in url, page.text[-2000:]
    text = last_step(app, url)
    assert "Paris" in text or "paris" in text.lower(), text[-3000:]


def test_a_program_reads_the_bundled_model_in_the_sandbox(app):
    """The copy of a model walkthrough: the worker reads the bundled model bound read-only into
    its sandbox (a relative data directory once made every run fail before it started)."""
    source = html.unescape(re.search(r'<textarea[^>]*>(.*?)</textarea>',
                                     app.get("/playground?from=gemma3").text, re.S).group(1))
    r = app.post("/programs", data={"source": source, "threads": "1"})
    assert r.status_code == 303, r.text[-2000:]
    url, page = follow(app, r.headers["location"])
    assert page.status_code == 200 and url.startswith("/programs/"), page.text[-2000:]
    text = last_step(app, url)
    assert "the worker" not in text and 'current error"' not in text, text[-3000:]


def test_the_server_is_alone_after_the_runs(app):
    assert app.served.alive()
    assert app.served.no_children_within(10) == []
