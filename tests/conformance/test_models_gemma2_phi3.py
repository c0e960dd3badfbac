"""Gemma 2 and Phi-3 end to end: the engine's builders against llama.cpp itself.

Oracle: llama.cpp (llama-cpp-python 0.3.36) running the same GGUF files in a process of its own,
on its plain kernels. The files are tiny (2 layers, 4 query heads over 2 K/V heads, 320 tokens)
with random weights, written here by tests/support/tiny_models.py in every weight type the engine
computes exactly. Gemma 2's file has a head size of its own (key_length), a sliding window of 4
positions (layer 0 slides, layer 1 is global: the window's mask bites within an 8-token prompt)
and both soft-cappings set; Phi-3's has the fused attn_qkv and ffn_up, rope factors (the long
ones in use: the context exceeds original_context_length) and a rope attn_factor.

The files' context is 256 cells, as llama.cpp pads the 128 it is asked for, so that both
attend over the same cells and the attention's nodes compare in the dumps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from engine.core.types import GGMLType
from engine.models import load_model
from engine.trace.evaldump import diff_dumps, dumping, parse_dump
from tests.support.llamacpp_run import ask_many
from tests.support.tiny_models import N_CTX, PLAIN, TinyFile, exact_types, nmse

E, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_VOCAB = 256, 4, 2, 512, 2, 320
CONTEXT = 256  # the files' context_length: llama.cpp's n_ctx N_CTX, padded
N_THREADS = 2
PROMPT = [1, 17, 42, 7, 300, 99, 5, 123]
TYPES = exact_types()

GEMMA2_HEAD = 32  # attention.key_length: not n_embd / n_head, as in Gemma 2 itself
GEMMA2_SWA = 4  # attention.sliding_window


def write_gemma2(path: Path, type_: GGMLType, seed: int) -> None:
    """A tiny `gemma2` file as its converter lays one out (no output.weight: the head is the
    token embeddings)."""
    hd = GEMMA2_HEAD
    q, kv = hd * N_HEAD, hd * N_HEAD_KV
    with TinyFile(path, "gemma2", type_, seed) as f:
        f.decoder_keys(CONTEXT, E, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB, rms_eps=1e-6)
        f.w.add_key_length(hd)
        f.w.add_value_length(hd)
        f.w.add_sliding_window(GEMMA2_SWA)
        f.w.add_attn_logit_softcapping(20.0)
        f.w.add_final_logit_softcapping(10.0)
        f.mat("token_embd.weight", E, N_VOCAB)
        for i in range(N_LAYER):
            f.vec(f"blk.{i}.attn_norm.weight", E)
            f.mat(f"blk.{i}.attn_q.weight", E, q)
            f.mat(f"blk.{i}.attn_k.weight", E, kv)
            f.mat(f"blk.{i}.attn_v.weight", E, kv)
            f.mat(f"blk.{i}.attn_output.weight", q, E)
            f.vec(f"blk.{i}.post_attention_norm.weight", E)
            f.vec(f"blk.{i}.ffn_norm.weight", E)
            f.mat(f"blk.{i}.ffn_gate.weight", E, N_FF)
            f.mat(f"blk.{i}.ffn_up.weight", E, N_FF)
            f.mat(f"blk.{i}.ffn_down.weight", N_FF, E)
            f.vec(f"blk.{i}.post_ffw_norm.weight", E)
        f.vec("output_norm.weight", E)


def write_phi3(path: Path, type_: GGMLType, seed: int, qkv: str = "fused") -> None:
    """A tiny `phi3` file: fused attn_qkv (as Phi-3's converter writes it; `qkv` "separate":
    attn_q/k/v with biases, "fused+biases": attn_qkv with separate Q/K/V biases), ffn_up
    holding gate and up, rope factors."""
    hd = E // N_HEAD
    kv = hd * N_HEAD_KV
    with TinyFile(path, "phi3", type_, seed) as f:
        f.decoder_keys(CONTEXT, E, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, N_VOCAB)
        f.w.add_rope_dimension_count(hd)
        f.w.add_rope_scaling_orig_ctx_len(N_CTX)  # < the context: the long factors apply
        f.w.add_rope_scaling_attn_factors(1.2)
        f.mat("token_embd.weight", E, N_VOCAB)
        f.vec("rope_factors_long.weight", hd // 2, 0.3, 2.0)
        f.vec("rope_factors_short.weight", hd // 2, 0.05, 1.0)
        for i in range(N_LAYER):
            f.vec(f"blk.{i}.attn_norm.weight", E)
            if qkv == "separate":
                f.mat(f"blk.{i}.attn_q.weight", E, E)
                f.mat(f"blk.{i}.attn_k.weight", E, kv)
                f.mat(f"blk.{i}.attn_v.weight", E, kv)
            else:
                f.mat(f"blk.{i}.attn_qkv.weight", E, E + 2 * kv)
            if qkv != "fused":
                for name, size in (("q", E), ("k", kv), ("v", kv)):
                    f.vec(f"blk.{i}.attn_{name}.bias", size, 0.5, 0.0)
            f.mat(f"blk.{i}.attn_output.weight", E, E)
            f.vec(f"blk.{i}.ffn_norm.weight", E)
            f.mat(f"blk.{i}.ffn_up.weight", E, 2 * N_FF)
            f.mat(f"blk.{i}.ffn_down.weight", N_FF, E)
        f.vec("output_norm.weight", E)
        f.mat("output.weight", E, N_VOCAB)


WRITERS = {"gemma2": write_gemma2, "phi3": write_phi3}

# per architecture, nodes by llama.cpp's names that only its graph has (layer 0 and 1 each)
CHARACTERISTIC = {
    "gemma2": ["inp_scaled", "ffn_post_norm", "kq_scaled_1-{il}", "kq_tanh-{il}",
               "kq_scaled_2-{il}", "kq_soft_max-{il}", "attn_post_norm-{il}", "sa_out-{il}",
               "ffn_geglu-{il}", "l_out-{il}"],
    "phi3": ["wqkv-{il}", "Qcur-{il}", "Kcur-{il}", "kq_soft_max-{il}", "ffn_up-{il}",
             "ffn_swiglu-{il}", "ffn_out-{il}", "l_out-{il}"],
}


STEPPED = (GGMLType.F32, GGMLType.Q4_K)  # the files decoded token by token too
FIRST = 3  # the stepped decodes: FIRST tokens in one batch, then one at a time
GREEDY_TYPE, DUMP_TYPE = GGMLType.Q8_0, GGMLType.F32  # the files greedy and dump tests run


@dataclass(frozen=True, slots=True)
class Files:
    arch: str
    paths: dict[GGMLType, Path]
    logits: dict[GGMLType, np.ndarray]  # llama.cpp's, the prompt in one batch
    stepped: dict[GGMLType, np.ndarray]  # llama.cpp's, FIRST tokens then one at a time
    greedy: list[int]  # llama.cpp's 5 most likely tokens after PROMPT[:4] (GREEDY_TYPE)
    dump: str  # llama.cpp's eval-callback dump of PROMPT (DUMP_TYPE)


VIEW_OPS = ("VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE")


@pytest.fixture(scope="module", params=tuple(WRITERS))
def every_type(request, tmp_path_factory) -> Files:
    """One file per exact weight type and llama.cpp's plain-path logits of PROMPT for each (and
    of its stepped decode for STEPPED), its greedy tokens and its dump, all from one llama.cpp
    process (the dump last: its callback stays for what follows)."""
    arch = request.param
    tmp = tmp_path_factory.mktemp(f"types-{arch}")
    paths = {t: tmp / f"{arch}-{t.name}.gguf" for t in TYPES}
    for t, path in paths.items():
        WRITERS[arch](path, t, seed=int(t))
    jobs = [(paths[t], {"logits": PROMPT, "out": str(tmp / f"{t.name}.npy")}) for t in TYPES]
    jobs += [(paths[t], {"logits": PROMPT, "batch": FIRST, "out": str(tmp / f"{t.name}-1.npy")})
             for t in STEPPED]
    jobs += [(paths[GREEDY_TYPE], {"greedy": PROMPT[:4], "n": 5}),
             (paths[DUMP_TYPE], {"dump": PROMPT})]
    *_, greedy, dump = ask_many(jobs, N_THREADS, n_ctx=N_CTX, **PLAIN)
    return Files(arch, paths, {t: np.load(tmp / f"{t.name}.npy") for t in TYPES},
                 {t: np.load(tmp / f"{t.name}-1.npy") for t in STEPPED}, greedy["tokens"],
                 dump["dump"])


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_each_weight_type_matches_llama_cpp(llama_cpp, every_type, type_):
    """Every position of the prompt, decoded at once: llama.cpp's floats, bit for bit."""
    model = load_model(every_type.paths[type_])
    assert model.file.arch == every_type.arch
    ours, theirs = model.decode(PROMPT, n_threads=N_THREADS).logits, every_type.logits[type_]
    assert ours.shape == theirs.shape == (len(PROMPT), N_VOCAB)
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("type_", STEPPED, ids=lambda t: t.name)
def test_kv_cache_decoding_matches_llama_cpp(llama_cpp, every_type, type_):
    """Prompt in one pass, then one token per pass through the cache (Gemma 2's window of 4
    masking the older keys on layer 0): llama.cpp's logits of the same steps, to the last bits.
    (Against the prompt decoded at once the steps differ as llama.cpp's own do: a batch and a
    single token take differently ordered float products, and these random models amplify that
    at some positions, to an nmse of 2e-8.)"""
    model = load_model(every_type.paths[type_])
    first = model.decode(PROMPT[:FIRST], n_threads=N_THREADS).logits
    rows = list(first) + [model.decode([t], n_threads=N_THREADS).logits[0]
                          for t in PROMPT[FIRST:]]
    theirs = every_type.stepped[type_]
    for pos, row in enumerate(rows):
        assert nmse(row, theirs[pos]) <= 1e-9, (pos, nmse(row, theirs[pos]))
    np.testing.assert_array_equal(np.array(rows), theirs)


