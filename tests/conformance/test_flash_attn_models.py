"""Flash attention, quantized KV caches and ubatches in the model graphs, against llama.cpp.

Oracle: llama.cpp (llama-cpp-python 0.3.36) in a process of its own (tests/support/llamacpp_run.py)
on its plain kernels (no repacked weights, no tiled K-quant products: other paths, other tests),
given the settings the engine is given (engine/models/params.py): flash attention on, off or
auto; the K and V cache types; n_ctx, n_batch and n_ubatch. Every comparison is bit for bit: the
logits of every position of a prompt (1, 63, 128 and 600 tokens: the one_chunk and tiled flash
attention paths, a 600-token prompt as ubatches of 512 and 88 over 1024 cells), then of 3 tokens
decoded one at a time through the cache (one_chunk, and split-KV once the cache reads 512 cells).

Models: the bundled Gemma 3 270M (sliding-window layers, QK norms, heads of 256: its quantized
cache rotated by 256-wide Hadamard matrices) with -fa on, -fa on -ctk q8_0 -ctv q8_0 and -fa off
-ctk q8_0; the tiny files of every decoder architecture the engine builds (tests/conformance's
writers: llama, qwen2, qwen3, gemma2, phi3, qwen3moe, mamba) with -fa on; a tiny llama in every
cache type llama.cpp takes. llama.cpp's own log says what it decided (auto, the rotations) and
why it refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine import ggml as eng
from engine.compute.plan import llamafile_build
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.models import ModelError, load_model
from engine.models.params import KV_CACHE_TYPES, ContextParams, ParamsError
from tests.conformance.test_models import write_tiny_llama
from tests.conformance.test_models_gemma2_phi3 import write_gemma2, write_phi3
from tests.conformance.test_models_moe_mamba import write_tiny_mamba, write_tiny_qwen3moe
from tests.support.graphs import Leaf, leaf_bytes, run
from tests.support.llamacpp_run import ask, ask_many, flash_attn_many
from tests.support.tiny_models import PLAIN, TinyFile

N_THREADS = 2
LENGTHS = (1, 63, 128, 600)  # prompt lengths: one_chunk (< 64 rows), tiled, two ubatches
# the bundled Gemma's: `make test` runs 1 and 63 (test_default_path.py runs its default path up to
# 600); GGML_LENS_SWEEP=all (make test-sweep) every length
GEMMA_LENGTHS = LENGTHS if os.environ.get("GGML_LENS_SWEEP") == "all" else (1, 63)
N_DECODE = 3  # tokens decoded one at a time after each prompt
N_CTX = 1024  # cells: the 600-token prompt and its decoding read 768 (split-KV from 512)
BATCH = dict(n_ctx=N_CTX, n_batch=512, n_ubatch=512)


def oracle_params(flash_attn, type_k: str = "f16", type_v: str = "f16") -> dict:
    """The same settings as llama_cpp.Llama's arguments (cache types by ggml number)."""
    fa = {"on": True, "off": False}.get(flash_attn, flash_attn)
    return dict(flash_attn=fa, type_k=int(_type(type_k)), type_v=int(_type(type_v)), **BATCH,
                swa_full=False, **PLAIN)  # (llama-cli's swa_full, and ContextParams')


def engine_params(flash_attn: str, type_k: str = "f16", type_v: str = "f16") -> ContextParams:
    """The same settings for the engine, its weights not repacked (-nr) as the oracle's."""
    return ContextParams(flash_attn=flash_attn, type_k=type_k, type_v=type_v, no_repack=True,
                         n_threads=N_THREADS, **BATCH)


