"""Gemma 3 270M, the bundled real model, against real llama.cpp running the same file.

llama.cpp runs in a child process (tests/support/llamacpp_run.py: with ggml-python loaded in the
same process its arithmetic changes). Its CPU backend has two code paths for this file: by default
it repacks the Q4_K/Q6_K/Q5_0 weights into interleaved blocks ("extra buffer types"); with
use_extra_bufts off it runs ggml's plain kernels, which the engine reproduces. So: token ids equal
llama.cpp's; logits bit for bit those of the plain path, and from the default path no further than
the plain path is (the spread between llama.cpp's own two paths, measured here); greedy
continuations and seeded samples token for token llama.cpp's.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.models import load_model
from engine.models.sampling import Sampler, SamplerParams
from tests.support.llamacpp_run import ask
from tests.support.tiny_models import nmse

N_THREADS = 2
TEXTS = [
    "The capital of France is",
    "Hello, world!",
    "  two leading spaces, trailing ones  ",
    "line one\nline two\n\n\ttabbed",
    "Naïve café owners in Zürich don't like résumés.",
    "東京は日本の首都です。",
    "Москва — столица России.",
    "नमस्ते दुनिया",
    "مرحبا بالعالم",
    "emoji 🤖🦙 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𐍈",
    "def f(x):\n    return x ** 2  # squares",
    "1234567890 3.14159 1e-5 0x1F",
    "<start_of_turn>user\nhi<end_of_turn>",
    "",
]
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, a small robot"]


@pytest.fixture(scope="module")
def gemma_cpp(gemma_path):
    """A function asking llama.cpp about the bundled model (in a child process)."""
    return lambda request, **params: ask(gemma_path, request, N_THREADS, **params)


@pytest.fixture(scope="module")
def gemma(gemma_path):
    return load_model(gemma_path)


@pytest.mark.parametrize("special", [False, True])
def test_token_ids_are_llama_cpps(gemma, gemma_cpp, special):
    theirs = gemma_cpp({"tokenize": TEXTS, "special": special})["tokens"]
    for text, want in zip(TEXTS, theirs):
        assert gemma.tokenizer.encode(text, True, special) == want, text


def test_pieces_decode_as_llama_cpps(gemma, gemma_cpp):
    ids = [2, 1, 106, 107, 236743, 818, 5279, 529, 7001, 563, 239, 240, 257, 1000, 262143]
    theirs = gemma_cpp({"pieces": ids})["pieces"]
    assert [gemma.tokenizer.piece(i).decode("latin-1") for i in ids] == theirs


def llama_cpp_logits(gemma_cpp, ids: list[int], path, **params) -> np.ndarray:
    gemma_cpp({"logits": ids, "out": str(path)}, **params)
    return np.load(path)


PLAIN = dict(extra_bufts=False, tiled=False)  # llama.cpp's ggml kernels, no repacking or tiling
LONG = "The capital of France is a city where many people live and work"


def test_logits_bit_for_bit_llama_cpps_plain_path(gemma, gemma_cpp, tmp_path):
    """With its repacked weights and tiled K-quant products off, llama.cpp runs ggml's plain
    kernels (with llamafile's sgemm), which the engine reproduces: every position's logits of a
    short prompt, and the last position's of a long one, are the same floats."""
    short = gemma.encode("The capital of France is")
    plain = llama_cpp_logits(gemma_cpp, short, tmp_path / "short.npy", **PLAIN)
    gemma.reset()
    np.testing.assert_array_equal(gemma.decode(short, n_threads=N_THREADS).logits, plain)
    long = gemma.encode(LONG)
    assert len(long) > 8  # past the row count where llama.cpp switches products to tinyBLAS
    plain = llama_cpp_logits(gemma_cpp, long, tmp_path / "long.npy", **PLAIN)
    gemma.reset()
    last = gemma.decode(long, n_threads=N_THREADS, all_logits=False).logits
    np.testing.assert_array_equal(last[0], plain[-1])


def test_logits_within_llama_cpps_own_spread(gemma, gemma_cpp, tmp_path):
    """llama.cpp's default path repacks the weights and tiles the K-quant products of 8 or more
    rows: each path rounds differently, and Gemma's large activations spread the roundings. At
    every position of a long prompt the engine's logits stay as near llama.cpp's plain path's as
    llama.cpp's own paths stay to each other."""
    ids = gemma.encode(LONG)
    paths = {name: llama_cpp_logits(gemma_cpp, ids, tmp_path / f"{name}.npy", **params)
             for name, params in [("plain", PLAIN), ("default", {}),
                                  ("untiled", dict(tiled=False)),
                                  ("unrepacked", dict(extra_bufts=False))]}
    gemma.reset()
    ours = gemma.decode(ids, n_threads=N_THREADS).logits
    assert ours.shape == (len(ids), gemma.hp.n_vocab)
    names = sorted(paths)
    for i in range(len(ids)):
        spread = max(nmse(paths[a][i], paths[b][i]) for a in names for b in names if a < b)
        assert i == 0 or spread > 0  # the paths do differ
        assert nmse(ours[i], paths["plain"][i]) <= max(spread, 1e-9), i


@pytest.mark.decoding
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_24_tokens(gemma, gemma_cpp, prompt):
    """The prompt at once, then token by token through the KV cache: the same 24 tokens as
    llama.cpp's plain path."""
    ids = gemma.encode(prompt)
    theirs = gemma_cpp({"greedy": ids, "n": 24}, **PLAIN)["tokens"]
    assert gemma.generate(ids, 24, n_threads=N_THREADS) == theirs


@pytest.mark.decoding
def test_the_capital_of_france(gemma, gemma_cpp):
    """The demo's answer. llama.cpp's two paths agree for 18 tokens, then a near tie between
    ' capital' and ' located' goes one way with repacked weights and the other without; the
    engine goes the plain path's way."""
    ids = gemma.encode("The capital of France is")
    ours = gemma.generate(ids, 24, n_threads=N_THREADS)
    default = gemma_cpp({"greedy": ids, "n": 24})["tokens"]
    assert ours[:18] == default[:18]
    assert gemma.tokenizer.decode(ours[:18]) == (" the capital of the country of France. It is "
                                                 "the largest city in France. It is")


@pytest.mark.decoding
@pytest.mark.parametrize("params", [
    SamplerParams(temp=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=42),
    SamplerParams(temp=1.5, top_k=0, top_p=0.9, min_p=0.0, seed=7),
    SamplerParams(temp=1.0, top_k=100, top_p=1.0, min_p=0.1, seed=123456789),
], ids=["defaults", "top-p-only", "top-k-min-p"])
def test_seeded_sampling_draws_llama_cpps_tokens(gemma, gemma_cpp, params):
    ids = gemma.encode("Once upon a time")
    theirs = gemma_cpp({"sample": ids, "n": 12, "temp": params.temp, "top_k": params.top_k,
                        "top_p": params.top_p, "min_p": params.min_p, "seed": params.seed},
                       **PLAIN)["tokens"]
    ours = list(gemma.stream(ids, 12, n_threads=N_THREADS, pick=Sampler(params).sample))
    assert ours == theirs


def test_sliding_window_masks_what_llama_cpp_masks():
    from engine.models.decoder import causal_mask

    m = causal_mask(3, 510, window=512)  # positions 510..512 over keys 0..512
    assert np.isneginf(m[2, 0]) and m[1, 0] == 0 and m[2, 1] == 0  # 512 - 0 >= 512: masked
    assert np.isneginf(m[0, 511]) and m[0, 510] == 0  # causal


@pytest.mark.parametrize("fa", ["on", "off"])
def test_the_walkthrough_is_real_ggml_bit_for_bit(gemma_path, fa):
    """The gemma3 walkthrough (a ggml program) run by the engine and by real ggml, flash
    attention on (FLASH_ATTN_EXT) and off (KQ, softmax, KQV): the prompt's logits and those of
    an appended token through the KV cache are the same floats."""
    import engine.programs.gemma3 as prog
    from engine.ggml import to_numpy
    from tests.support.real_facade import run_on_real_ggml

    real = run_on_real_ggml(prog.run, n_threads=N_THREADS, path=str(gemma_path), then=(506,),
                            flash_attn=fa)
    ours = prog.run(N_THREADS, path=str(gemma_path), then=(506,), flash_attn=fa)
    for key in ("logits_0", "logits_1"):
        np.testing.assert_array_equal(np.asarray(to_numpy(ours[key])).reshape(-1),
                                      np.asarray(real[key], np.float32).reshape(-1))
    assert ours["top10_0"] == real["top10_0"] and ours["top10_0"][0][1] == " the"


def plain_builder(gemma_path, fa: str):
    """engine/models/gemma3.py with the walkthrough's settings: 256 cells, flash attention as
    given, the weights not repacked (-nr) and no tiled K-quant products (GGML_CPU_TILED_MM=0)."""
    from engine.models.params import ContextParams

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GGML_CPU_TILED_MM", "0")
        return load_model(gemma_path, params=ContextParams(n_ctx=256, flash_attn=fa,
                                                           no_repack=True, n_threads=N_THREADS))


@pytest.mark.parametrize("fa", ["on", "off"])
def test_the_walkthrough_and_the_builder_agree(gemma_path, fa):
    """The walkthrough and the builder with the same settings, planned as llama.cpp's ggml plans
    (llamafile_build: llamafile's tinyBLAS takes the float KQ and KQV products of the path
    without flash attention), give the same floats: the prompt's logits and an appended
    token's. With flash attention on no float product is left, and the walkthrough as the app
    records it (ggml's own build) gives them too."""
    import engine.programs.gemma3 as prog
    from engine.compute.plan import llamafile_build
    from engine.ggml import to_numpy

    prompt = "Once upon a time"
    model = plain_builder(gemma_path, fa)
    ids = model.encode(prompt)
    built = [model.decode(ids, N_THREADS, all_logits=False).logits[0],
             model.decode([506], N_THREADS, all_logits=False).logits[0]]
    with llamafile_build():
        walked = prog.run(N_THREADS, path=str(gemma_path), prompt=prompt, then=(506,),
                          flash_attn=fa)
    runs = [walked]
    if fa == "on":
        runs.append(prog.run(N_THREADS, path=str(gemma_path), prompt=prompt, then=(506,),
                             flash_attn=fa))
    for out in runs:
        for k, logits in enumerate(built):
            np.testing.assert_array_equal(np.asarray(to_numpy(out[f"logits_{k}"])).reshape(-1),
                                          logits)


def test_the_walkthrough_with_flash_attention_is_llama_cpps(gemma_path, gemma_cpp, tmp_path):
    """With flash attention on, the walkthrough (its weights never repacked) computes what
    llama.cpp computes on its plain kernels (no repacked weights, no tiled products) with flash
    attention on over 256 cells: the prompt's logits, then an appended token's."""
    import engine.programs.gemma3 as prog
    from engine.ggml import to_numpy

    ids = prog.tokenizer(str(gemma_path)).encode_prompt(PROMPTS[0])
    gemma_cpp({"logits": ids + [506], "out": str(tmp_path / "fa.npy"), "batch": len(ids)},
              flash_attn=True, n_ctx=256, **PLAIN)
    theirs = np.load(tmp_path / "fa.npy")
    ours = prog.run(N_THREADS, path=str(gemma_path), prompt=PROMPTS[0], then=(506,),
                    flash_attn="on")
    np.testing.assert_array_equal(np.asarray(to_numpy(ours["logits_0"])).reshape(-1),
                                  theirs[len(ids) - 1])
    np.testing.assert_array_equal(np.asarray(to_numpy(ours["logits_1"])).reshape(-1),
                                  theirs[len(ids)])


# --- the command line ------------------------------------------------------------------------

# a Gemma chat template written for these tests (Hugging Face's Jinja dialect)
TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% set role = 'model' if m['role'] == "
            "'assistant' else m['role'] %}<start_of_turn>{{ role }}\n{{ m['content'] | trim }}"
            "<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n"
            "{% endif %}")