@pytest.fixture(scope="module")
def phi3_layouts(tmp_path_factory) -> dict[str, tuple[Path, np.ndarray]]:
    """Phi-3 files with Q/K/V laid out otherwise, and llama.cpp's logits of PROMPT for each."""
    tmp = tmp_path_factory.mktemp("phi3-qkv")
    paths = {qkv: tmp / f"phi3-{qkv}.gguf" for qkv in ("separate", "fused+biases")}
    for qkv, path in paths.items():
        write_phi3(path, GGMLType.F32, seed=7, qkv=qkv)
    jobs = [(path, {"logits": PROMPT, "out": str(path.with_suffix(".npy"))})
            for path in paths.values()]
    ask_many(jobs, N_THREADS, n_ctx=N_CTX, **PLAIN)
    return {qkv: (path, np.load(path.with_suffix(".npy"))) for qkv, path in paths.items()}


@pytest.mark.parametrize("qkv", ["separate", "fused+biases"])
def test_phi3_qkv_layouts_match_llama_cpp(llama_cpp, phi3_layouts, qkv):
    """build_qkv's other paths: separate Q/K/V projections with biases, and the fused one with
    the separate biases concatenated (Phi-3 files carry neither; other converters write them)."""
    path, theirs = phi3_layouts[qkv]
    np.testing.assert_array_equal(load_model(path).decode(PROMPT, n_threads=N_THREADS).logits,
                                  theirs)