def plain_model(path: Path, params: ContextParams):
    """The model with these settings on ggml's plain kernels: no tiled K-quant products
    (GGML_CPU_TILED_MM=0, as the oracle runs), no repacked weights (params.no_repack)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GGML_CPU_TILED_MM", "0")
        return load_model(path, params=params)


def _type(name: str) -> GGMLType:
    return next(t for t in KV_CACHE_TYPES if TYPE_TRAITS[t].type_name == name)


def prompts(n_vocab: int, first: int, seed: int) -> dict[int, list[int]]:
    """Per length, random token ids (the first one `first`, a BOS) and N_DECODE more."""
    rng = np.random.default_rng(seed)
    return {n: [first] + [int(t) for t in rng.integers(min(100, n_vocab // 4), n_vocab,
                                                       n - 1 + N_DECODE)] for n in LENGTHS}


def theirs(paths_and_ids: list[tuple[Path, list[int], int]], tmp: Path, params: dict
           ) -> list[np.ndarray]:
    """llama.cpp's logits of each (file, ids, prompt length): the prompt in one eval (split by
    n_batch and n_ubatch), then each later token alone; one process for them all."""
    outs = [tmp / f"logits-{i}.npy" for i in range(len(paths_and_ids))]
    ask_many([(p, {"logits": ids, "out": str(o), "batch": n})
              for (p, ids, n), o in zip(paths_and_ids, outs)], N_THREADS, **params)
    return [np.load(o) for o in outs]


def ours(model, ids: list[int], n: int) -> np.ndarray:
    """The engine's logits of the same: the prompt in one decode, then one token at a time."""
    model.reset()
    rows = list(model.decode(ids[:n]).logits)
    rows += [model.decode([t]).logits[0] for t in ids[n:]]
    return np.array(rows)


def assert_bits(mine: np.ndarray, llama: np.ndarray, what: str) -> None:
    assert mine.shape == llama.shape, what
    differ = np.flatnonzero((mine.view(np.uint32) != llama.view(np.uint32)).any(axis=1))
    assert not differ.size, f"{what}: rows {differ[:8].tolist()} of {len(mine)} differ"
    np.testing.assert_array_equal(mine, llama)


# --- the bundled Gemma 3 ------------------------------------------------------------------------

GEMMA_SETTINGS = {"fa-on": ("on", "f16", "f16"), "fa-on-q8_0": ("on", "q8_0", "q8_0"),
                  "fa-off-ctk-q8_0": ("off", "q8_0", "f16")}


@pytest.fixture(scope="module", params=tuple(GEMMA_SETTINGS))
def gemma_runs(request, gemma_path, tmp_path_factory):
    """Per setting, {prompt length: (the engine's logits, llama.cpp's)}."""
    setting = GEMMA_SETTINGS[request.param]
    model = plain_model(gemma_path, engine_params(*setting))
    by_len = {n: ids for n, ids in prompts(model.hp.n_vocab, 2, seed=3).items() if n in GEMMA_LENGTHS}
    jobs = [(gemma_path, ids, n) for n, ids in by_len.items()]
    llama = theirs(jobs, tmp_path_factory.mktemp("gemma"), oracle_params(*setting))
    runs = {n: (ours(model, ids, n), ll) for (n, ids), ll in zip(by_len.items(), llama)}
    model.close()
    return request.param, runs


@pytest.mark.parametrize("n", GEMMA_LENGTHS)
def test_gemma_logits_are_llama_cpps(llama_cpp, gemma_runs, n):
    """Gemma 3 270M: every position of the prompt, then 3 tokens through the cache."""
    setting, runs = gemma_runs
    assert_bits(*runs[n], f"gemma {setting}, {n}-token prompt")


def test_a_prompt_of_600_is_two_ubatches():
    """The graphs a 600-token prompt makes: ubatches of 512 and 88 tokens (n_ubatch 512,
    llama_batch_allocr::split_simple's); with n_batch 300, below n_ubatch, batches of 300."""
    assert engine_params("on").resolve("gemma3", 32768, 256, 256).batches(600) == [(0, 512),
                                                                                  (512, 600)]
    small = ContextParams(n_ctx=N_CTX, n_batch=300).resolve("gemma3", 32768, 256, 256)
    assert small.n_ubatch == 300 and small.batches(600) == [(0, 300), (300, 600)]


# --- every decoder architecture, tiny -------------------------------------------------------------

TINY = {"llama": lambda p: write_tiny_llama(p, GGMLType.Q8_0, arch="llama"),
        "qwen2": lambda p: write_tiny_llama(p, GGMLType.Q8_0, arch="qwen2"),
        "qwen3": lambda p: write_tiny_llama(p, GGMLType.Q8_0, arch="qwen3"),
        "gemma2": lambda p: write_gemma2(p, GGMLType.Q8_0, 1),
        "phi3": lambda p: write_phi3(p, GGMLType.Q8_0, 2),
        "qwen3moe": lambda p: write_tiny_qwen3moe(p, GGMLType.Q8_0),
        "mamba": lambda p: write_tiny_mamba(p, GGMLType.Q8_0)}
