"""A models folder (`ggml-lens serve --models DIR`): its GGUF files are listed and opened in
place, whatever their size, and nothing outside the folder can be reached."""

from __future__ import annotations

import html
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gguf import GGMLQuantizationType, GGUFWriter

from app.main import create_app
from app.settings import Settings
from engine.programs import FIXTURES_DIR

MINILM = FIXTURES_DIR / "minilm-q8_0.gguf"
BIG = 40 << 30  # bytes of tensor data the big file declares


def write_big_sparse(path: Path) -> None:
    """A 40 GB GGUF file written by gguf-py, its tensor data a hole (sparse: it costs no disk)."""
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tensor_info("token_embd.weight", (1 << 20, 10240), np.dtype(np.float32), BIG,
                      raw_dtype=GGMLQuantizationType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(header + (-header % 32) + BIG)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    (root / "sub").mkdir()
    (root / "sub" / "minilm.gguf").write_bytes(MINILM.read_bytes())
    write_big_sparse(root / "big-40g.gguf")
    outside = tmp_path_factory.mktemp("outside") / "secret.gguf"
    outside.write_bytes(MINILM.read_bytes())
    (root / "escape.gguf").symlink_to(outside)  # a link out of the folder: never listed
    (root / "notes.txt").write_text("not a model")
    return root


@pytest.fixture(scope="module")
def client(models: Path, tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    settings = Settings(data_dir=tmp_path_factory.mktemp("data"), fixtures_dir=FIXTURES_DIR,
                        models_dir=models)
    return TestClient(create_app(settings))


def _links(client: TestClient) -> dict[str, str]:
    app = client.app
    return {f.name: f"/gguf/{f.digest}" for f in app.state.store.models()}


def test_the_folder_is_listed(client: TestClient, models: Path) -> None:
    page = client.get("/gguf").text
    assert f"Your models in <code>{models.resolve()}</code>" in page
    assert "big-40g.gguf" in page and "sub/minilm.gguf" in page
    assert "escape.gguf" not in page and "notes.txt" not in page
    assert set(_links(client)) == {"big-40g.gguf", "sub/minilm.gguf"}


def test_a_40_gb_file_opens_in_place_by_its_header(client: TestClient, models: Path) -> None:
    url = _links(client)["big-40g.gguf"]
    t0 = time.perf_counter()
    r = client.get(url)
    assert r.status_code == 200, r.text
    assert time.perf_counter() - t0 < 10  # the header only: no 40 GB read, copy or hash
    assert "token_embd.weight" in r.text and "40" in r.text
    assert not any(Path(client.app.state.settings.uploads).glob("*.gguf"))  # nothing copied


def test_a_model_file_reads_like_an_upload(client: TestClient) -> None:
    url = _links(client)["sub/minilm.gguf"]
    assert client.get(url).status_code == 200
    assert "blk.0.attn_q.weight" in client.get(url).text
    assert client.get(url + "/tensors/blk.0.attn_q.weight").status_code == 200


def test_nothing_outside_the_folder_is_reached(client: TestClient, models: Path) -> None:
    store = client.app.state.store
    assert all(f.path.is_relative_to(models.resolve()) for f in store.models())
    assert client.get("/gguf/" + "0" * 64).status_code == 404
    assert client.get("/gguf/../../etc/passwd").status_code == 404


def test_a_changed_file_gets_a_new_link(client: TestClient, models: Path) -> None:
    before = _links(client)["sub/minilm.gguf"]
    f = models / "sub" / "minilm.gguf"
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    after = _links(client)["sub/minilm.gguf"]
    assert before != after and client.get(before).status_code == 404


def test_run_it_on_model_files(client: TestClient, models: Path, gemma_path: Path) -> None:
    """A file whose architecture a walkthrough runs gets "Run it"; others say which do."""
    shutil.copyfile(gemma_path, models / "gemma.gguf")  # a link out would never be listed
    try:
        links = _links(client)
        page = client.get(links["gemma.gguf"]).text
        digest = links["gemma.gguf"].rsplit("/", 1)[1]
        assert f'href="/walkthroughs/gemma3?file={digest}"' in page and ">Run it<" in page
        run = client.get(f"/walkthroughs/gemma3?file={digest}&prompt=Hello")
        assert run.status_code == 200 and "Next token after the prompt" in run.text
        assert f"file={digest}" in str(run.url)
        minilm = client.get(links["sub/minilm.gguf"]).text
        assert 'href="/walkthroughs/minilm?file=' in minilm
        big = html.unescape(client.get(links["big-40g.gguf"]).text)
        # (no size limit: a file the engine cannot build says why, from its memory plan)
        assert ">Run it<" not in big and "The engine cannot build this model" in big
        assert "Its memory plan:" in html.unescape(page)
        wrong = client.get(f"/walkthroughs/minilm/steps/0?file={digest}")
        assert wrong.status_code == 422 and "holds a 'gemma3' model" in html.unescape(wrong.text)
    finally:
        (models / "gemma.gguf").unlink()


LLAMA3_CHAT = ("{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + "
               "'<|end_header_id|>\\n\\n' + m['content'] | trim + '<|eot_id|>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>"
               "\\n\\n' }}{% endif %}")


@pytest.fixture(scope="module")
def llama3(client: TestClient, models: Path, tmp_path_factory: pytest.TempPathFactory):
    """A Llama 3 file in the folder (llama.cpp's llama-bpe vocabulary: byte-level BPE, 128,256
    tokens; random Q8_0 weights; a Llama 3 chat template): its path and its hash."""
    from engine.core.types import GGMLType
    from engine.gguf.api import gguf_free, gguf_init_from_file, gguf_set_val_str, gguf_write_to_file
    from tests.conformance.test_models import write_tiny_llama
    from tests.support.vocab import vocab_files

    vocab = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-bpe.gguf")
    plain = tmp_path_factory.mktemp("llama3") / "plain.gguf"
    write_tiny_llama(plain, GGMLType.Q8_0, vocab=vocab)
    g = gguf_init_from_file(plain)
    gguf_set_val_str(g, "tokenizer.chat_template", LLAMA3_CHAT)
    gguf_write_to_file(g, models / "llama3.gguf")
    gguf_free(g)
    yield models / "llama3.gguf", _links(client)["llama3.gguf"].rsplit("/", 1)[1]
    (models / "llama3.gguf").unlink()


def kept(client: TestClient, digest: str, prompt: str, then: tuple[int, ...] = ()):
    """The model walkthrough's trace the app recorded for these inputs."""
    traces = client.app.state.traces
    return traces.kept(traces.key("model", None, digest, prompt, then))


def test_a_llama_3_file_steps_through_its_builder(client: TestClient, llama3) -> None:
    """"Run it" opens the model walkthrough, whose steps are the builder's own calls, shown in
    engine/models/llama.py at their line, and whose next-token odds are the builder's logits
    (its generate's), with the walkthrough's settings: llama.cpp's defaults in 256 cells."""
    from engine.models import load_model
    from engine.models.params import ContextParams
    from engine.programs.gemma3 import softmax

    path, digest = llama3
    assert f'href="/walkthroughs/model?file={digest}"' in client.get(f"/gguf/{digest}").text
    prompt = "Hello world"
    first = client.get(f"/walkthroughs/model?file={digest}&prompt={prompt}")
    assert first.status_code == 200 and "Next token after the prompt" in first.text
    trace = kept(client, digest, prompt)
    model = load_model(path, params=ContextParams(n_ctx=256, n_threads=1))
    logits = model.decode(model.encode(prompt), all_logits=False).logits[-1]
    best = int(np.argmax(logits))
    assert tuple(trace.outputs["top10_0"][0]) == (best, model.tokenizer.piece_text(best),
                                                  softmax(logits)[best])
    files = [name for name, _ in trace.also]
    k = files.index("engine/models/llama.py") + 1
    step = next(s for s in trace.steps if s.file == k and "ggml_rms_norm" in s.call)
    page = client.get(f"/walkthroughs/model/steps/{step.index}?file={digest}&prompt={prompt}")
    assert page.status_code == 200
    text = html.unescape(page.text)
    assert "in engine/models/llama.py" in text.replace("<code>", "").replace("</code>", "")
    line = trace.also[k - 1][1].splitlines()[step.line - 1]
    assert f'aria-current="true"><span class="ln">{step.line}</span>{line}' in text


def test_the_chat_tab_runs_a_conversation(client: TestClient, llama3) -> None:
    """The Chat tab's message becomes the prompt the file's template renders, read into the
    tokens llama.cpp's own chat formatting gives; the tokens appended after it are the reply so
    far."""
    from engine.models import load_model
    from tests.support.llamacpp_run import ask

    path, digest = llama3
    page = client.get(f"/walkthroughs/model/steps/0?file={digest}&prompt=Hello world").text
    assert 'id="chat"' in page and "tokenizer.chat_template" in page
    r = client.get(f"/walkthroughs/model/chat?file={digest}&message=Hi there&system=Be brief",
                   follow_redirects=False)
    assert r.status_code == 303
    first = client.get(r.headers["location"])
    assert first.status_code == 200
    prompt = first.url.params["prompt"]
    msgs = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": "Hi there"}]
    theirs = ask(path, {"chat": msgs, "template": LLAMA3_CHAT}, 2)
    tok = load_model(path).tokenizer
    # (the template writes BOS itself; llama.cpp's own formatting leaves it to the tokenizer)
    assert prompt == tok.tokens[tok.bos_id] + theirs["text"]
    trace = kept(client, digest, prompt)
    assert trace.outputs["prompt_tokens"] == [tok.piece_text(i) for i in theirs["tokens"]]
    best = trace.outputs["top10_0"][0]
    again = client.get(f"{first.url}&then={best[0]}").text
    assert "The reply so far:" in again and html.escape(best[1]) in again
    assert client.get(f"/walkthroughs/model/chat?file={digest}&message=" + "x" * 301).status_code == 422
