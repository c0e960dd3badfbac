"""Real models end to end: the engine's BERT and LLaMA graphs against llama.cpp itself.

Oracles: llama.cpp (llama-cpp-python 0.3.36, built from source by pip) running the same GGUF files;
the PyTorch embeddings and Hugging Face token ids in minilm-reference.json; real ggml (ggml-python)
running the walkthroughs' own code. The tiny LLaMA files are written here with gguf-py's
GGUFWriter (random weights, 2 layers, 4 query heads over 2 K/V heads); the Q4_K one is quantized
by real ggml's ggml_quantize_chunk.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.models import ModelError, load_model
from engine.programs import FIXTURES_DIR
from engine.core.types import GGMLType
from tests.support.llamacpp_run import ask
from tests.support.tiny_models import WEIGHT_TYPES, TinyFile, exact_types, nmse, plain_logits_many

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"
REFERENCE = json.loads((FIXTURES / "minilm-reference.json").read_text())
MORE_TEXTS = [
    "Hello, world!",
    "Tensors live in a memory pool; views share their parent's bytes.",
    "Naïve café owners in Zürich don't like résumés.",
    "東京 is the capital of Japan.",
    "llama.cpp runs BERT models on the CPU with ggml, 1234 tokens/s?",
]
N_THREADS = 2


def cosine(a, b) -> float:
    a, b = np.asarray(a, np.float64).reshape(-1), np.asarray(b, np.float64).reshape(-1)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


# --- BERT (MiniLM) ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def minilm():
    return load_model(MINILM)


@pytest.fixture(scope="module")
def minilm_cpp(llama_cpp):
    return llama_cpp.Llama(str(MINILM), embedding=True, n_threads=N_THREADS, n_ctx=512,
                           verbose=False)


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: c["text"][:20])
def test_minilm_matches_pytorch(minilm, case):
    e = minilm.embed(case["text"], n_threads=N_THREADS)
    assert e.token_ids == case["token_ids"]
    assert cosine(e.embedding, case["embedding"]) >= 0.999
    assert abs(float(np.linalg.norm(e.embedding)) - 1) < 1e-5


ALL_TEXTS = [c["text"] for c in REFERENCE["cases"]] + MORE_TEXTS


@pytest.mark.parametrize("text", ALL_TEXTS)
def test_minilm_graph_is_llama_cpps_graph(minilm_cpp, text):
    """The walkthrough's graph (the graph engine/models/bert.py builds, see below) run by real
    ggml gives llama.cpp's embedding: the graph is llama.cpp's, node for node in effect."""
    import engine.programs.minilm as prog
    from tests.support.real_facade import run_on_real_ggml

    real = run_on_real_ggml(prog.run, n_threads=N_THREADS, prompt=text)["embedding"]
    assert cosine(real, minilm_cpp.embed(text, normalize=True)) >= 0.999999


@pytest.mark.parametrize("text", ALL_TEXTS)
def test_minilm_matches_llama_cpp(minilm, minilm_cpp, text):
    """The engine's kernels against llama.cpp's: the issue's bound, on every text (measured:
    1.0000000; the engine computes MiniLM bit for bit as real ggml does, see below)."""
    ours = minilm.embed(text, n_threads=N_THREADS)
    assert ours.token_ids == minilm_cpp.tokenize(text.encode(), add_bos=True, special=False)
    theirs = minilm_cpp.embed(text, normalize=True)
    assert cosine(ours.embedding, theirs) >= 0.99999, cosine(ours.embedding, theirs)


def test_minilm_tokenizer_matches_llama_cpp_on_many_texts(minilm, minilm_cpp):
    texts = MORE_TEXTS + [
        "UNAFFABLE unaffable", "a\tb\nc\r\nd", "x" * 100, "¿Qué? ¡Sí! «quotes» — dash…",
        "İstanbul ÅÄÖ ñ ß Ω", "naïve 中文字符 テスト", "emoji 🙂 here", "[CLS] [SEP] [MASK]",
        "a.b,c;d:e!f?g(h)i[j]k{l}m<n>o/p\\q|r~s`t@u#v$w%x^y&z*", "3.14159 and 1,000,000",
        "\u200bzero\u200dwidth", "ﬁ ligature", "   leading and trailing   ",
        # where Hugging Face differs from llama.cpp, and the tokenizer follows llama.cpp: a word
        # over 100 characters (no [UNK] here), a Hangul syllable (NFD: the vowel and final jamo
        # dropped like accents)
        "x" * 101, "한국어",
    ]
    for text in texts:
        ours = minilm.tokenizer.encode(text)
        assert ours == minilm_cpp.tokenize(text.encode(), add_bos=True, special=False), text


def test_minilm_walkthrough_against_real_ggml():
    """The walkthrough's own code on real ggml gives the same embedding, bit for bit: every op
    on its path is exact, mul_mat included (it follows ggml's vec_dot for these sizes)."""
    import engine.programs.minilm as prog
    from tests.support.real_facade import run_on_real_ggml

    ours = prog.run(N_THREADS)
    theirs = run_on_real_ggml(prog.run, n_threads=N_THREADS)
    assert ours["token_ids"] == theirs["token_ids"]
    np.testing.assert_array_equal(np.asarray(ours["embedding"]),
                                  np.asarray(theirs["embedding"], dtype=np.float32))


def test_minilm_walkthrough_equals_the_model_builder(minilm):
    import engine.programs.minilm as prog

    out = prog.run(1)
    assert out["token_ids"] == REFERENCE["cases"][0]["token_ids"]
    np.testing.assert_array_equal(np.asarray(out["embedding"]).reshape(-1),
                                  minilm.embed(prog.TEXT, n_threads=1).embedding)


def test_minilm_thread_count_does_not_change_the_result(minilm):
    text = REFERENCE["cases"][1]["text"]
    np.testing.assert_array_equal(minilm.embed(text, n_threads=1).embedding,
                                  minilm.embed(text, n_threads=3).embedding)


# --- tiny LLaMA --------------------------------------------------------------------------------

E, N_HEAD, N_HEAD_KV, N_FF, N_LAYER, N_VOCAB, N_CTX = 256, 4, 2, 512, 2, 320, 128


QWEN3_HEAD = 32  # attention.key_length: Qwen3's head size need not be n_embd / n_head


def write_tiny_llama(path: Path, type_: GGMLType = GGMLType.F32, seed: int = 0,
                     arch: str = "llama", vocab: Path | None = None) -> None:
    """A tiny decoder of llama.cpp's `llama`, `qwen2` (Q/K/V biases, NeoX rope) or `qwen3` (QK
    norms, its own head size) architecture, as its converter lays it out, its weight matrices
    in `type_`; with `vocab`'s tokenizer (its token table tied to the output head), or none."""
    hd = QWEN3_HEAD if arch == "qwen3" else E // N_HEAD
    with TinyFile(path, arch, type_, seed, vocab) as f:
        n_vocab = f.n_vocab or N_VOCAB
        f.decoder_keys(N_CTX, E, N_LAYER, N_FF, N_HEAD, N_HEAD_KV, n_vocab)
        if arch == "qwen3":
            f.w.add_key_length(hd)
            f.w.add_value_length(hd)
        f.w.add_rope_dimension_count(hd)
        q, kv = hd * N_HEAD, hd * N_HEAD_KV
        f.mat("token_embd.weight", E, n_vocab)
        for i in range(N_LAYER):
            f.vec(f"blk.{i}.attn_norm.weight", E)
            f.mat(f"blk.{i}.attn_q.weight", E, q)
            f.mat(f"blk.{i}.attn_k.weight", E, kv)
            f.mat(f"blk.{i}.attn_v.weight", E, kv)
            if arch == "qwen2":
                f.vec(f"blk.{i}.attn_q.bias", q, 0.5, 0.0)
                f.vec(f"blk.{i}.attn_k.bias", kv, 0.5, 0.0)
                f.vec(f"blk.{i}.attn_v.bias", kv, 0.5, 0.0)
            if arch == "qwen3":
                f.vec(f"blk.{i}.attn_q_norm.weight", hd)
                f.vec(f"blk.{i}.attn_k_norm.weight", hd)
            f.mat(f"blk.{i}.attn_output.weight", q, E)
            f.vec(f"blk.{i}.ffn_norm.weight", E)
            f.mat(f"blk.{i}.ffn_gate.weight", E, N_FF)
            f.mat(f"blk.{i}.ffn_up.weight", E, N_FF)
            f.mat(f"blk.{i}.ffn_down.weight", N_FF, E)
        f.vec("output_norm.weight", E)
        if vocab is None:
            f.mat("output.weight", E, N_VOCAB)


def llama_cpp_logits(llama_cpp, path: Path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's logits for every position of `tokens`, decoded in one batch (its default
    paths, in this process)."""
    llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=N_THREADS, logits_all=True,
                          verbose=False)
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)], dtype=np.float32)


def plain_logits(path: Path, tokens: list[int], tmp: Path) -> np.ndarray:
    """llama.cpp's logits through its plain ggml kernels (no repacked weights, no tiled K-quant
    products), in a process of its own: the engine's products follow these exactly."""
    ask(path, {"logits": tokens, "out": str(tmp)}, N_THREADS, n_ctx=N_CTX, **PLAIN)
    return np.load(tmp)


