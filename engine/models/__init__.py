"""Real models end to end: graph builders that read a GGUF file and build llama.cpp's graph.

`load_model(path)` opens a GGUF file and picks the builder its `general.architecture` names:
`bert` (sentence embeddings, engine/models/bert.py); `llama`, `qwen2`, `qwen3` and `qwen3moe`
(next-token logits with a KV cache; qwen3moe with a mixture-of-experts feed-forward,
engine/models/llama.py); `gemma2` (engine/models/gemma2.py) and `gemma3`
(engine/models/gemma3.py, Gemma 2's frame with QK norms); `phi3` (engine/models/phi3.py);
`mamba` (Mamba-1, with recurrent states in place of a KV cache, engine/models/mamba.py). Decoders
share engine/models/decoder.py (the memory, masks, generation, the graph pieces llama.cpp's
llm_graph_context shares), tokenize with SentencePiece (engine/models/spm.py) or BPE and sample
with llama.cpp's sampler chain (engine/models/sampling.py).
Tensor names, hyperparameter keys and the graph follow llama.cpp, so a node here can be held next
to the same node in llama.cpp's graph. `load_model(path, params=ContextParams(...))` runs a
decoder with llama.cpp's context settings (engine/models/params.py: flash attention, the K/V
cache types, n_batch and n_ubatch); without params, the engine's plain settings.
Leaves out: every other architecture (the error names the one found), several sequences.
"""

from __future__ import annotations

import importlib
import os

# architecture -> (module, class)
BUILDERS = {
    "bert": ("bert", "Bert"),
    "llama": ("llama", "Llama"),
    "qwen2": ("llama", "Qwen2"),
    "qwen3": ("llama", "Qwen3"),
    "qwen3moe": ("llama", "Qwen3Moe"),
    "gemma2": ("gemma2", "Gemma2"),
    "gemma3": ("gemma3", "Gemma3"),
    "phi3": ("phi3", "Phi3"),
    "mamba": ("mamba", "Mamba"),
}
ARCHITECTURES = tuple(BUILDERS)


def load_model(path: str | os.PathLike, **options):
    """The model in the GGUF file at `path`, built by its architecture's builder."""
    from .common import ModelError, ModelFile

    params = options.get("params")  # llama.cpp's settings: its weights repacked unless -nr
    f = ModelFile(path, repack=params is not None and not params.no_repack,
                  mmap=params is None or params.use_mmap)
    if f.arch not in BUILDERS:
        f.close()
        raise ModelError(f"{f.path}: architecture '{f.arch}' is not supported; ggml-lens builds "
                         + ", ".join(f"'{a}'" for a in ARCHITECTURES))
    module, cls = BUILDERS[f.arch]
    return getattr(importlib.import_module(f".{module}", __name__), cls)(f, **options)


def __getattr__(name: str):
    """ModelError and ModelFile load the ggml stack when first asked for, so that importing a
    light submodule (bundled.py, at the app's start) does not."""
    if name in ("ModelError", "ModelFile"):
        from . import common

        return getattr(common, name)
    raise AttributeError(name)


__all__ = ["ARCHITECTURES", "ModelError", "ModelFile", "load_model"]
