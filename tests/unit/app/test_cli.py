"""The command line: `ggml-lens` and `python -m app.cli` alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.cli import main
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=300)


def test_trace_json():
    out = cli("trace", "simple-ctx", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["outputs"]["result"] == [[60, 55, 50, 110], [90, 54, 54, 126], [42, 29, 28, 64]]
    assert len(doc["hash"]) == 16
    first = doc["steps"][1]
    assert {"index", "kind", "call", "changes"} <= set(first)
    assert first["changes"]["objects"][0]["size"] == 368


def test_trace_text_and_threads():
    out = cli("trace", "threads", "--threads", "3")
    assert out.returncode == 0, out.stderr
    assert "3 thread(s)" in out.stdout and "thread 2: chunks" in out.stdout


def test_trace_unknown_program():
    out = cli("trace", "no-such-thing")
    assert out.returncode == 2 and "no walkthrough named 'no-such-thing'" in out.stderr


def test_inspect_fixture():
    out = cli("inspect", str(FIXTURES / "minilm-q8_0.gguf"), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["header"]["n_tensors"] == len(doc["tensors"]) == 101
    text = cli("inspect", str(FIXTURES / "ggml-vocab-llama-spm.gguf"), "--kv").stdout
    assert "tokenizer.ggml.tokens" in text


def test_inspect_bad_file(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 8)
    out = cli("inspect", str(bad))
    assert out.returncode == 1 and "n_tensors" in out.stderr and "Traceback" not in out.stderr


def test_serve_help():
    out = cli("serve", "--help")
    assert out.returncode == 0 and "--port" in out.stdout


def test_inspect_web_serves_the_files_folder_and_names_its_page(monkeypatch, capsys, tmp_path):
    import shutil

    import uvicorn

    from app.main import create_app
    from app.settings import Settings
    from engine.programs import FIXTURES_DIR

    model = tmp_path / "m.gguf"
    shutil.copy(FIXTURES_DIR / "minilm-q8_0.gguf", model)
    served = {}
    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: served.update(kw))
    monkeypatch.setenv("GGML_LENS_MODELS", "")  # restored after the test
    monkeypatch.setenv("GGML_LENS_DATA", str(tmp_path / "data"))
    assert main(["inspect", str(model), "--web", "--port", "8123"]) == 0
    url = capsys.readouterr().out.strip().split(" at ")[1]
    assert url.startswith("http://127.0.0.1:8123/gguf/") and served["port"] == 8123
    import os

    assert os.environ["GGML_LENS_MODELS"] == str(tmp_path)
    from fastapi.testclient import TestClient

    client = TestClient(create_app(Settings.from_env()))
    page = client.get(url.split("8123")[1])
    assert page.status_code == 200 and "blk.0.attn_q.weight" in page.text


def test_serve_models_must_be_a_folder(capsys, tmp_path):
    assert main(["serve", "--models", str(tmp_path / "nope")]) == 2
    assert "not a folder" in capsys.readouterr().err


@pytest.mark.parametrize("argv, on", [
    (["serve"], True),  # localhost: the playground is on
    (["serve", "--host", "localhost"], True),
    (["serve", "--host", "0.0.0.0"], False),  # any other address needs --allow-programs
    (["serve", "--host", "0.0.0.0", "--allow-programs"], True),
])
def test_serve_turns_the_playground_on_only_on_localhost_or_when_allowed(monkeypatch, tmp_path, argv, on):
    import uvicorn
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.settings import Settings

    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setenv("GGML_LENS_PROGRAMS", "1" if not on else "0")  # whatever was set before
    monkeypatch.setenv("GGML_LENS_DATA", str(tmp_path))
    assert main(argv) == 0
    client = TestClient(create_app(Settings.from_env()))
    assert client.get("/playground").status_code == (200 if on else 403)


def test_unconfined_programs_are_refused_off_localhost(monkeypatch, capsys):
    import uvicorn

    monkeypatch.setattr(uvicorn, "run", lambda *a, **kw: None)
    monkeypatch.setenv("GGML_LENS_PROGRAMS", "0")
    assert main(["serve", "--host", "0.0.0.0", "--allow-programs", "--allow-unconfined-programs"]) == 2
    assert "refused on any address but localhost" in capsys.readouterr().err
    assert main(["serve", "--allow-unconfined-programs"]) == 0
    assert os.environ["GGML_LENS_PROGRAMS"] == "unconfined"


def test_tokenize_prints_as_llama_tokenize(capsysbinary):
    """`<id> -> '<piece>'` per token, [CLS] ... [SEP] as the BERT vocabulary adds them."""
    assert main(["tokenize", str(FIXTURES / "minilm-q8_0.gguf"), "Hello, world"]) == 0
    lines = capsysbinary.readouterr().out.decode().splitlines()
    assert lines[0] == "   101 -> '[CLS]'" and lines[-1] == "   102 -> '[SEP]'"
    assert [line.split(" -> ")[1] for line in lines[1:-1]] == ["' hello'", "' ,'", "' world'"]


def test_tokenize_json_no_bos_and_special(capsys):
    path = str(FIXTURES / "minilm-q8_0.gguf")
    assert main(["tokenize", path, "[SEP] hi", "--json", "--no-bos", "--special"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["ids"][0] == 102 and doc["pieces"][0] == "[SEP]" and len(doc["ids"]) == 2
    assert main(["tokenize", path, "[SEP] hi", "--json", "--no-bos"]) == 0
    assert json.loads(capsys.readouterr().out)["ids"][0] != 102  # without --special: text


def test_tokenize_unbuilt_tokenizer_and_missing_file(capsys, tmp_path):
    from gguf import GGUFWriter

    w = GGUFWriter(tmp_path / "t5.gguf", "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list(["<pad>", "</s>"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.close()
    assert main(["tokenize", str(tmp_path / "t5.gguf"), "hi"]) == 1
    assert "tokenizer 't5' (tokenizer.ggml.model) is not built here" in capsys.readouterr().err
    assert main(["tokenize", str(tmp_path / "missing.gguf"), "hi"]) == 1
    assert "cannot read" in capsys.readouterr().err
