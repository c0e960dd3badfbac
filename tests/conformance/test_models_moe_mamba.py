"""A mixture of experts (qwen3moe) and a recurrent model (mamba) end to end, against llama.cpp.

Oracle: llama.cpp (llama-cpp-python 0.3.36) in a process of its own, on its plain kernels, running
tiny files written here with gguf-py's GGUFWriter (random weights, 2 layers, n_embd 256, each
weight matrix in the file's type, quantized by real ggml). Per architecture: every position's
logits of a prompt for every weight type the engine computes exactly (bit for bit); the prompt
then token by token through the cache (the KV cache, the recurrent states); greedy generation;
and the eval-callback dump of the prompt, node by node under llama.cpp's names.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.core.types import GGMLType
from engine.models import load_model
from engine.trace.evaldump import diff_dumps, dumping, parse_dump
from tests.support.llamacpp_run import ask_many
from tests.support.tiny_models import (N_CTX, PLAIN, TinyFile, exact_types, nmse,
                                      plain_logits_many)

E, N_LAYER, N_VOCAB = 256, 2, 320
N_HEAD, N_HEAD_KV, HEAD = 4, 2, 64  # qwen3moe's attention
N_EXPERT, N_EXPERT_USED, N_FF_EXP = 4, 2, 256
D_CONV, D_INNER, D_STATE, DT_RANK = 4, 2 * E, 16, 16  # mamba's (an expansion factor of 2)
N_THREADS = 2
PROMPT = [1, 17, 42, 7, 300, 99, 5, 123]
TYPES = exact_types()
CACHE_TYPE = GGMLType.Q4_K  # the file the cache, generation and dump tests run


def write_tiny_qwen3moe(path: Path, type_: GGMLType, seed: int = 0) -> None:
    """llama.cpp's `qwen3moe` as its converter lays it out: Qwen3 attention (QK norms, a head
    size of its own), a router and N_EXPERT SwiGLU experts per layer, 3-D expert tensors."""
    with TinyFile(path, "qwen3moe", type_, seed) as f:
        f.decoder_keys(N_CTX, E, N_LAYER, N_FF_EXP * N_EXPERT_USED, N_HEAD, N_HEAD_KV, N_VOCAB,
                       rms_eps=1e-6, freq_base=1000000.0)
        w = f.w
        w.add_expert_feed_forward_length(N_FF_EXP)
        w.add_expert_count(N_EXPERT)
        w.add_expert_used_count(N_EXPERT_USED)
        w.add_key_length(HEAD)
        w.add_value_length(HEAD)
        w.add_rope_dimension_count(HEAD)
        q, kv = HEAD * N_HEAD, HEAD * N_HEAD_KV
        f.mat("token_embd.weight", E, N_VOCAB)
        for i in range(N_LAYER):
            b = f"blk.{i}."
            f.vec(b + "attn_norm.weight", E)
            f.mat(b + "attn_q.weight", E, q)
            f.mat(b + "attn_k.weight", E, kv)
            f.mat(b + "attn_v.weight", E, kv)
            f.vec(b + "attn_q_norm.weight", HEAD)
            f.vec(b + "attn_k_norm.weight", HEAD)
            f.mat(b + "attn_output.weight", q, E)
            f.vec(b + "ffn_norm.weight", E)
            f.w.add_tensor(b + "ffn_gate_inp.weight",  # the router stays F32, as converted
                           (4 * f.rng.standard_normal((N_EXPERT, E)) / np.sqrt(E))
                           .astype(np.float32))
            f.mat(b + "ffn_gate_exps.weight", E, N_FF_EXP, N_EXPERT)
            f.mat(b + "ffn_up_exps.weight", E, N_FF_EXP, N_EXPERT)
            f.mat(b + "ffn_down_exps.weight", N_FF_EXP, E, N_EXPERT)
        f.vec("output_norm.weight", E)
        f.mat("output.weight", E, N_VOCAB)


def write_tiny_mamba(path: Path, type_: GGMLType, seed: int = 0) -> None:
    """llama.cpp's `mamba` as its converter lays it out (no attention: head counts and
    feed_forward_length 0), its projections in `type_`, the convolution, decays, skips and
    biases F32; the decays A = -(1..d_state) and dt's bias for steps in [0.001, 0.1], as Mamba
    initialises them."""
    with TinyFile(path, "mamba", type_, seed) as f:
        w, rng = f.w, f.rng
        w.add_context_length(N_CTX)
        w.add_embedding_length(E)
        w.add_block_count(N_LAYER)
        w.add_feed_forward_length(0)
        w.add_head_count(0)
        w.add_ssm_conv_kernel(D_CONV)
        w.add_ssm_inner_size(D_INNER)
        w.add_ssm_state_size(D_STATE)
        w.add_ssm_time_step_rank(DT_RANK)
        w.add_layer_norm_rms_eps(1e-5)
        w.add_vocab_size(N_VOCAB)
        f32 = lambda a: np.asarray(a, np.float32)  # noqa: E731
        f.mat("token_embd.weight", E, N_VOCAB)
        for i in range(N_LAYER):
            b = f"blk.{i}."
            f.vec(b + "attn_norm.weight", E)
            f.mat(b + "ssm_in.weight", E, 2 * D_INNER)
            w.add_tensor(b + "ssm_conv1d.weight",
                         f32(rng.standard_normal((D_INNER, D_CONV)) / np.sqrt(D_CONV)))
            f.vec(b + "ssm_conv1d.bias", D_INNER, 0.1, 0.0)
            f.mat(b + "ssm_x.weight", D_INNER, DT_RANK + 2 * D_STATE)
            f.mat(b + "ssm_dt.weight", DT_RANK, D_INNER)
            step = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), D_INNER))
            w.add_tensor(b + "ssm_dt.bias", f32(step + np.log(-np.expm1(-step))))  # softplus⁻¹
            w.add_tensor(b + "ssm_a", f32(-np.tile(np.arange(1, D_STATE + 1), (D_INNER, 1))))
            f.vec(b + "ssm_d", D_INNER)
            f.mat(b + "ssm_out.weight", D_INNER, E)
        f.vec("output_norm.weight", E)
        f.mat("output.weight", E, N_VOCAB)


WRITERS = {"qwen3moe": write_tiny_qwen3moe, "mamba": write_tiny_mamba}


# --- every weight type, bit for bit ------------------------------------------------------------

@pytest.fixture(scope="module", params=tuple(WRITERS))
def every_type(request, tmp_path_factory):
    """{type: (file, llama.cpp's plain-path logits of PROMPT)} for one architecture: one file
    per type, one llama.cpp process for them all."""
    arch, tmp = request.param, tmp_path_factory.mktemp(f"types-{request.param}")
    paths = [tmp / f"{arch}-{t.name}.gguf" for t in TYPES]
    for t, path in zip(TYPES, paths):
        WRITERS[arch](path, t, seed=int(t))
    return arch, dict(zip(TYPES, zip(paths, plain_logits_many(paths, PROMPT, tmp))))


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_tiny_model_in_each_weight_type_matches_llama_cpp(llama_cpp, every_type, type_):
    """Every position of the prompt decoded at once: llama.cpp's logits, bit for bit."""
    arch, files = every_type
    path, theirs = files[type_]
    model = load_model(path)
    assert model.file.arch == arch
    ours = model.decode(PROMPT, n_threads=N_THREADS).logits
    assert ours.shape == theirs.shape == (len(PROMPT), N_VOCAB)
    np.testing.assert_array_equal(ours, theirs)


def test_tiny_model_cache_decoding_matches_llama_cpp(llama_cpp, every_type):
    """Three tokens in one pass, then one per pass through the cache (the KV cache; the
    recurrent states): the same logits to the last bits (a batch and a single token take
    differently ordered float products)."""
    arch, files = every_type
    path, theirs = files[CACHE_TYPE]
    model = load_model(path)
    first = model.decode(PROMPT[:3], n_threads=N_THREADS).logits
    rows = list(first) + [model.decode([t], n_threads=N_THREADS).logits[0] for t in PROMPT[3:]]
    for pos, row in enumerate(rows):
        assert nmse(row, theirs[pos]) <= 1e-9, (arch, pos, nmse(row, theirs[pos]))


# --- generation and node names -----------------------------------------------------------------

@pytest.fixture(scope="module")
def greedy_and_dump(every_type):
    """llama.cpp's greedy 5 tokens after PROMPT[:4] and its eval-callback dump of PROMPT, for the
    CACHE_TYPE file, in one llama.cpp process."""
    arch, files = every_type
    path = files[CACHE_TYPE][0]
    greedy, dump = ask_many([(path, {"greedy": PROMPT[:4], "n": 5}), (path, {"dump": PROMPT})],
                            N_THREADS, n_ctx=N_CTX, **PLAIN)
    return arch, path, greedy["tokens"], dump["dump"]


def test_tiny_model_greedy_generation_matches_llama_cpp(llama_cpp, greedy_and_dump):
    arch, path, theirs, _ = greedy_and_dump
    model = load_model(path)
    assert model.generate(PROMPT[:4], 5, n_threads=N_THREADS) == theirs
    assert model.generate(PROMPT[:4], 5, n_threads=N_THREADS) == theirs  # after a reset too


# per architecture, per layer: nodes llama.cpp names that only this architecture computes (a
# name's start; mamba's layers name few nodes: its states' copies back into the cache are ggml's
# names for views and copies, one carrying the number ggml gives the scan's node)
CHARACTERISTIC = {
    "qwen3moe": ("ffn_moe_logits-{il}", "ffn_moe_probs-{il}", "ffn_moe_argsort-{il}",
                 "ffn_moe_weights_norm-{il}", "ffn_moe_up-{il}", "ffn_moe_gate-{il}",
                 "ffn_moe_swiglu-{il}", "ffn_moe_down-{il}", "ffn_moe_weighted-{il}",
                 "ffn_moe_out-{il}", "Qcur_normed-{il}", "Kcur_normed-{il}"),
    "mamba": ("norm-{il}", "attn_norm-{il}", "l_out-{il}",
              "cache_r_l{il} (reshaped) (view) (view)",  # the new sequence's states zeroed
              "cache_r_l{il} (view) (copy of  (view))",  # the new conv state
              "cache_s_l{il} (view) (copy of node_"),  # the new ssm state, from the scan
}


def test_tiny_model_nodes_match_llama_cpps_by_name(llama_cpp, greedy_and_dump):
    """The prompt's nodes under llama.cpp's names, value for value within the dump's bounds."""
    arch, path, _, dump = greedy_and_dump
    out: list[str] = []
    with dumping(out.append):
        load_model(path).decode(PROMPT, n_threads=N_THREADS, all_logits=False)  # as asked
    d = diff_dumps(parse_dump("".join(out)), parse_dump(dump))
    assert d.first_over is None, d.report()
    names = [c.name for c in d.compared]
    for il in range(N_LAYER):
        for start in CHARACTERISTIC[arch]:
            assert any(n.startswith(start.format(il=il)) for n in names), (start, il, d.report())
    assert {"result_norm", "result_output"} <= set(names)