PLAIN = dict(extra_bufts=False, tiled=False)
PROMPT = [1, 17, 42, 7, 300, 99, 5, 123]


@pytest.fixture(scope="module", params=[(arch, quant) for arch in ("llama", "qwen2", "qwen3")
                                        for quant in ("f32", "q4_k")], ids="-".join)
def tiny(request, tmp_path_factory):
    arch, quant = request.param
    path = tmp_path_factory.mktemp("tiny") / f"tiny-{arch}-{quant}.gguf"
    write_tiny_llama(path, GGMLType[quant.upper()], arch=arch)
    assert load_model(path).file.arch == arch
    return quant, path


def test_tiny_llama_logits_match_llama_cpp(llama_cpp, tiny, tmp_path):
    """Every position of the prompt, decoded at once: llama.cpp's floats."""
    quant, path = tiny
    theirs = plain_logits(path, PROMPT, tmp_path / "plain.npy")
    ours = load_model(path).decode(PROMPT, n_threads=N_THREADS).logits
    assert ours.shape == theirs.shape == (len(PROMPT), N_VOCAB)
    np.testing.assert_array_equal(ours, theirs)


def test_tiny_llama_kv_cache_decoding_matches_llama_cpp(llama_cpp, tiny, tmp_path):
    """Prompt in one pass, then one token per pass through the cache: the same logits, to
    the last bits (a batch and a single token take differently ordered float products)."""
    quant, path = tiny
    theirs = plain_logits(path, PROMPT, tmp_path / "plain.npy")
    model = load_model(path)
    first = model.decode(PROMPT[:3], n_threads=N_THREADS).logits
    rows = list(first) + [model.decode([t], n_threads=N_THREADS).logits[0] for t in PROMPT[3:]]
    for pos, row in enumerate(rows):
        assert nmse(row, theirs[pos]) <= 1e-9, (pos, nmse(row, theirs[pos]))


