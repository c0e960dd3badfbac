"""The perplexity page against `ggml-lens perplexity` (itself held equal to llama-perplexity by
tests/conformance/test_perplexity.py): the same model, text and -c print the same running
estimates and final line, the KLD table and statistics; the heat map's per-token figures are the
terms of those sums (summed again by the engine's own functions, they print the same lines);
what the page caps is refused in words, never run."""

from __future__ import annotations

import contextlib
import html
import io
import os
import re
import shutil
import time

import pytest
from fastapi.testclient import TestClient

from app.cli import main
from app.main import create_app
from app.perplexity_runs import BUILTIN_TEXT, MAX_EVAL_TOKENS, MAX_TEXT_BYTES, WORK_LIMIT
from app.settings import Settings
from engine.models.perplexity import mean_and_uncertainty, ppl_estimate
from engine.models.perplexity_scores import final_estimate_line
from engine.programs import FIXTURES_DIR
from tests.conformance.test_perplexity import kld_lines, ppl_figures

FINAL = re.compile(r"Final estimate: PPL = \S+ \+/- \S+")
NLL = re.compile(r'<span class="t s"[^>]*data-nll="([^"]+)"')
KLD = re.compile(r'data-kld="([^"]+)"')


def ours(*argv) -> str:
    """What `ggml-lens perplexity ARGV` prints (run in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        assert main(["perplexity", *map(str, argv)]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def models(tmp_path_factory, gemma_path):
    """A models folder: the bundled Gemma and its Q4_0 requantization (by `ggml-lens quantize`)."""
    folder = tmp_path_factory.mktemp("models")
    try:
        os.link(gemma_path, folder / gemma_path.name)
    except OSError:  # another file system: a copy (a link leading outside is not listed)
        shutil.copyfile(gemma_path, folder / gemma_path.name)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["quantize", "--allow-requantize", str(gemma_path),
                     str(folder / "gemma-q4_0.gguf"), "Q4_0", "2"]) == 0
    return folder


@pytest.fixture(scope="module")
def client(models, tmp_path_factory):
    app = create_app(Settings(data_dir=tmp_path_factory.mktemp("data"), models_dir=models))
    with TestClient(app) as c:
        yield c
    app.state.perplexity.close()


def finished(client: TestClient, url: str, seconds: float = 300) -> tuple[str, list[str]]:
    """The run's page once it is done; and what each progress page said meanwhile."""
    said, deadline = [], time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = client.get(url)
        if r.status_code != 202:
            return r.text, said
        said += re.findall(r"\d+ of \d+ chunks scored", r.text)
        assert 'hx-trigger="every 1s"' in r.text
        time.sleep(0.5)
    raise AssertionError(f"{url} did not finish in {seconds} s")


def printed(page: str, pre: str = "ppl-summary") -> str:
    """The text of one of the page's printed blocks (#ppl-summary, #ppl-kld)."""
    return html.unescape(re.search(rf'<pre class="printed" id="{pre}"[^>]*>(.*?)</pre>', page,
                                   re.S).group(1))


def start(client: TestClient, **form) -> str:
    r = client.post("/perplexity", data={"model": "gemma-3-270m-q4_k_m.gguf", **form},
                    follow_redirects=False)
    assert r.status_code == 303, r.text
    return r.headers["location"]


def test_the_form_offers_the_models_folder_and_the_built_in_text(client):
    page = client.get("/perplexity").text
    assert '<option value="gemma-3-270m-q4_k_m.gguf" selected>' in page
    assert '<option value="gemma-q4_0.gguf"' in page
    assert '<option value="128" selected>' in page
    assert "Lighthouses and the Light They Throw" in page


def test_the_page_prints_what_ggml_lens_perplexity_prints(client, gemma_path):
    url = start(client, c="128", chunks="3", source="builtin")
    page, said = finished(client, url)
    cli = ours(gemma_path, "-f", BUILTIN_TEXT, "-c", "128", "--chunks", "3")
    assert len(ppl_figures(cli)) == 4, cli
    assert ppl_figures(printed(page)) == ppl_figures(cli)
    assert said, "no progress page while it ran"
    assert all(re.fullmatch(r"[0-3] of 3 chunks scored", s) for s in said), said


def test_the_heat_maps_values_are_the_terms_of_the_printed_sums(client):
    page, _ = finished(client, start(client, c="64", chunks="4", source="builtin"))
    nll = [float(v) for v in NLL.findall(page)]
    assert len(nll) == 4 * (64 - 1 - 32)  # the scored tokens, each once
    total, total2 = 0.0, 0.0
    for x in nll:  # in the order the tool adds them
        total, total2 = total + x, total2 + x * x
    ppl, unc = ppl_estimate(total, total2, len(nll))
    assert final_estimate_line(ppl, unc) == FINAL.search(printed(page)).group(0)
    # positions 0 .. 32 of each chunk are context, shown without a value (and the first of
    # chunks 2 to 4 decoded as BOS)
    assert page.count('class="t context"') == 4 * 33 - 3 and page.count('class="t bos"') == 3


def test_a_learners_text_is_scored_as_a_file_holding_it(client, gemma_path, tmp_path):
    text = BUILTIN_TEXT.read_text().split("\n\n", 3)
    own = "\n\n".join(text[:3])
    path = tmp_path / "own.txt"
    path.write_text(own + "\n")
    page, _ = finished(client, start(client, c="64", chunks="2", source="own",
                                     text=own.replace("\n", "\r\n")))  # as a browser sends it
    assert ppl_figures(printed(page)) == \
        ppl_figures(ours(gemma_path, "-f", path, "-c", "64", "--chunks", "2"))


