"""Real models end to end: graph builders that read a GGUF file and build llama.cpp's graph.

`load_model(path)` opens a GGUF file and picks the builder its `general.architecture` names:
`bert` (sentence embeddings, engine/models/bert.py) or `llama` (next-token logits with a KV cache,
engine/models/llama.py). Tensor names, hyperparameter keys and the graph follow llama.cpp, so
a node here can be held next to the same node in llama.cpp's graph.
Leaves out: every other architecture (the error names the one found), batching, sampling
beyond greedy.
"""

from __future__ import annotations

import os

from .common import ModelError, ModelFile

ARCHITECTURES = ("bert", "llama")


def load_model(path: str | os.PathLike):
    """The model in the GGUF file at `path`, as a Bert or Llama."""
    f = ModelFile(path)
    if f.arch == "bert":
        from .bert import Bert

        return Bert(f)
    if f.arch == "llama":
        from .llama import Llama

        return Llama(f)
    f.close()
    raise ModelError(f"{f.path}: architecture '{f.arch}' is not supported; ggml-lens builds "
                     + " and ".join(f"'{a}'" for a in ARCHITECTURES))


__all__ = ["ARCHITECTURES", "ModelError", "ModelFile", "load_model"]