TINY_VOCAB = 320


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tiny")
    files = {arch: tmp / f"{arch}.gguf" for arch in TINY}
    for arch, path in files.items():
        TINY[arch](path)
    return files


@pytest.fixture(scope="module")
def tiny_runs(tiny_files, tmp_path_factory):
    """{arch: {length: (the engine's logits, llama.cpp's)}} with -fa on, one llama.cpp process."""
    by_len = prompts(TINY_VOCAB, 1, seed=5)
    jobs = [(path, ids, n) for path in tiny_files.values() for n, ids in by_len.items()]
    llama = iter(theirs(jobs, tmp_path_factory.mktemp("tiny-logits"), oracle_params("on")))
    runs = {}
    for arch, path in tiny_files.items():
        model = plain_model(path, engine_params("on"))
        runs[arch] = {n: (ours(model, ids, n), next(llama)) for n, ids in by_len.items()}
        model.close()
    return runs


@pytest.mark.parametrize("arch", tuple(TINY))
def test_tiny_decoders_with_flash_attention(llama_cpp, tiny_runs, arch):
    """Each architecture with -fa on: every prompt length, then 3 tokens through the cache
    (mamba has no KV cache: its prompt's ubatches are what it shares)."""
    for n, (mine, llama) in tiny_runs[arch].items():
        assert_bits(mine, llama, f"{arch}, {n}-token prompt")


# --- every cache type ---------------------------------------------------------------------------

