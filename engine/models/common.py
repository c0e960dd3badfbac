"""What every model builder shares: a GGUF file opened as llama.cpp's model loader opens it.

Mirrors llama-model-loader: the file is read with gguf_init_from_file (the weights land in one ggml
context, exactly as ggml lays them out), hyperparameters are read from `<arch>.<name>` keys, and a
tensor is fetched by its llama.cpp name with its expected shape checked. Every problem is a
`ModelError` that names the architecture, key or tensor involved.
Leaves out: mmap-ed weights, backends and buffer types, LoRA adapters, split files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from engine.context import GGML_OBJECT_TYPE_TENSOR, Context
from engine.ggml import (Tensor, ggml_free, ggml_get_tensor, ggml_graph_overhead_custom,
                         ggml_graph_plan, ggml_init, ggml_init_params, ggml_nbytes_pad, ggml_tensor_overhead, ggml_used_mem)
from engine.layout import GGML_PAD
from engine.gguf import GGUFError
from engine.gguf.api import gguf_free, gguf_init_from_file, gguf_init_params


class ModelError(ValueError):
    """A GGUF file that a model builder cannot use: the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class Need:
    """A key a builder reads: where to find it and what it means when it is missing."""

    key: str  # with '{arch}' for the architecture prefix, e.g. '{arch}.block_count'
    default: Any = None  # None: the key is required


class ModelFile:
    """An opened GGUF model: its metadata (gguf context) and its weights (ggml context)."""

    def __init__(self, path: str | os.PathLike, expect_arch: str | None = None) -> None:
        self.path = os.fspath(path)
        try:
            self.gguf, self.weights = gguf_init_from_file(
                self.path, gguf_init_params(no_alloc=False, ctx=True))
        except GGUFError as e:
            raise ModelError(f"{self.path}: not a usable GGUF file: {e}") from None
        self.reader = self.gguf.reader
        arch = self.reader.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelError(f"{self.path}: missing key 'general.architecture' (which model "
                             "architecture the file holds)")
        self.arch = arch
        if expect_arch is not None and arch != expect_arch:
            raise ModelError(f"{self.path}: architecture '{arch}' is not '{expect_arch}'")

    def key(self, name: str, default: Any = None, *, required: bool | None = None) -> Any:
        """The value of key `name` ('{arch}' is replaced by the architecture); without a default
        a missing key is an error naming it."""
        full = name.replace("{arch}", self.arch)
        value = self.reader.get(full)
        if value is None:
            if default is None or required:
                raise ModelError(f"{self.path}: architecture '{self.arch}' needs key '{full}', "
                                 "which the file lacks")
            return default
        return value

    def transformer_params(self) -> dict[str, int]:
        """The hyperparameters every architecture here reads alike, under llama.cpp's key names."""
        n_head = int(self.key("{arch}.attention.head_count"))
        n_embd = int(self.key("{arch}.embedding_length"))
        if n_head <= 0 or n_embd % n_head:
            raise ModelError(f"{self.path}: embedding_length {n_embd} is not a multiple of "
                             f"head_count {n_head}")
        return {
            "n_vocab": int(self.tensor("token_embd.weight").ne[1]),
            "n_ctx_train": int(self.key("{arch}.context_length")),
            "n_embd": n_embd,
            "n_ff": int(self.key("{arch}.feed_forward_length")),
            "n_layer": int(self.key("{arch}.block_count")),
            "n_head": n_head,
            "n_head_kv": int(self.key("{arch}.attention.head_count_kv", n_head)),
        }

    def has_tensor(self, name: str) -> bool:
        return self.reader.find_tensor(name) >= 0

    def tensor(self, name: str, ne: tuple[int, ...] | None = None) -> Tensor:
        """The weight named `name` (llama.cpp's name), its ne checked against `ne` when given."""
        t = ggml_get_tensor(self.weights, name)
        if t is None:
            raise ModelError(f"{self.path}: architecture '{self.arch}' needs tensor '{name}', "
                             "which the file lacks")
        if ne is not None:
            want = tuple(int(x) for x in ne) + (1,) * (4 - len(ne))
            have = tuple(int(x) for x in t.ne)
            if have != want:
                raise ModelError(f"{self.path}: tensor '{name}' has ne {list(have[:len(ne)])}; "
                                 f"architecture '{self.arch}' needs {list(want[:len(ne)])}")
        return t

    def optional(self, name: str, ne: tuple[int, ...] | None = None) -> Tensor | None:
        """llama.cpp's TENSOR_NOT_REQUIRED: the weight if the file has it, else None."""
        return self.tensor(name, ne) if self.has_tensor(name) else None

    def close(self) -> None:
        ggml_free(self.weights)
        gguf_free(self.gguf)


def measure(build, graph_size: int, n_threads: int) -> int:
    """The pool size one forward pass needs: build the graph once in a no_alloc context (only
    headers, as ggml-alloc's measure pass does), then add every non-view tensor's padded data
    and the work buffer the plan asks for."""
    ctx = ggml_init(ggml_init_params(mem_size=ggml_graph_overhead_custom(graph_size, False)
                                     + 4 * graph_size * ggml_tensor_overhead(),
                                     mem_buffer=None, no_alloc=True))
    try:
        gf = build(ctx)
        data = 0
        for obj in ctx.objects():  # one walk of the object list (ggml_get_next_tensor restarts it)
            t = Tensor(ctx, obj.offs)
            if obj.type == GGML_OBJECT_TYPE_TENSOR and t.view_src is None:
                data += ggml_nbytes_pad(t)
        work = ggml_graph_plan(gf, n_threads).work_size
        return ggml_used_mem(ctx) + data + ggml_tensor_overhead() + GGML_PAD(work, 64) + 4096
    finally:
        ggml_free(ctx)


def compute_context(mem_size: int) -> Context:
    """A context for one forward pass. llama.cpp reuses memory between nodes (ggml-alloc); here
    every intermediate keeps its own bytes, so a learner can look at any of them afterwards."""
    return ggml_init(ggml_init_params(mem_size=mem_size, mem_buffer=None, no_alloc=False))
