"""llama.cpp's default CPU path, the engine against llama.cpp on the bundled Gemma 3 270M, in one run:
both with llama.cpp's defaults (weights repacked into CPU_REPACK, the tiled K-quant products,
flash attention on, an F16 cache), the same 512 cells and thread count. A ~180-token prompt
decoded in one batch (the repacked gemm and the tiled products are what make llama.cpp's prompts
fast), then tokens decoded one at a time after it (the repacked gemv), at 1 and 2 threads.

The rows are the median of three runs; the goals are the default-path issue's: prompts at most
1.5x llama.cpp, decoding at most 1.2x.
"""

from __future__ import annotations

import time

from bench.common import Goal, median_of
from engine.models import load_model
from engine.models.params import ContextParams

N_CTX = 512
N_DECODE = 16
TEXT = ("The river ran high that spring, and the ferryman counted the days until the water would "
        "fall again. Every morning he walked to the landing, looked at the marks on the old post, "
        "and went home to mend his nets. His daughter, who kept the accounts, wrote the numbers in a "
        "green book: 4.2 metres on Monday, 4.5 on Tuesday, 4.1 by the end of the week. ")


def run(report) -> None:
    from app.settings import Settings
    from engine.models.bundled import BundledModelError, require

    try:
        path = require(Settings.from_env().data_dir)
    except BundledModelError as e:
        print(f"default path: {e}")
        return
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    oracle = "llama.cpp" if llama_cpp is not None else "llama.cpp (not installed)"
    for n_threads in (1, 2):
        model = load_model(path, params=ContextParams(n_ctx=N_CTX, n_threads=n_threads))
        ids = model.encode(TEXT * 4)[:180]
        tokens = [int(t) for t in ids[1:N_DECODE + 1]]
        model.decode(ids, all_logits=False)  # the graphs built and prepared once, as llama.cpp keeps them
        model.reset()

        def ours_prompt() -> float:
            model.reset()
            t0 = time.perf_counter()
            model.decode(ids, all_logits=False)
            return time.perf_counter() - t0

        def ours_decode() -> float:
            model.reset()
            model.decode(ids, all_logits=False)
            t0 = time.perf_counter()
            for t in tokens:
                model.decode([t], all_logits=False)
            return (time.perf_counter() - t0) / N_DECODE

        theirs_prompt = theirs_decode = None
        if llama_cpp is not None:
            llm = llama_cpp.Llama(str(path), n_ctx=N_CTX, n_threads=n_threads, n_threads_batch=n_threads,
                                  flash_attn=True, swa_full=False, verbose=False)

            def prompt_once() -> float:
                llm.reset()
                t0 = time.perf_counter()
                llm.eval(ids)
                return time.perf_counter() - t0

            def decode_once() -> float:
                llm.reset()
                llm.eval(ids)
                t0 = time.perf_counter()
                for t in tokens:
                    llm.eval([t])
                return (time.perf_counter() - t0) / N_DECODE

            theirs_prompt, theirs_decode = median_of(prompt_once), median_of(decode_once)
        report(f"gemma3 270M default path: {len(ids)}-token prompt, {n_threads} thread(s)",
               median_of(ours_prompt), theirs_prompt, oracle, Goal(ratio=1.5))
        report(f"gemma3 270M default path: decode per token after it, {n_threads} thread(s)",
               median_of(ours_decode), theirs_decode, oracle, Goal(ratio=1.2))
        model.close()