CACHE_CASES = [("on", t, t) for t in ("f32", "bf16", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")] \
    + [("off", t, "f16") for t in ("f32", "bf16", "q4_0", "q5_1")]


@pytest.mark.parametrize("fa,type_k,type_v", CACHE_CASES,
                         ids=[f"fa-{fa}-{k}-{v}" for fa, k, v in CACHE_CASES])
def test_tiny_llama_in_each_cache_type(llama_cpp, tiny_files, tmp_path, fa, type_k, type_v):
    """A tiny llama's cache in every type llama.cpp takes (f16 and q8_0: above): a 63-token
    prompt and 3 tokens through the cache. (An F32 cache under flash attention is cast to F16
    for FLASH_ATTN_EXT; a quantized one's heads of 64 are rotated by 64-wide Hadamard
    matrices, V's only when V is quantized.)"""
    ids = prompts(TINY_VOCAB, 1, seed=7)[63]
    [llama] = theirs([(tiny_files["llama"], ids, 63)], tmp_path,
                     oracle_params(fa, type_k, type_v))
    model = plain_model(tiny_files["llama"], engine_params(fa, type_k, type_v))
    assert_bits(ours(model, ids, 63), llama, f"-fa {fa} -ctk {type_k} -ctv {type_v}")


def test_rotations_are_llama_cpps(llama_cpp, tiny_files, gemma_path):
    """Which caches llama.cpp rotates, its log's attn_rot_k / attn_rot_v: the widths the
    engine's caches take (0: none)."""
    cases = [(tiny_files["llama"], 64, kv) for kv in (("q8_0", "q8_0"), ("q4_0", "f16"),
                                                        ("f16", "f16"), ("bf16", "q5_1"))]
    for path, head, (k, v) in cases + [(gemma_path, 256, ("q8_0", "q8_0"))]:
        log = ask(path, {"load_log": True}, N_THREADS, **oracle_params("on", k, v))["log"]
        model = plain_model(path, engine_params("on", k, v))
        for name, width in (("attn_rot_k", model.cache.attn_rot_k),
                            ("attn_rot_v", model.cache.attn_rot_v)):
            assert f"{name} = {int(width > 0)}, n_embd_head_k_all = {head}" in log, (k, v)
        model.close()


# --- auto, the defaults and the refusals --------------------------------------------------------

def test_auto_is_llama_cpps_decision(llama_cpp, tiny_files, tmp_path):
    """-fa auto (llama.cpp's default): llama.cpp's context enables flash attention on the CPU,
    and the engine's `auto` gives its logits."""
    log = ask(tiny_files["gemma2"], {"load_log": True}, N_THREADS, **oracle_params("auto"))["log"]
    assert "resolve_fused_ops: Flash Attention enabled" in log
    ids = prompts(TINY_VOCAB, 1, seed=9)[63]
    [llama] = theirs([(tiny_files["gemma2"], ids, 63)], tmp_path, oracle_params("auto"))
    model = plain_model(tiny_files["gemma2"], engine_params("auto"))
    assert model.cparams.flash_attn
    assert_bits(ours(model, ids, 63), llama, "gemma2 -fa auto")


@pytest.mark.parametrize("n_ctx,n_batch,n_ubatch", [(300, 2048, 512), (1000, 700, 256)])
def test_context_sizes_are_llama_cpps(llama_cpp, tiny_files, n_ctx, n_batch, n_ubatch):
    """The cells, batch and ubatch a context gets (llama_context's log): n_ctx padded to 256,
    n_batch at most the context asked for, n_ubatch at most n_batch."""
    log = ask(tiny_files["llama"], {"load_log": True}, N_THREADS,
              **dict(oracle_params("on"), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch))["log"]
    c = ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch).resolve("llama", 128, 64, 64)
    for name in ("n_ctx", "n_batch", "n_ubatch"):
        assert f"llama_context: {name:<22}= {getattr(c, name)}\n" in log, name


def test_defaults_are_llama_cpps(llama_cpp):
    """ContextParams' defaults are llama_context_default_params' (those common_params keeps:
    n_batch, n_ubatch, flash attention auto, F16 K and V)."""
    d, p = llama_cpp.llama_context_default_params(), ContextParams()
    assert (p.n_batch, p.n_ubatch) == (d.n_batch, d.n_ubatch)
    assert d.flash_attn_type == llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO and p.flash_attn == "auto"
    assert (int(p.type_k), int(p.type_v)) == (d.type_k, d.type_v)


def write_tiny_llama_head_40(path: Path) -> None:
    """A tiny llama whose heads are 40 wide (no block of 32 divides them)."""
    e, n_head, n_ff, n_layer = 160, 4, 256, 1
    with TinyFile(path, "llama", GGMLType.F32, 0) as f:
        f.decoder_keys(128, e, n_layer, n_ff, n_head, n_head, TINY_VOCAB)
        f.mat("token_embd.weight", e, TINY_VOCAB)
        for name, ne in (("attn_q", (e, e)), ("attn_k", (e, e)), ("attn_v", (e, e)),
                         ("attn_output", (e, e)), ("ffn_gate", (e, n_ff)), ("ffn_up", (e, n_ff)),
                         ("ffn_down", (n_ff, e))):
            if name == "attn_q":
                f.vec("blk.0.attn_norm.weight", e)
            if name == "ffn_gate":
                f.vec("blk.0.ffn_norm.weight", e)
            f.mat(f"blk.0.{name}.weight", *ne)
        f.vec("output_norm.weight", e)
        f.mat("output.weight", e, TINY_VOCAB)


@pytest.mark.parametrize("case", ["quantized-v-without-fa", "k-block", "v-block", "zero-batches"])
def test_refusals_are_llama_cpps(llama_cpp, tiny_files, tmp_path, case):
    """Settings llama.cpp refuses to make a context with: the engine refuses them too, with
    the reason llama.cpp's log gives, in its words."""
    path = tiny_files["llama"]
    oracle, params = oracle_params("off", "f16", "q8_0"), engine_params("off", "f16", "q8_0")
    if case in ("k-block", "v-block"):
        path = tmp_path / "head40.gguf"
        write_tiny_llama_head_40(path)
        k, v = ("q4_0", "f16") if case == "k-block" else ("f16", "q4_0")
        oracle, params = oracle_params("on", k, v), engine_params("on", k, v)
    if case == "zero-batches":
        oracle, params = dict(oracle_params("on"), n_batch=0, n_ubatch=0), None
    answer = ask(path, {"load_log": True}, N_THREADS, **oracle)
    assert "error" in answer, "llama.cpp made the context"
    reason = next(line for line in answer["log"].splitlines()
                  if line.startswith("llama_init_from_model: ")).split(": ", 1)[1]
    with pytest.raises((ModelError, ParamsError)) as refused:
        if params is None:
            ContextParams(n_batch=0, n_ubatch=0)
        else:
            plain_model(path, params)
    assert reason in str(refused.value)


def test_params_checks():
    """Values llama.cpp's argument parser (common/arg.cpp) rejects, and what the record reads."""
    with pytest.raises(ParamsError, match="^Unsupported cache type: q3_K$"):
        ContextParams(type_k="q3_K")
    with pytest.raises(ParamsError, match="^error: unknown value for --flash-attn: 'maybe'$"):
        ContextParams(flash_attn="maybe")
    assert ContextParams(flash_attn="enabled").flash_attn == "on"
    assert ContextParams(flash_attn=False).flash_attn == "off"
    assert ContextParams(type_v="q4_1").type_v == GGMLType.Q4_1
    padded = ContextParams(n_ctx=300).resolve("llama", 128, 64, 64)
    assert (padded.n_ctx, padded.n_batch, padded.n_ubatch) == (512, 300, 300)  # batch: unpadded
    assert ContextParams().resolve("llama", 128, 64, 64).n_ctx == 256  # 0: n_ctx_train
    assert not ContextParams(flash_attn="auto").resolve("grok", 128, 64, 64).flash_attn


# --- FLASH_ATTN_EXT alone, on both builds -------------------------------------------------------

F16, F32 = GGMLType.F16, GGMLType.F32


def fa_case(tk, tv, dk, dv, n_q, n_kv, n_head, n_head_kv, n_threads, scale=0.125, softcap=0.0,
            max_bias=0.0, mask="causal", sinks=False, seed=0) -> dict:
    """One FLASH_ATTN_EXT: random q, K and V (quantized by real ggml), a causal mask (or one of
    random finite values too, or none), sinks."""
    rng = np.random.default_rng([seed, n_q, n_kv, dv, int(tk), int(tv)])
    case = dict(tk=int(tk), tv=int(tv), n_threads=n_threads, scale=scale, softcap=softcap,
                max_bias=max_bias, ne_k=[dk, n_kv, n_head_kv, 1], ne_v=[dv, n_kv, n_head_kv, 1],
                q=rng.uniform(-1, 1, (1, n_head, n_q, dk)).astype(np.float32),
                k=leaf_bytes(Leaf(tk, (dk, n_kv, n_head_kv, 1)), rng),
                v=leaf_bytes(Leaf(tv, (dv, n_kv, n_head_kv, 1)), rng))
    if mask is not None:
        m = np.where(np.arange(n_kv)[None, :] > np.arange(n_kv - n_q, n_kv)[:, None], -np.inf, 0.0)
        if mask == "random":
            m = m + rng.uniform(-2, 0, m.shape)
        case["mask"] = m.astype(np.float32)[None, None]
    if sinks:
        case["sinks"] = rng.uniform(-1, 1, n_head).astype(np.float32)
    return case


def on_ggml(api, case: dict, llamafile: bool = False) -> np.ndarray:
    """The case computed by the engine (api = engine.ggml; llamafile: as llama.cpp's build) or
    by ggml-python (its own build), dst as float32."""
    dq, nq, nh = case["q"].shape[3], case["q"].shape[2], case["q"].shape[1]
    leaves = [Leaf(F32, (dq, nq, nh, 1)), Leaf(case["tk"], tuple(case["ne_k"])),
              Leaf(case["tv"], tuple(case["ne_v"]))]
    datas = [case["q"].tobytes(), case["k"], case["v"]]
    if "mask" in case:
        leaves.append(Leaf(F16, tuple(reversed(case["mask"].shape))))
        datas.append(case["mask"].astype(np.float16).tobytes())
    if "sinks" in case:
        leaves.append(Leaf(F32, (len(case["sinks"]),)))
        datas.append(case["sinks"].tobytes())

    def build(g, ctx, q, k, v, *rest):
        mask = rest[0] if "mask" in case else None
        r = g.ggml_flash_attn_ext(ctx, q, k, v, mask, case["scale"], case["max_bias"],
                                  case["softcap"])
        g.ggml_flash_attn_ext_set_prec(r, 10)
        if "sinks" in case:
            g.ggml_flash_attn_ext_add_sinks(r, rest[-1])
        return r

    if llamafile:
        with llamafile_build():
            res = run(api, build, leaves, datas, case["n_threads"])
    else:
        res = run(api, build, leaves, datas, case["n_threads"])
    return np.frombuffer(res["raw"], np.float32)


FA_CASES = {
    **{f"one_chunk-{t.name}": fa_case(t, t, 64, 64, 7, 33, 4, 2, 2) for t in KV_CACHE_TYPES},
    "one_chunk-q8_0-k-f16-v": fa_case(GGMLType.Q8_0, F16, 64, 64, 7, 33, 4, 2, 2),
    "one_chunk-f16-alibi-softcap-sinks-dv48": fa_case(F16, F16, 32, 48, 5, 20, 6, 3, 3, 0.3, 2.5,
                                                      4.0, "random", True),
    "one_chunk-f32-alibi-softcap-sinks-dv48": fa_case(F32, F32, 32, 48, 5, 20, 6, 3, 3, 0.3, 2.5,
                                                      4.0, "random", True),
    "tiled-f16": fa_case(F16, F16, 64, 64, 70, 80, 2, 1, 2),
    "tiled-f32-sinks-alibi": fa_case(F32, F32, 32, 40, 70, 80, 2, 1, 3, max_bias=2.0, sinks=True),
    "tiled-f16-softcap": fa_case(F16, F16, 64, 64, 70, 80, 2, 1, 2, 1.0, 50.0),
    **{f"split-kv-f16-{n}-threads": fa_case(F16, F16, 64, 64, 1, 530, 4, 2, n) for n in (1, 2, 3)},
    "split-kv-f32-sinks": fa_case(F32, F32, 64, 40, 1, 530, 4, 2, 4, sinks=True),
}
# where the builds part: a DV no multiple of 8 (llama.cpp's x86 build tiles it, the plain one
# does not), a soft-cap with no mask and a short last tile (the plain build soft-caps the tile's
# -inf padding into -softcap: weights for keys that are not there)
BUILDS_PART = {
    "tiled-f16-dv36": fa_case(F16, F16, 64, 36, 70, 80, 2, 1, 2),
    "tiled-f32-softcap-no-mask": fa_case(F32, F32, 32, 32, 70, 80, 2, 1, 2, 1.0, 1.0, mask=None),
}


@pytest.fixture(scope="module")
def llama_fa(tmp_path_factory) -> dict[str, np.ndarray]:
    cases = {**FA_CASES, **BUILDS_PART}
    dst = flash_attn_many(list(cases.values()), tmp_path_factory.mktemp("fa"))
    return {name: d.reshape(-1) for name, d in zip(cases, dst)}


@pytest.mark.parametrize("name", tuple(FA_CASES))
def test_flash_attn_ext_on_both_builds(llama_cpp, llama_fa, name):
    """Bit for bit: the engine as llama.cpp's build against llama.cpp's libggml-cpu, and as
    the plain build against ggml-python's (which agree here)."""
    case = FA_CASES[name]
    np.testing.assert_array_equal(on_ggml(eng, case, llamafile=True), llama_fa[name])
    np.testing.assert_array_equal(on_ggml(eng, case), on_ggml(real_ggml(), case))


@pytest.mark.parametrize("name", tuple(BUILDS_PART))
def test_flash_attn_ext_where_the_builds_part(llama_cpp, llama_fa, name):
    """Each build's own path, bit for bit, where the two builds give different results."""
    case = BUILDS_PART[name]
    ours_llama, ours_plain = on_ggml(eng, case, llamafile=True), on_ggml(eng, case)
    assert (ours_llama.view(np.uint32) != ours_plain.view(np.uint32)).any()
    np.testing.assert_array_equal(ours_llama, llama_fa[name])
    np.testing.assert_array_equal(ours_plain, on_ggml(real_ggml(), case))


def real_ggml():
    import ggml

    return ggml