def test_greedy_generation_matches_llama_cpp(llama_cpp, every_type):
    model = load_model(every_type.paths[GREEDY_TYPE])
    assert model.generate(PROMPT[:4], 5, n_threads=N_THREADS) == every_type.greedy


def test_node_names_and_values_are_llama_cpps(llama_cpp, every_type):
    """llama.cpp's eval-callback dump of the prompt against the engine's: every node of the same
    name and shape within the dump's bounds, the architecture's own nodes among them."""
    arch, path = every_type.arch, every_type.paths[DUMP_TYPE]
    theirs = parse_dump(every_type.dump)
    # llama.cpp's callback also shows the nodes that only view their source, which the engine's
    # dump leaves out (it shows what is computed); one may carry a name before the computed
    # node does (Phi-3's Q, a view of wqkv named Qcur before rope's Qcur)
    theirs = [n for n in theirs if n.op not in VIEW_OPS]
    out: list[str] = []
    with dumping(out.append):
        load_model(path).decode(PROMPT, n_threads=N_THREADS, all_logits=False)
    d = diff_dumps(parse_dump("".join(out)), theirs)
    assert d.first_over is None, d.report()
    compared = {c.name for c in d.compared}
    want = {name.format(il=il) for name in CHARACTERISTIC[arch] for il in range(N_LAYER)}
    assert want <= compared, sorted(want - compared)
    assert {"embd", "result_norm", "result_output"} <= compared
