"""Real models against llama.cpp (llama-cpp-python) on the same GGUF with the same thread count:
a MiniLM sentence embedding (tokenize, set the inputs, compute, pool; both keep the graph built
for a length, the engine's in engine/models/common.py's Passes), Gemma 3
270M decoding token by token and generating 24 tokens greedily (both keep their graphs), the
Python around Gemma's kernels per node, the gemma3 walkthrough recorded and stepped, and a small
Llama decoding in each weight type.

The rows with a goal (the speed issue's) are the median of three runs.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.common import Goal, best_time, median_of
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
            ours = median_of(lambda: best_time(lambda: model.embed(text, n_threads=n_threads),
                                               repeat=1))
            theirs = median_of(lambda: best_time(lambda: llm.embed(text), repeat=1)) \
                if llm is not None else None
            report(f"minilm embed {n} tokens, {n_threads} thread(s)", ours, theirs,
                   "llama.cpp" if llm is not None else "llama.cpp (not installed)", Goal(ratio=2))
    run_gemma(report)
    run_types(report)


def run_types(report) -> None:
    """A Llama of random weights (1024 wide, 4 layers, 32,000 tokens) in each weight type the
    engine computes exactly, written by gguf-py with real ggml's quantizer: one token decoded
    at a time after an 8-token prompt, 1 thread, against llama.cpp on the same file (its
    default path). A type off the engine's fast path shows as a ratio far above the others."""
    import tempfile
    import time

    from tests.support.tiny_models import TinyFile, exact_types

    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    prompt, n = [1, 17, 42, 7, 300, 99, 5, 123], 16
    with tempfile.TemporaryDirectory() as tmp:
        for t in exact_types():
            path = Path(tmp) / f"llama-{t.name}.gguf"
            _write_llama(TinyFile, path, t)
            model = load_model(path)
            tokens = model.generate(prompt, n)

            def ours() -> float:
                model.reset()
                model.decode(prompt, 1, all_logits=False)
                t0 = time.perf_counter()
                for token in tokens:
                    model.decode([token], 1, all_logits=False)
                return (time.perf_counter() - t0) / n

            theirs = None
            if llama_cpp is not None:
                llm = llama_cpp.Llama(str(path), n_ctx=256, n_threads=1, n_threads_batch=1,
                                      verbose=False)

                def theirs_once() -> float:
                    llm.reset()
                    llm.eval(prompt)
                    t0 = time.perf_counter()
                    for token in tokens:
                        llm.eval([token])
                    return (time.perf_counter() - t0) / n
                theirs = median_of(theirs_once)
            report(f"llama 1024x4 {t.name} decode per token, 1 thread", median_of(ours), theirs,
                   "llama.cpp" if llama_cpp is not None else "llama.cpp (not installed)",
                   Goal(ratio=2))


