"""The command line: `ggml-lens` and `python -m app.cli` alike."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
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
