"""model: any model file the engine builds (Llama, Qwen, Gemma, Mamba...) reads a prompt and picks its next token, stepped through the builder's own code.

The file's architecture picks its builder in engine/models (load_model), the code `ggml-lens
generate` runs, built as llama.cpp builds that architecture: gguf_init_from_file reads the
metadata, the weights go into a CPU backend buffer, the KV cache (or Mamba's recurrent states)
into one of its own. Each pass is a graph in a no_alloc context, placed by the graph allocator in
a compute buffer and computed by the CPU backend. Every ggml call the builder makes is a step,
shown in the builder's source (engine/models/llama.py, decoder.py, common.py...). The prompt is
one pass; each token in `then` one more pass through the cache. Without a file it runs the
bundled Gemma 3 270M.
"""

import numpy as np

from engine.models import load_model
from engine.programs.gemma3 import softmax
from engine.resources import bundled_model_path

PROMPT = "The capital of France is"
N_CTX = 256  # the tokens the cache holds (llama.cpp's n_ctx): the prompt and appended tokens


def run(n_threads: int = 1, path: str | None = None, prompt: str = PROMPT,
        then: tuple[int, ...] = ()) -> dict:
    model = load_model(path or bundled_model_path(), n_ctx=N_CTX)
    if model.tokenizer is None:
        raise ValueError("this file's vocabulary has no tokenizer built here: it cannot read text")
    ids = model.tokenizer.encode_prompt(prompt)  # special tokens read as in a chat
    n_vocab = model.hp.n_vocab
    if not 1 <= len(ids) + len(then) <= N_CTX:
        raise ValueError(f"prompt and appended tokens must fit {N_CTX} cells")
    if any(not 0 <= t < n_vocab for t in then):
        raise ValueError(f"appended token ids must lie in [0, {n_vocab})")

    piece = model.tokenizer.piece_text
    outputs, batch = {"prompt_tokens": [piece(i) for i in ids]}, ids
    for step in range(1 + len(then)):
        logits = model.decode(batch, n_threads, all_logits=False).logits[-1]
        probs = softmax(logits)  # (odds to show: not a ggml result)
        top = np.argsort(-probs, kind="stable")[:10]
        outputs[f"logits_{step}"] = logits
        outputs[f"top10_{step}"] = [(int(i), piece(int(i)), float(probs[i])) for i in top]
        batch = [then[step]] if step < len(then) else []
    outputs["next_token"] = outputs[f"top10_{len(then)}"][0]
    return outputs

