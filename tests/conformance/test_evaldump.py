"""The eval-callback dump: llama-eval-callback's format, and the engine's MiniLM node for node
against real llama.cpp's."""

from __future__ import annotations

import time

from engine.trace.evaldump import diff_dumps, dumping, parse_dump
from engine.models import load_model
from engine.programs import FIXTURES_DIR
from tests.support.llamacpp_dump import llama_cpp_embed_dump

MINILM = FIXTURES_DIR / "minilm-q8_0.gguf"
TEXT = "Tensors live in a memory pool; views share their parent's bytes."


def our_dump(text: str) -> str:
    out: list[str] = []
    with dumping(out.append):
        load_model(MINILM).embed(text, n_threads=2)
    return "".join(out)


def test_minilm_dump_matches_llama_cpp(llama_cpp):
    ours = parse_dump(our_dump(TEXT))
    theirs = parse_dump(llama_cpp_embed_dump(llama_cpp, MINILM, TEXT, 2))
    d = diff_dumps(ours, theirs)
    assert d.first_over is None, d.report()
    names = {c.name for c in d.compared}
    # every layer's attention and feed-forward nodes are compared, by llama.cpp's own names
    for il in range(6):
        assert {f"kq_soft_max-{il}", f"kqv_out-{il}", f"ffn_inp-{il}", f"ffn_gelu-{il}"} <= names
    assert len(d.compared) >= 40


def test_a_changed_value_is_found():
    text = our_dump(TEXT)
    nodes = parse_dump(text)
    bumped = [n if n.name != "ffn_gelu-2" else
              type(n)(n.name, n.type, n.op, n.ne, (n.values[0] + 0.5,) + n.values[1:], n.sum)
              for n in nodes]
    d = diff_dumps(nodes, bumped)
    assert d.first_over is not None and d.first_over.name == "ffn_gelu-2"
    assert diff_dumps(nodes, nodes).first_over is None


def test_round_trip_of_a_printed_node():
    """inp_embd of 'Hello' ([CLS] hello [SEP]): 3 rows of 384, 3 + 3 values shown per row."""
    node = next(n for n in parse_dump(our_dump("Hello")) if n.name == "inp_embd")
    assert node.op == "ADD" and node.type == "f32" and node.ne == (384, 3, 1, 1)
    assert len(node.values) == 3 * 6 and node.sum is not None


def test_cli_trace_eval_callback_and_diff(tmp_path, capsys):
    from app.cli import main

    assert main(["trace", "attention-block", "--eval-callback"]) == 0
    dump = capsys.readouterr().out
    assert dump.startswith("common_debug_cb_eval:")
    (tmp_path / "a.txt").write_text(dump)
    (tmp_path / "b.txt").write_text(dump.replace("kq_soft_max", "renamed"))
    assert main(["diff", str(tmp_path / "a.txt"), str(tmp_path / "a.txt")]) == 0
    assert "no node differs beyond the bounds" in capsys.readouterr().out
    assert main(["diff", str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]) == 0
    assert "only in A" in capsys.readouterr().out


def test_the_minilm_walkthrough_download_matches_llama_cpp(llama_cpp, tmp_path):
    """The dump a learner downloads from the minilm walkthrough's page, diffed (`ggml-lens diff`)
    against real llama.cpp's dump of the same text."""
    from fastapi.testclient import TestClient

    from app.cli import main
    from app.main import create_app
    from app.settings import Settings
    from engine.programs.minilm import TEXT as WALKTHROUGH_TEXT

    client = TestClient(create_app(Settings(data_dir=tmp_path / "data", fixtures_dir=FIXTURES_DIR)))
    url, deadline = "/walkthroughs/minilm/eval-callback.txt", time.monotonic() + 600
    while (r := client.get(url)).status_code == 202:  # a job: its page asks again until it is made
        assert time.monotonic() < deadline, "the dump was never made"
        time.sleep(0.2)
    assert r.status_code == 200
    assert 'filename="minilm-eval-callback.txt"' in r.headers["content-disposition"]
    (tmp_path / "ours.txt").write_text(r.text)
    (tmp_path / "llama.txt").write_text(llama_cpp_embed_dump(llama_cpp, MINILM, WALKTHROUGH_TEXT, 2))
    assert main(["diff", str(tmp_path / "ours.txt"), str(tmp_path / "llama.txt")]) == 0
    d = diff_dumps(parse_dump(r.text), parse_dump((tmp_path / "llama.txt").read_text()))
    assert d.first_over is None and len(d.compared) >= 40
    assert client.get("/walkthroughs/minilm/eval-callback.txt?threads=99").status_code == 422