def test_tiny_llama_greedy_generation_matches_llama_cpp(llama_cpp, tiny):
    quant, path = tiny
    theirs = ask(path, {"greedy": PROMPT[:4], "n": 5}, N_THREADS, n_ctx=N_CTX, **PLAIN)
    assert load_model(path).generate(PROMPT[:4], 5, n_threads=N_THREADS) == theirs["tokens"]


# every weight type the engine computes as ggml's plain path: one file per type, one llama.cpp
# process per architecture for all of them
TYPES = exact_types()


@pytest.fixture(scope="module", params=("llama", "qwen2", "qwen3"))
def every_type(request, tmp_path_factory):
    """{type: (file, llama.cpp's plain-path logits of PROMPT)} for one architecture."""
    arch, tmp = request.param, tmp_path_factory.mktemp(f"types-{request.param}")
    paths = [tmp / f"{arch}-{t.name}.gguf" for t in TYPES]
    for t, path in zip(TYPES, paths):
        write_tiny_llama(path, t, seed=int(t), arch=arch)
    return dict(zip(TYPES, zip(paths, plain_logits_many(paths, PROMPT, tmp))))


def test_every_type_llama_quantize_writes_without_an_imatrix_is_compared():
    """The types real ggml quantizes without an importance matrix (its own
    ggml_quantize_requires_imatrix) are all computed exactly, so the comparisons below cover
    every one of them, in every architecture."""
    assert set(WEIGHT_TYPES) <= set(TYPES), sorted(t.name for t in set(WEIGHT_TYPES) - set(TYPES))


@pytest.mark.parametrize("type_", TYPES, ids=lambda t: t.name)
def test_tiny_decoder_in_each_weight_type_matches_llama_cpp(llama_cpp, every_type, type_):
    """Weights in each type llama-quantize writes (without an importance matrix) that the engine
    computes exactly: llama.cpp's logits at every position, bit for bit."""
    path, theirs = every_type[type_]
    np.testing.assert_array_equal(load_model(path).decode(PROMPT, n_threads=N_THREADS).logits,
                                  theirs)


