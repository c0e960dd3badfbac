"""Real models: a MiniLM sentence embedding (tokenize, build the graph, compute, pool) with the
engine against llama.cpp (llama-cpp-python's Llama.embed) on the same GGUF with the same thread
count (goal: within 5x of llama.cpp); Gemma 3 270M generating 24 tokens greedily against
llama.cpp (goal: within 10x at 1 thread), and its walkthrough recorded and stepped.

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
    run_gemma(report)


def run_gemma(report) -> None:
    """Gemma 3 270M, the bundled model: a 24-token greedy generation after a 6-token prompt
    (engine: its graphs reused as llama.cpp reuses them; llama.cpp: eval, argmax, eval), and the
    gemma3 walkthrough recorded with one appended token, then steps rebuilt at random."""
    import random
    import time

    from app.settings import Settings
    from engine.models.bundled import BundledModelError, require
    from engine.programs import trace_program

    try:
        path = require(Settings.from_env().data_dir)
    except BundledModelError as e:
        print(f"gemma3: {e}")
        return
    model = load_model(path)
    prompt = model.encode("The capital of France is")
    model.generate(prompt, 2)  # the weights' prepared form, made once per process
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    for n_threads in (1, 2):
        ours = best_time(lambda: model.generate(prompt, 24, n_threads=n_threads), repeat=2,
                         min_time=0)
        theirs = None
        if llama_cpp is not None:
            llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=n_threads, verbose=False)

            def greedy():
                llm.reset()
                llm.eval(prompt)
                for _ in range(24):
                    llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])

            theirs = best_time(greedy, repeat=2, min_time=0)
        report(f"gemma3 270M greedy 24 tokens, {n_threads} thread(s)", ours, theirs,
               "llama.cpp" if theirs is not None else "llama.cpp (not installed)")
    t0 = time.perf_counter()
    trace = trace_program("gemma3", 1, path=str(path), then=(506,))
    report(f"gemma3 walkthrough recorded ({len(trace.steps)} steps)", time.perf_counter() - t0,
           None, "-")
    trace.state_at(0)
    times = []
    for k in random.Random(0).sample(range(len(trace.steps)), 40):
        t0 = time.perf_counter()
        trace.state_at(k)
        times.append(time.perf_counter() - t0)
    report("gemma3 walkthrough: a step's state rebuilt, p95 of 40", sorted(times)[37], None, "-")
