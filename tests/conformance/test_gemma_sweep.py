"""The bundled Gemma 3 270M against llama.cpp on 50 prompts of 1 to 128 tokens, on both paths.

Each prompt is decoded at once from an empty cache (every position's logits), then continued
greedily for 32 tokens through the KV cache (each step's logits): the same floats as llama.cpp's,
on its plain path (its repacked weights and tiled K-quant products off, flash attention off: the
engine's load_model without settings) and on its default path (weights repacked, tiled products,
flash attention auto: load_model with ContextParams), compared as sha256 digests of
each row's bytes (tests/support/llamacpp_run.py row_digests), and the same tokens. llama.cpp runs
all 50 prompts in one process. The prompts are slices of the texts below, of lengths spread evenly
from 1 (the BOS token alone) to 128: prose, dialogue, code, numbers, other scripts.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.models import load_model
from engine.models.params import ContextParams
from tests.support.llamacpp_run import ask, row_digests

N_THREADS = 2
N_NEW = 32
N_PROMPTS = 50
RUN = range(N_PROMPTS) if os.environ.get("GGML_LENS_SWEEP") == "all" else (0, 24, 49)
PLAIN = dict(extra_bufts=False, tiled=False)
TEXTS = [
    "The river ran high that spring, and the ferryman counted the days until the water would "
    "fall again. Every morning he walked to the landing, looked at the marks on the old post, "
    "and went home to mend his nets. His daughter, who kept the accounts, wrote the numbers in a "
    "green book: 4.2 metres on Monday, 4.5 on Tuesday, 4.1 by the end of the week.",
    "Q: Why does ggml keep tensors in one memory pool?\nA: Because allocating every tensor on its "
    "own would scatter them; one arena keeps the structs and data side by side, and freeing the "
    "context frees them all at once.\nQ: And views?\nA: A view shares its parent's bytes.",
    "def softmax(x):\n    m = max(x)\n    e = [math.exp(v - m) for v in x]\n    s = sum(e)\n"
    "    return [v / s for v in e]\n\nfor row in matrix:\n    print(softmax(row))  # rows sum to 1\n",
    "東京は日本の首都であり、世界有数の大都市です。Москва — столица России. नमस्ते दुनिया! "
    "Les élèves ont résolu 17 problèmes en 45 minutes; 3 × 7 = 21, 2^10 = 1024, π ≈ 3.14159.",
]


def prompts(tokenizer) -> list[list[int]]:
    """N_PROMPTS prompts: BOS and a slice of the texts' tokens, lengths 1..128 evenly spread."""
    body = [t for text in TEXTS for t in tokenizer.encode(text, add_special=False)]
    bos = tokenizer.encode("", add_special=True)
    assert len(body) >= 128, len(body)
    out = []
    for i, n in enumerate(np.linspace(1, 128, N_PROMPTS).round().astype(int)):
        start = (i * 37) % (len(body) - n + 2)
        out.append(bos + body[start:start + n - 1])
    return out


# each path: the engine's settings (None: its plain path) and llama.cpp's (llama_cpp.Llama's)
PATHS = {"plain": (None, PLAIN),
         "default": (ContextParams(n_ctx=512, n_batch=512, n_ubatch=512, n_threads=N_THREADS),
                     dict(flash_attn=True, swa_full=False))}


@pytest.fixture(scope="module", params=tuple(PATHS))
def gemma(request, gemma_path):
    settings = PATHS[request.param][0]
    model = load_model(gemma_path) if settings is None else load_model(gemma_path, params=settings)
    yield request.param, model
    model.close()


@pytest.fixture(scope="module")
def sweep(gemma, gemma_path):
    """The prompts and llama.cpp's answers to them on the path (one process for all)."""
    path, model = gemma
    ps = prompts(model.tokenizer)
    answers = ask(gemma_path, {"sweep": [ps[k] for k in RUN], "n": N_NEW}, N_THREADS, **PATHS[path][1])
    return ps, dict(zip(RUN, answers["prompts"]))


@pytest.mark.decoding
@pytest.mark.parametrize("k", RUN)
def test_prompt_and_32_greedy_tokens_bit_for_bit(gemma, sweep, k):
    path, gemma = gemma
    ids, theirs = sweep[0][k], sweep[1][k]
    gemma.reset()
    last = gemma.decode(ids, n_threads=N_THREADS).logits
    digests, tokens = row_digests(last), []
    for _ in range(N_NEW):
        tokens.append(int(np.argmax(last[-1])))
        last = gemma.decode([tokens[-1]], n_threads=N_THREADS).logits
        digests += row_digests(last)
    first = next((i for i, (a, b) in enumerate(zip(digests, theirs["digests"])) if a != b), None)
    assert first is None, (f"{path} path, {len(ids)}-token prompt: logits differ first at position {first} "
                           f"(tokens ours {tokens}, llama.cpp's {theirs['tokens']})")
    assert tokens == theirs["tokens"]
    assert len(digests) == len(theirs["digests"]) == len(ids) + N_NEW
