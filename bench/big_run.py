"""One run of a big file, in a process of its own (bench_big_files starts it twice: the engine's
default path and llama.cpp's, through llama-cpp-python, on the same file and settings): load the
model, decode a 6-token prompt, then N tokens one at a time. Prints one JSON line: the wall clock
at the first token's logits (the parent subtracts its own clock at the start: imports, load and
the prompt included), the decode time per token, and the process's peak resident memory.

    python -m bench.big_run ours|llama.cpp FILE N_DECODE THREADS N_CTX
"""

from __future__ import annotations

import json
import resource
import sys
import time

PROMPT = [128000, 791, 6864, 315, 9822, 374]  # "<|begin_of_text|>The capital of France is"


def ours(path: str, n_decode: int, threads: int, n_ctx: int) -> tuple[float, float]:
    import numpy as np

    from engine.models import load_model
    from engine.models.params import ContextParams

    model = load_model(path, params=ContextParams(n_ctx=n_ctx, n_threads=threads))
    logits = model.decode(PROMPT, all_logits=False).logits[-1]
    first = time.time()
    t0 = time.perf_counter()
    for _ in range(n_decode):
        logits = model.decode([int(np.argmax(logits))], all_logits=False).logits[-1]
    return first, (time.perf_counter() - t0) / n_decode


def theirs(path: str, n_decode: int, threads: int, n_ctx: int) -> tuple[float, float]:
    import llama_cpp
    import numpy as np

    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads,
                          flash_attn=True, verbose=False)
    llm.eval(PROMPT)
    first = time.time()
    t0 = time.perf_counter()
    for _ in range(n_decode):
        llm.eval([int(np.argmax(llm.scores[llm.n_tokens - 1]))])
    return first, (time.perf_counter() - t0) / n_decode


def main(argv: list[str]) -> None:
    engine, path, n_decode, threads, n_ctx = argv[0], argv[1], int(argv[2]), int(argv[3]), int(argv[4])
    first, per_token = (ours if engine == "ours" else theirs)(path, n_decode, threads, n_ctx)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"first": first, "per_token": per_token, "peak": peak}))


if __name__ == "__main__":
    main(sys.argv[1:])