def _write_llama(TinyFile, path: Path, type_) -> None:
    E, F, L, V, H, HKV = 1024, 2816, 4, 32000, 16, 4
    with TinyFile(path, "llama", type_, seed=1) as f:
        f.decoder_keys(256, E, L, F, H, HKV, V)
        f.w.add_rope_dimension_count(E // H)
        kv = E // H * HKV
        f.mat("token_embd.weight", E, V)
        for i in range(L):
            f.vec(f"blk.{i}.attn_norm.weight", E)
            for name, n_out in (("attn_q", E), ("attn_k", kv), ("attn_v", kv), ("attn_output", E)):
                f.mat(f"blk.{i}.{name}.weight", E, n_out)
            f.vec(f"blk.{i}.ffn_norm.weight", E)
            f.mat(f"blk.{i}.ffn_gate.weight", E, F)
            f.mat(f"blk.{i}.ffn_up.weight", E, F)
            f.mat(f"blk.{i}.ffn_down.weight", F, E)
        f.vec("output_norm.weight", E)
        f.mat("output.weight", E, V)


N_DECODE = 24  # tokens decoded one by one after the prompt


def run_gemma(report) -> None:
    """Gemma 3 270M, the bundled model, after a 6-token prompt: each next token decoded alone
    (engine: its graph reused as llama.cpp reuses it; llama.cpp: eval of one token) at 1 and 2
    threads and the speed-up of 2 threads over 1 on both; a 24-token greedy generation (prompt
    and argmax included); the Python and numpy around the C loops per node computed; the gemma3
    walkthrough recorded with one appended token, then steps rebuilt at random."""
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
    model.generate(prompt, 2)  # the graphs built and their calls prepared, once per process
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    tokens = model.generate(prompt, N_DECODE + 1)

    def ours_per_token(n_threads: int) -> float:
        model.reset()
        model.decode(prompt, n_threads, all_logits=False)
        t0 = time.perf_counter()
        for token in tokens[:N_DECODE]:
            model.decode([token], n_threads, all_logits=False)
        return (time.perf_counter() - t0) / N_DECODE

    llms = {}
    if llama_cpp is not None:
        llms = {n: llama_cpp.Llama(str(path), n_ctx=512, n_threads=n, n_threads_batch=n,
                                   verbose=False) for n in (1, 2)}

    def theirs_per_token(n_threads: int) -> float:
        llm = llms[n_threads]
        llm.reset()
        llm.eval(prompt)
        t0 = time.perf_counter()
        for token in tokens[:N_DECODE]:
            llm.eval([token])
        return (time.perf_counter() - t0) / N_DECODE

    oracle = "llama.cpp" if llms else "llama.cpp (not installed)"
    per_token = {}
    for n_threads in (1, 2):
        ours = median_of(lambda: ours_per_token(n_threads))
        theirs = median_of(lambda: theirs_per_token(n_threads)) if llms else None
        per_token[n_threads] = ours, theirs
        report(f"gemma3 270M decode per token, {n_threads} thread(s)", ours, theirs, oracle,
               Goal(ratio=2))
    (o1, t1), (o2, t2) = per_token[1], per_token[2]
    report("gemma3 270M decode speed-up, 2 threads over 1", o1 / o2, t1 / t2 if t1 else None,
           oracle, Goal(at_least=1), unit="x")

    for n_threads in (1, 2):
        ours = median_of(lambda: best_time(lambda: model.generate(prompt, 24, n_threads=n_threads),
                                           repeat=1, min_time=0))
        theirs = None
        if llms:
            llm = llms[n_threads]

            def greedy():
                llm.reset()
                llm.eval(prompt)
                for _ in range(24):
                    llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])

            theirs = median_of(lambda: best_time(greedy, repeat=1, min_time=0))
        report(f"gemma3 270M greedy 24 tokens, {n_threads} thread(s)", ours, theirs, oracle,
               Goal(ratio=2))

    report("gemma3 270M: Python and numpy per node, outside the C loops",
           median_of(lambda: python_per_node(model, prompt, tokens)), None, "-",
           Goal(seconds=15e-6))

    def record() -> float:
        t0 = time.perf_counter()
        trace_program("gemma3", 1, path=str(path), then=(506,))
        return time.perf_counter() - t0
    report("gemma3 walkthrough recorded (prompt + 1 token)", median_of(record), None, "-",
           Goal(seconds=3))
    trace = trace_program("gemma3", 1, path=str(path), then=(506,))
    trace.state_at(0)
    times = []
    for k in random.Random(0).sample(range(len(trace.steps)), 40):
        t0 = time.perf_counter()
        trace.state_at(k)
        times.append(time.perf_counter() - t0)
    report("gemma3 walkthrough: a step's state rebuilt, p95 of 40", sorted(times)[37], None, "-")


def python_per_node(model, prompt: list[int], tokens: list[int]) -> float:
    """Seconds per computed node of one-token decoding (1 thread) spent outside engine._lanes:
    the wall time less the time inside the C loops (each call timed), over the nodes computed
    (views and nodes not marked for compute excluded)."""
    import time

    from engine import lanes as lanes_module
    from engine.compute.threadpool import node_mode

    c = lanes_module.compiled()
    inside = [0.0]
    originals = {name: getattr(c, name) for name in lanes_module.NAMES}

    def timed(fn):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                inside[0] += time.perf_counter() - t0
        return call

    class Timed:
        def __getattr__(self, name):
            return timed(originals[name])

    model.reset()
    model.decode(prompt, 1, all_logits=False)
    model.decode([tokens[0]], 1, all_logits=False)  # the one-token graph, prepared
    saved = lanes_module._compiled
    lanes_module._compiled = Timed()
    try:
        model.reset()
        model.decode(prompt, 1, all_logits=False)
        p = model._pass(1, model.n_kv(len(prompt) + 1), False)
        p.gf.ctx.__dict__.pop("_remembered", None)  # prepared again, around the timed loops
        inside[0] = 0.0
        t0 = time.perf_counter()
        for token in tokens[:N_DECODE]:
            model.decode([token], 1, all_logits=False)
        wall = time.perf_counter() - t0
    finally:
        lanes_module._compiled = saved
    computed = sum(node_mode(node, 1) != "skip" for node in p.gf.nodes)
    return (wall - inside[0]) / (N_DECODE * computed)
