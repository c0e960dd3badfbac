"""model: any model file the engine builds (Llama, Qwen, Gemma, Mamba...) reads a prompt and picks its next token, stepped through the builder's own code.

The file's architecture picks its builder in engine/models (load_model), the code `ggml-lens
generate` runs, built as llama.cpp builds that architecture with llama.cpp's context settings
(engine/models/params.py): gguf_init_from_file reads the metadata, the weights go into a CPU
backend buffer (repacked into CPU_REPACK's interleaved blocks where llama.cpp repacks them), the
KV cache (or Mamba's recurrent states) into one of its own. Each pass is a graph in a no_alloc
context, placed by the graph allocator in a compute buffer and computed by the CPU backend.
Every ggml call the builder makes is a step, shown in the builder's source
(engine/models/llama.py, decoder.py, common.py...). The prompt goes in ubatches of n_ubatch
tokens, a pass each; each token in `then` is one more pass through the cache. Without a file it
runs the bundled Gemma 3 270M.

The settings are llama-cli's (engine/programs/settings.py), with llama.cpp's defaults but for the
context, which holds N_CTX cells unless -c says more: -fa flash attention (auto: on, one
FLASH_ATTN_EXT per layer instead of KQ, softmax, KQV), -ctk/-ctv the K and V cache types (a
quantized V only with flash attention), -nr the weights left in the file's layout (no
CPU_REPACK), -ub the ubatch size.
"""

from functools import lru_cache
from pathlib import Path

import numpy as np

from engine.gguf import GGUFReader
from engine.models import load_model
from engine.models.decoder import KVCache
from engine.models.params import ContextParams
from engine.programs.gemma3 import softmax
from engine.resources import bundled_model_path

PROMPT = "The capital of France is"
N_CTX = 256  # the tokens the cache holds by default (llama.cpp's n_ctx): the prompt and appended tokens
MAX_UBATCHES = 8  # the graphs a prompt may take (a pass each: the steps stay a few thousand each)


def run(n_threads: int = 1, path: str | None = None, prompt: str = PROMPT,
        then: tuple[int, ...] = (), flash_attn: str = "auto", type_k: str = "f16",
        type_v: str = "f16", no_repack: bool = False, n_ubatch: int = 512,
        n_ctx: int = N_CTX) -> dict:
    params = ContextParams(n_ctx=n_ctx, n_ubatch=n_ubatch, n_threads=n_threads,
                           flash_attn=flash_attn, type_k=type_k, type_v=type_v,
                           no_repack=no_repack)
    model = load_model(path or bundled_model_path(), params=params)
    if model.tokenizer is None:
        raise ValueError("this file's vocabulary has no tokenizer built here: it cannot read text")
    ids = model.tokenizer.encode_prompt(prompt)  # special tokens read as in a chat
    n_vocab = model.hp.n_vocab
    if not 1 <= len(ids) + len(then) <= model.n_ctx:
        raise ValueError(f"prompt and appended tokens must fit {model.n_ctx} cells")
    if any(not 0 <= t < n_vocab for t in then):
        raise ValueError(f"appended token ids must lie in [0, {n_vocab})")
    n_graphs = len(model.cparams.batches(len(ids)))
    if n_graphs > MAX_UBATCHES:
        raise ValueError(f"-ub {n_ubatch} splits the prompt's {len(ids)} tokens into {n_graphs} "
                         f"ubatches; this walkthrough runs at most {MAX_UBATCHES}: a larger -ub")

    piece = model.tokenizer.piece_text
    outputs, batch = {"prompt_tokens": [piece(i) for i in ids], **kv_facts(model, n_ctx)}, ids
    for step in range(1 + len(then)):
        logits = model.decode(batch, n_threads, all_logits=False).logits[-1]
        probs = softmax(logits)  # (odds to show: not a ggml result)
        top = np.argsort(-probs, kind="stable")[:10]
        outputs[f"logits_{step}"] = logits
        outputs[f"top10_{step}"] = [(int(i), piece(int(i)), float(probs[i])) for i in top]
        batch = [then[step]] if step < len(then) else []
    outputs["next_token"] = outputs[f"top10_{len(then)}"][0]
    return outputs


def kv_facts(model, n_ctx: int) -> dict:
    """What the debugger's KV panel takes from the model besides the recorded tensors (the cache
    tensors, inp_pos, the cells and the masks): the context asked for (-c), the sliding window
    in positions (0: none) and which layers attend through it; nothing without a KV cache (Mamba)."""
    if not isinstance(model.cache, KVCache):
        return {}
    return {"kv_n_ctx": n_ctx, "kv_n_swa": int(model.windows.get("attn_inp_kq_mask_swa") or 0),
            "kv_swa_layers": list(model.kv_cache.swa_layers)}


def check_settings(path: str | None = None, **settings) -> None:
    """llama.cpp's checks of these settings (run()'s keywords) before it makes a context for the
    file at `path` (the bundled model by default), made without loading it: ParamsError with
    llama.cpp's words for a quantized V cache without flash attention, or a quantized cache
    whose block does not divide the file's head size."""
    arch, n_ctx_train, head = _shape(str(path or bundled_model_path()))
    ContextParams(**settings).resolve(arch, n_ctx_train, head, head)


def _shape(path: str) -> tuple[str, int, int]:
    """The file's architecture, training context and head size, read again when it changes."""
    st = Path(path).stat()
    return _header(path, st.st_mtime_ns, st.st_size)


@lru_cache(maxsize=16)
def _header(path: str, mtime_ns: int, size: int) -> tuple[str, int, int]:
    """From the file's header: its architecture, training context and head size
    (attention.key_length, else embedding_length / head_count; 0 without attention)."""
    with GGUFReader(path) as r:
        arch = r.get("general.architecture")
        key = lambda k: r.get(f"{arch}.{k}")  # noqa: E731
        n_head = int(np.max(key("attention.head_count") or 0))  # (per layer in some files)
        head = key("attention.key_length") or (key("embedding_length") // n_head if n_head else 0)
        return arch, int(key("context_length") or 0), int(head)
