"""Real models: a MiniLM sentence embedding (tokenize, build the graph, compute, pool) with the
engine against llama.cpp (llama-cpp-python's Llama.embed) on the same GGUF with the same thread
count. Goal: within 5x of llama.cpp.

llama.cpp keeps its context (graph, buffers) between calls; the engine builds a fresh context and
graph per call, as a learner's program would, so that cost is part of its time.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import best_time
from engine.models import load_model
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
MINILM = FIXTURES / "minilm-q8_0.gguf"


def run(report) -> None:
    cases = json.loads((FIXTURES / "minilm-reference.json").read_text())["cases"]
    model = load_model(MINILM)
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    for n_threads in (1, 2):
        llm = None
        if llama_cpp is not None:
            llm = llama_cpp.Llama(str(MINILM), embedding=True, n_threads=n_threads,
                                  n_threads_batch=n_threads, n_ctx=512, verbose=False)
        for case in cases:
            text = case["text"]
            n = len(model.tokenizer.encode(text))
            ours = best_time(lambda: model.embed(text, n_threads=n_threads), repeat=3)
            theirs = best_time(lambda: llm.embed(text), repeat=3) if llm is not None else None
            report(f"minilm embed {n} tokens, {n_threads} thread(s)", ours, theirs,
                   "llama.cpp" if llm is not None else "llama.cpp (not installed)")