def test_the_kl_divergence_is_what_ggml_lens_perplexity_prints(client, models, tmp_path):
    base_file = tmp_path / "base.bin"
    base_print = ours(models / "gemma-3-270m-q4_k_m.gguf", "-f", BUILTIN_TEXT, "-c", "128",
                      "--chunks", "2", "--kl-divergence-base", base_file)
    expected = kld_lines(ours(models / "gemma-q4_0.gguf", "-c", "128", "--kl-divergence",
                              "--kl-divergence-base", base_file))
    assert expected[-1].startswith("Same top p:")
    page, _ = finished(client, start(client, c="128", chunks="2", source="builtin",
                                     kld="gemma-q4_0.gguf"))
    lines = printed(page, "ppl-kld").splitlines()
    assert [ln.rstrip() for ln in lines if ln.strip()] == expected
    assert ppl_figures(printed(page)) == ppl_figures(base_print)  # the base's own, as it writes its file
    kld = [float(v) for v in KLD.findall(page)]
    assert len(kld) == 2 * 63
    mean = mean_and_uncertainty(sum(kld), sum(k * k for k in kld), len(kld))
    assert f"Mean    KLD: {mean[0]:10.6f} ± {mean[1]:10.6f}" in expected


@pytest.mark.parametrize("form, status, words", [
    ({"source": "own", "text": "x" * (MAX_TEXT_BYTES + 1)}, 413,
     f"The text is {MAX_TEXT_BYTES + 1} bytes; the page scores at most {MAX_TEXT_BYTES} bytes"),
    ({"source": "own", "text": "  \r\n "}, 422, "The text is empty"),
    ({"c": "128", "chunks": str(MAX_EVAL_TOKENS // 128 + 1)}, 422,
     f"--chunks must be 1 to {MAX_EVAL_TOKENS // 128} at -c 128"),
    ({"chunks": "two"}, 422, "--chunks must be a whole number (got two)"),
    ({"c": "100"}, 422, "-c must be one of 64, 128, 256, 512 (got 100)"),
    ({"model": "../../etc/passwd"}, 404, "No model named ../../etc/passwd in the models folder"),
])
def test_what_the_page_caps_is_refused_in_words(client, form, status, words):
    r = client.post("/perplexity", data={"model": "gemma-3-270m-q4_k_m.gguf", "source": "builtin",
                                         **form}, follow_redirects=False)
    assert r.status_code == status
    assert words in html.unescape(r.text)
    assert 'role="alert"' in r.text and "Traceback" not in r.text
    assert '<form method="post" action="/perplexity"' in r.text  # the form again, to fix it


def test_a_large_model_decodes_fewer_tokens(client, models):
    shutil.copyfile(FIXTURES_DIR / "ggml-vocab-llama-spm.gguf", models / "big.gguf")
    with open(models / "big.gguf", "r+b") as f:  # a llama header, then a sparse tail: only its
        f.truncate(WORK_LIMIT // 500)  # size counts before a run (so 500 tokens)
    try:
        r = client.post("/perplexity", data={"model": "big.gguf", "c": "512"})
        assert r.status_code == 422
        assert "too large for the page at -c 512: it decodes at most 500 tokens" in r.text
        r = client.get("/perplexity/run?model=big.gguf&c=128&chunks=4")
        assert r.status_code == 422
        assert "--chunks must be 1 to 3 at -c 128" in html.unescape(r.text)
        r = client.post("/perplexity", data={"model": "big.gguf", "c": "64", "chunks": "7"},
                        follow_redirects=False)
        assert r.status_code == 303
    finally:
        (models / "big.gguf").unlink()


def test_a_run_url_past_the_caps_is_refused(client):
    r = client.get("/perplexity/run?model=gemma-3-270m-q4_k_m.gguf&c=512&chunks=5")
    assert r.status_code == 422
    assert "--chunks must be 1 to 4 at -c 512" in html.unescape(r.text)
    r = client.get("/perplexity/run?model=gemma-3-270m-q4_k_m.gguf&text=" + "0" * 64)
    assert r.status_code == 404 and "no longer kept" in r.text


def test_a_file_that_predicts_no_token_is_refused_in_words(client, models):
    shutil.copyfile(FIXTURES_DIR / "minilm-q8_0.gguf", models / "minilm.gguf")
    shutil.copyfile(FIXTURES_DIR / "ggml-vocab-llama-spm.gguf", models / "vocab-only.gguf")
    try:
        r = client.get("/perplexity/run?model=minilm.gguf&c=64")
        assert r.status_code == 422
        assert "minilm.gguf does not predict next tokens (it is not a decoder model)" in \
            html.unescape(r.text)
        r = client.get("/perplexity/run?model=gemma-3-270m-q4_k_m.gguf&kld=minilm.gguf")
        assert r.status_code == 422 and "minilm.gguf does not predict" in html.unescape(r.text)
        page, _ = finished(client, start(client, model="vocab-only.gguf", c="64"))
        assert "The run stopped: " in page and "needs tensor 'token_embd.weight'" in \
            html.unescape(page)
    finally:
        (models / "minilm.gguf").unlink()
        (models / "vocab-only.gguf").unlink()


def test_a_text_too_short_for_two_chunks_ends_in_the_tools_words(client):
    page, _ = finished(client, start(client, c="512", source="own", text="A short text."))
    assert "you need at least 1024 tokens to evaluate perplexity with a context of 512" in page
    assert 'role="alert"' in page and "Traceback" not in page