def cli(*args: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "app.cli", *args], capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def chat_model(gemma_path, tmp_path_factory):
    """The bundled model with a chat template added (the file itself stores none)."""
    from engine.gguf.api import gguf_free, gguf_init_from_file, gguf_set_val_str, \
        gguf_write_to_file

    path = tmp_path_factory.mktemp("chat") / "gemma-chat.gguf"
    g = gguf_init_from_file(gemma_path)
    gguf_set_val_str(g, "tokenizer.chat_template", TEMPLATE)
    gguf_write_to_file(g, path)
    gguf_free(g)
    return path


@pytest.mark.decoding
def test_cli_generate_streams_the_answer(gemma_path):
    out = cli("generate", str(gemma_path), "The capital of France is", "-n", "8")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("The capital of France is the capital of the country of")
    assert "6 prompt tokens" in out.stderr and "tokens/s" in out.stderr


@pytest.mark.decoding
def test_cli_generate_samples_with_a_seed(gemma_path):
    args = ("generate", str(gemma_path), "Once upon a time", "-n", "6", "--temp", "0.9",
            "--seed", "42")
    first, again = cli(*args), cli(*args)
    assert first.returncode == 0 and first.stdout == again.stdout


def test_cli_chat_needs_a_template(gemma_path):
    out = cli("chat", str(gemma_path), "Hi")
    assert out.returncode == 1 and "stores no chat template" in out.stderr


@pytest.mark.llamacpp
def test_chat_template_formats_as_llama_cpp_does(chat_model):
    """The template rendered (Jinja) and tokenized equals llama.cpp's own formatting of the
    conversation (llama_chat_apply_template, which recognises Gemma's turns) tokenized."""
    from engine.models.chat import ChatTemplate

    model = load_model(chat_model)
    chat = [{"role": "user", "content": "What is ggml?"},
            {"role": "assistant", "content": "A tensor library."},
            {"role": "user", "content": "  Who wrote it?  "}]
    theirs = ask(chat_model, {"chat": chat, "template": TEMPLATE}, N_THREADS)
    template = ChatTemplate.of(model)
    assert template.render(chat) == "<bos>" + theirs["text"]
    assert template.tokens(chat) == theirs["tokens"]
    out = cli("chat", str(chat_model), "Hi", "-n", "4")
    assert out.returncode == 0, out.stderr
