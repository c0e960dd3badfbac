"""A model file larger than 1 GiB stepped through the app as a learner steps it: listed in the
models folder, its page saying what recording it takes (its memory plan), the `model`
walkthrough recorded on llama.cpp's default path (weights mapped, repacked where llama.cpp
repacks them), and step pages served from the trace.

The file is a Llama of 32 layers at Llama 3.2 1B's width (1.1 GB of Q4_K weights) whose tensor
data is a hole in a sparse file: it costs no disk and no time to write, and its weights are zeros
(Q4_K blocks of scale 0), which the model computes like any others.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

from app.main import create_app
from app.settings import Settings
from engine.core.types import TYPE_TRAITS, GGMLType
from engine.trace.pools import file_pages
from tests.support.vocab import vocab_files

E, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 2048, 8192, 32, 32, 8
GIB = 1 << 30


def _q4_k(n_in: int, n_out: int) -> tuple[int, int]:
    """(bytes of a Q4_K weight of n_out rows of n_in, its raw shape in bytes per row)."""
    tr = TYPE_TRAITS[GGMLType.Q4_K]
    row = n_in // tr.blck_size * tr.type_size
    return row * n_out, row


def write_sparse_llama(path: Path) -> int:
    """The file, its weights a hole; returns its size."""
    spm = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf")
    fields = GGUFReader(str(spm)).fields
    n_vocab = len(fields["tokenizer.ggml.tokens"].data)
    w = GGUFWriter(str(path), "llama")
    for key, field in fields.items():
        if key.startswith("tokenizer."):
            w.add_key_value(key, field.contents(), field.types[0], field.types[1] if len(field.types) > 1 else None)
    w.add_context_length(4096)
    w.add_embedding_length(E)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(E // N_HEAD)
    kv = E // N_HEAD * N_HEAD_KV
    data = 0  # the data section's size, each tensor padded to the alignment

    def mat(name: str, n_in: int, n_out: int) -> None:
        nonlocal data
        nbytes, row = _q4_k(n_in, n_out)
        w.add_tensor_info(name, (n_out, row), np.dtype(np.uint8), nbytes, raw_dtype=GGMLQuantizationType.Q4_K)
        data += -(-nbytes // 32) * 32

    def vec(name: str, n: int) -> None:
        nonlocal data
        w.add_tensor_info(name, (n,), np.dtype(np.float32), 4 * n, raw_dtype=GGMLQuantizationType.F32)
        data += -(-4 * n // 32) * 32

    mat("token_embd.weight", E, n_vocab)
    for i in range(N_LAYER):
        vec(f"blk.{i}.attn_norm.weight", E)
        for name, n_in, n_out in (("attn_q", E, E), ("attn_k", E, kv), ("attn_v", E, kv), ("attn_output", E, E),
                                  ("ffn_gate", E, N_FF), ("ffn_up", E, N_FF), ("ffn_down", N_FF, E)):
            mat(f"blk.{i}.{name}.weight", n_in, n_out)
        vec(f"blk.{i}.ffn_norm.weight", E)
    vec("output_norm.weight", E)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    header = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(header + (-header % 32) + data)
    return path.stat().st_size


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    path = root / "llama-1g.gguf"
    write_sparse_llama(path)
    return path


def test_a_file_over_1_gib_is_stepped_through(big: Path, tmp_path: Path) -> None:
    """Listed, planned on its page, recorded, stepped: the mapped weights are the file's pages in
    the trace (not a copy), and the step pages of a weight's product and of the last node are
    served. (Zero weights repack to zeros, which the recorder finds unchanged: the trace holds
    only what the passes wrote. Repacked weights that are not zeros are held once, in their
    buffer's mirror: tests/unit/engine/test_trace.py.)"""
    assert big.stat().st_size > GIB
    client = TestClient(create_app(Settings(data_dir=tmp_path / "data", models_dir=big.parent)))
    digest = next(f.digest for f in client.app.state.store.models() if f.name == big.name)
    page = client.get(f"/gguf/{digest}").text
    assert f'href="/walkthroughs/model?file={digest}"' in page and "Its memory plan:" in page
    prompt = "Hello"
    traces = client.app.state.traces
    first = client.get(f"/walkthroughs/model?file={digest}&prompt={prompt}")
    assert first.status_code == 200
    deadline = time.monotonic() + 600
    while (trace := traces.kept(traces.key("model", None, digest, prompt, ()))) is None:
        assert time.monotonic() < deadline, "the recording did not end in 10 minutes"
        time.sleep(0.2)
    assert trace.error is None, trace.error
    viewed = [(p, file_pages(p.data)) for s in trace.steps for p in s.patches]
    (weights,) = [p for p, src in viewed if src is not None and not src[0].held]
    assert len(weights.data) > 100 << 20  # (the token table and the norms, in CPU_Mapped)
    assert trace.recorded_bytes < 64 << 20  # (the file's GB are not held: the cache, the passes)
    product = next(s for s in trace.steps if s.kind.value == "node" and s.call.startswith("MUL_MAT "))
    for k in (product.index, len(trace.steps) - 1):
        step = client.get(f"/walkthroughs/model/steps/{k}?file={digest}&prompt={prompt}")
        assert step.status_code == 200, step.text[-500:]