@pytest.mark.decoding
def test_bpe_llama_file_generates_as_llama_cpp(tmp_path):
    """A Llama 3 file (llama.cpp's llama-bpe test vocabulary: byte-level BPE, 128,256 tokens, its
    head tied to the token table) with random Q4_K weights: `ggml-lens generate FILE TEXT`
    tokenizes the text and continues it greedily as llama.cpp does on its default path (weights
    repacked, the tied head a repacked copy of the table, flash attention)."""
    from tests.conformance.test_gemma import cli
    from tests.support.vocab import vocab_files

    vocab = next(p for p in vocab_files() if p.name == "ggml-vocab-llama-bpe.gguf")
    path = tmp_path / "tiny-llama3.gguf"
    write_tiny_llama(path, GGMLType.Q4_K, vocab=vocab)
    text = "Hello world: 3 + 4 = 7, héllo!"
    ids = ask(path, {"tokenize": [text]}, N_THREADS, n_ctx=N_CTX)["tokens"][0]
    theirs = ask(path, {"greedy": ids, "n": 8}, N_THREADS, n_ctx=N_CTX, flash_attn=True)["tokens"]
    model = load_model(path)
    assert model.encode(text) == ids  # (the CLI's continuation below is the greedy tokens')
    out = cli("generate", str(path), text, "-n", "8", "--no-stop", "-t", str(N_THREADS), "-c", str(N_CTX))
    assert out.returncode == 0, out.stderr
    said = b"".join(model.tokenizer.piece(t) for t in theirs).decode("utf-8", "replace")
    assert out.stdout == text + said + "\n"


def test_tiny_llama_walkthrough_against_llama_cpp_and_the_builder(llama_cpp, tmp_path):
    """The walkthrough writes its GGUF with the engine's gguf writer: llama.cpp loads that file
    and agrees with the walkthrough's logits; engine/models/llama.py gives the same ones to the
    last bits (the builder computes as llama.cpp's ggml build does, its float products of several
    rows by llamafile's sgemm, over the cache padded as llama.cpp pads it; the walkthrough as
    ggml's own build) and the same tokens."""
    import engine.programs.tiny_llama as prog

    path = tmp_path / "walkthrough.gguf"
    prog.write_model(str(path))
    out = prog.run(1)
    walk = np.asarray(out["prompt_logits"])
    assert nmse(walk, llama_cpp_logits(llama_cpp, path, prog.PROMPT)) <= 1e-6
    np.testing.assert_allclose(load_model(path).decode(prog.PROMPT).logits, walk, rtol=0,
                               atol=1e-5)
    assert load_model(path).generate(prog.PROMPT, prog.N_NEW) == out["generated"]


# --- bad input ---------------------------------------------------------------------------------

def _copy_with(tmp_path: Path, src: Path, drop_tensor: str | None = None,
               drop_key: str | None = None, arch: str | None = None) -> Path:
    """A copy of src, rewritten by the engine's gguf writer with one thing changed."""
    from engine.gguf.api import (gguf_free, gguf_init_from_file, gguf_remove_key,
                                 gguf_set_val_str, gguf_write_to_file)

    g = gguf_init_from_file(src)
    if drop_key is not None:
        gguf_remove_key(g, drop_key)
    if arch is not None:
        gguf_set_val_str(g, "general.architecture", arch)
    g.info = [t for t in g.info if t.name != drop_tensor]
    path = tmp_path / f"bad-{drop_tensor or drop_key or arch}.gguf"
    gguf_write_to_file(g, path)
    gguf_free(g)
    return path


def test_unsupported_architecture_is_named(tmp_path):
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported"):
        load_model(_copy_with(tmp_path, MINILM, arch="gpt2"))


def test_missing_tensor_is_named(tmp_path):
    with pytest.raises(ModelError, match="needs tensor 'blk.3.ffn_up.weight'"):
        load_model(_copy_with(tmp_path, MINILM, drop_tensor="blk.3.ffn_up.weight"))


def test_missing_key_is_named(tmp_path):
    with pytest.raises(ModelError, match="needs key 'bert.attention.layer_norm_epsilon'"):
        load_model(_copy_with(tmp_path, MINILM, drop_key="bert.attention.layer_norm_epsilon"))


def test_text_longer_than_the_context_is_refused(minilm):
    with pytest.raises(ModelError, match="602 tokens long.*at most 512"):
        minilm.embed("word " * 600)


def test_llama_context_overflow_is_refused(tmp_path):
    import engine.programs.tiny_llama as prog

    path = tmp_path / "t.gguf"
    prog.write_model(str(path))
    model = load_model(path)
    with pytest.raises(ModelError, match="do not fit this model's context of 32 tokens"):
        model.decode(list(range(33)))
    with pytest.raises(ModelError, match=r"token ids must lie in \[0, 64\)"):
        model.decode([64])
