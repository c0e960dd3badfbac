"""What every model builder shares: a GGUF file opened as llama.cpp's model loader opens it.

Mirrors llama-model-loader: the file's metadata and tensor infos are read with
gguf_init_from_file(no_alloc), the weights are made in a no_alloc context per buffer type, given
one backend buffer each (ggml_backend_alloc_ctx_tensors_from_buft, usage WEIGHTS) and filled from
the file with ggml_backend_tensor_set, as llama.cpp loads them. With `repack` (llama.cpp's
default, its extra buffer types on) a weight whose op the CPU_REPACK buffer type supports goes
there, its bytes repacked as they load; every other weight goes to the CPU buffer
(engine/backend/repack.py: placement, and why). Hyperparameters are read from `<arch>.<name>`
keys, and a tensor is fetched by its llama.cpp name with its expected shape checked. Every problem
is a `ModelError` that names the architecture, key or tensor involved. The models compute their
graphs with the same CPU backend, through the graph allocator (ggml-alloc).
`no_alloc` is llama.cpp's memory-fit pass (llama_model_params.no_alloc, what llama-fit-params
loads a model with): every weight placed in its buffer type's context and pointed at a dummy
buffer of that type (`alloc_ctx_tensors`), no bytes allocated or read, so the graph allocator
leaves the weights alone and a plan (engine/models/plan.py) sizes everything else.
`mmap` (llama.cpp's default load mode) leaves the CPU weights where the file's mapping has them:
one CPU_Mapped buffer (ggml_backend_cpu_buffer_from_ptr) spans the file from the first CPU
weight's bytes to the end of the last one's (get_mapping_range), each weight placed at its own
offset (ggml_backend_tensor_alloc), so a page is read from disk when a product first touches it
and never copied; the repacked weights are read from the mapping into CPU_REPACK.
Leaves out: GPU backends, LoRA adapters, split files.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
from cachetools import LRUCache

from engine.compute.plan import llamafile_build, tiled_build
from engine.ggml import (Tensor, ggml_dup_tensor, ggml_free, ggml_get_first_tensor,
                         ggml_get_next_tensor, ggml_get_tensor, ggml_graph_overhead_custom,
                         ggml_init, ggml_init_params, ggml_nbytes, ggml_set_name,
                         ggml_tensor_overhead)
from engine.backend.buffer import map_file, set_buffer_field
from engine.backend.repack import CPU_REPACK_BUFT, placement
from engine.ggml_alloc import (ggml_backend_alloc_ctx_tensors_from_buft, ggml_gallocr_alloc_graph,
                               ggml_gallocr_free, ggml_gallocr_new)
from engine.ggml_backend import (GGML_BACKEND_BUFFER_USAGE_WEIGHTS, ggml_backend_buffer_clear,
                                 ggml_backend_buffer_free, ggml_backend_buft_alloc_buffer,
                                 ggml_backend_buffer_set_usage, ggml_backend_cpu_init,
                                 ggml_backend_cpu_set_n_threads, ggml_backend_free,
                                 ggml_backend_get_default_buffer_type, ggml_backend_graph_compute,
                                 ggml_backend_cpu_buffer_from_ptr, ggml_backend_tensor_alloc,
                                 ggml_backend_tensor_get, ggml_backend_tensor_set)
from engine.gguf import GGUFError, GGUFReader
from engine.gguf.api import (gguf_free, gguf_get_data_offset, gguf_get_n_tensors,
                             gguf_get_tensor_name, gguf_get_tensor_offset, gguf_init_from_file,
                             gguf_init_params)
from engine.core.types import NUMPY_DTYPE, GGMLType


NO_HEAD = frozenset({"bert"})  # architectures without an output head (embeddings)
HEAD_ALWAYS_TIED = frozenset({"gemma2"})  # llama.cpp reads no output.weight for these


class ModelError(ValueError):
    """A GGUF file that a model builder cannot use: the message names what is wrong."""


@dataclass(frozen=True, slots=True)
class Need:
    """A key a builder reads: where to find it and what it means when it is missing."""

    key: str  # with '{arch}' for the architecture prefix, e.g. '{arch}.block_count'
    default: Any = None  # None: the key is required


class ModelMeta:
    """A GGUF model's metadata only (the file's header, keys and tensor infos, memory-mapped):
    enough to read hyperparameters and build a tokenizer, with no context or buffer made."""

    no_alloc = False  # opened for a plan: weights placed, no bytes (ModelFile's no_alloc)

    def __init__(self, path: str | os.PathLike, expect_arch: str | None = None,
                 reader: GGUFReader | None = None) -> None:
        self.path = os.fspath(path)
        try:
            self.reader = reader if reader is not None else GGUFReader(self.path)
        except GGUFError as e:
            raise ModelError(f"{self.path}: not a usable GGUF file: {e}") from None
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

class ModelFile(ModelMeta):
    """An opened GGUF model: its metadata (gguf context) and its weights, in a CPU buffer (and a
    CPU_REPACK one for the weights it repacks, with `repack`); with `no_alloc`, placed in dummy
    buffers and never read (llama.cpp's memory-fit pass)."""

    def __init__(self, path: str | os.PathLike, expect_arch: str | None = None,
                 repack: bool = False, no_alloc: bool = False, mmap: bool = True) -> None:
        path = os.fspath(path)
        try:
            self.gguf, meta = gguf_init_from_file(path, gguf_init_params(no_alloc=True, ctx=True))
        except GGUFError as e:
            raise ModelError(f"{path}: not a usable GGUF file: {e}") from None
        super().__init__(path, expect_arch, self.gguf.reader)
        self.backend = ggml_backend_cpu_init()
        self.no_alloc = no_alloc
        # the output head read from the token table (no output.weight; gemma2's llama.cpp reads
        # none; BERT has no head): llama.cpp asks for the table twice, the second time for MUL_MAT
        tied = self.arch not in NO_HEAD and (self.arch in HEAD_ALWAYS_TIED or not self.has_tensor("output.weight"))
        self.loaded = _load_weights(self.path, self.gguf, meta, self.backend, repack, tied,
                                    no_alloc, mmap and not no_alloc)

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
        t = self.loaded.tensors.get(name)
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

    def token_table_and_head(self, n_embd: int, n_vocab: int, tied: bool = False):
        """token_embd, output_norm and the output head, which is the token table itself (tied)
        when the file has no output.weight, or always when `tied` (gemma2's llama.cpp reads none)."""
        tok_embd = self.tensor("token_embd.weight", (n_embd, n_vocab))
        head = None if tied else self.optional("output.weight", (n_embd, n_vocab))
        if head is None and self.loaded.head is not None:  # the table's repacked copy
            head = self.loaded.head
        return tok_embd, self.tensor("output_norm.weight", (n_embd,)), head or tok_embd

    def close(self) -> None:
        self.loaded.free()
        ggml_backend_free(self.backend)
        gguf_free(self.gguf)


@dataclass
class Weights:
    """A model's weights: a no_alloc context and a buffer per buffer type (llama.cpp's
    ctx_for_buft), every tensor by name, and where each went and why."""

    contexts: dict[str, Any]  # buffer type name -> its context
    buffers: dict[str, Any]  # buffer type name -> its buffer (None: no tensor of that type)
    tensors: dict[str, Tensor]
    placed: dict[str, tuple[str, str]]  # tensor name -> (buffer type name, why)
    head: Tensor | None = None  # a tied output head's own copy of the token table (CPU_REPACK)

    def free(self) -> None:
        for buf in self.buffers.values():
            ggml_backend_buffer_free(buf)
        for ctx in self.contexts.values():
            ggml_free(ctx)


def _load_weights(path: str, gguf, meta, backend, repack: bool, tied: bool,
                  no_alloc: bool = False, mmap: bool = False) -> Weights:
    """Every tensor of the file in a no_alloc context of its buffer type, one buffer a type, then
    each one's bytes copied from the file (llama_model_loader::load_all_data): a weight in
    CPU_REPACK is repacked by its buffer's set_tensor. With `mmap` the CPU weights are not
    copied: they lie in a CPU_Mapped buffer over the file's mapping (`_map_weights`). A `tied`
    output head is the token table asked for again as a MUL_MAT operand (llama.cpp's
    TENSOR_DUPLICATED): where CPU_REPACK takes it, a second, repacked copy of the table. With
    `no_alloc` the buffers are dummies and nothing is read."""
    n = gguf_get_n_tensors(gguf)
    cpu = ggml_backend_get_default_buffer_type(backend)
    bufts = {cpu.name: cpu, CPU_REPACK_BUFT.name: CPU_REPACK_BUFT}
    contexts: dict[str, Any] = {}
    weights = Weights(contexts, {}, {}, {})
    tensors = []
    like = None
    for i in range(n):
        name = gguf_get_tensor_name(gguf, i)
        # the metadata context holds the tensors in the file's order (gguf_init_from_file)
        like = ggml_get_first_tensor(meta) if like is None else ggml_get_next_tensor(meta, like)
        if like is None or like.name != name:
            like = ggml_get_tensor(meta, name)
        assert like is not None  # (meta holds every tensor of the file)
        where, why = placement(name, like.type, like.ne) if repack else (cpu.name, "")
        if where not in contexts:
            contexts[where] = ggml_init(ggml_init_params(mem_size=(n + 1) * ggml_tensor_overhead(),
                                                         mem_buffer=None, no_alloc=True))
        t = ggml_dup_tensor(contexts[where], like)
        ggml_set_name(t, name)
        tensors.append((i, t))
        weights.tensors[name], weights.placed[name] = t, (where, why)
        if repack and tied and name == "token_embd.weight":
            head_where, head_why = placement("output.weight", like.type, like.ne)
            if head_where != where:
                if head_where not in contexts:
                    contexts[head_where] = ggml_init(ggml_init_params(
                        mem_size=(n + 2) * ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
                weights.head = ggml_dup_tensor(contexts[head_where], like)
                ggml_set_name(weights.head, name)
                tensors.append((i, weights.head))
                weights.placed["output.weight"] = (head_where, f"the token table again, {head_why}")
    ggml_free(meta)
    data = None if no_alloc else map_file(path)
    base = gguf_get_data_offset(gguf)
    spans = [(t, base + gguf_get_tensor_offset(gguf, i), ggml_nbytes(t)) for i, t in tensors]
    for t, start, size in spans:
        if data is not None and start + size > data.size:
            raise ModelError(f"{path}: tensor '{t.name}' runs past the end of the file")
    for where, ctx in contexts.items():
        if data is not None and mmap and where == cpu.name:
            buffer = _map_weights(data, [s for s in spans if s[0].ctx is ctx])
            where = buffer.buft.name
        else:
            buffer = alloc_ctx_tensors(ctx, bufts[where], no_alloc)
        ggml_backend_buffer_set_usage(buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        weights.buffers[where] = buffer
    if data is None:
        return weights
    for t, start, size in spans:
        if not (mmap and t.ctx is contexts.get(cpu.name)):
            ggml_backend_tensor_set(t, data[start:start + size], 0, size)
    return weights


def _map_weights(data: np.ndarray, spans: list[tuple[Tensor, int, int]]):
    """The CPU weights where the file's mapping has them: a CPU_Mapped buffer from the first
    one's bytes to the end of the last one's, each placed at its offset in the file."""
    first = min(start for _, start, _ in spans)
    last = max(start + size for _, start, size in spans)
    buffer = ggml_backend_cpu_buffer_from_ptr(data[first:last], last - first)
    for t, start, _ in spans:
        ggml_backend_tensor_alloc(buffer, t, buffer.base + start - first)
    return buffer


def alloc_ctx_tensors(ctx, buft, no_alloc: bool = False, clear: bool = False):
    """A buffer of type buft for every tensor of a no_alloc context, as llama.cpp makes its
    weights', KV cache's and recurrent states' buffers: ggml_backend_alloc_ctx_tensors_from_buft
    (cleared to zeros with `clear`, as the caches are); or, with `no_alloc` (llama.cpp's
    memory-fit pass), a dummy buffer of size 0 that each tensor's `buffer` field points to: the
    tensors count as placed (the graph allocator does not allocate them) but have no data, and
    ggml_backend_alloc_ctx_tensors_from_buft_size says what the real buffer would hold."""
    if not no_alloc:
        buffer = ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft)
        if clear:
            ggml_backend_buffer_clear(buffer, 0)
        return buffer
    buffer = ggml_backend_buft_alloc_buffer(buft, 0)
    t = ggml_get_first_tensor(ctx)
    while t is not None:
        set_buffer_field(t, buffer.address)
        t = ggml_get_next_tensor(ctx, t)
    return buffer


class Pass:
    """One graph computed the way llama.cpp computes it: its tensors' structs in a no_alloc
    context, their bytes planned by the graph allocator in one CPU compute buffer (intermediates
    share memory over time), the graph run by the CPU backend. Build once, then `compute` as
    often as the inputs change."""

    def __init__(self, backend, graph_size: int, build) -> None:
        self.backend = backend
        self.ctx = ggml_init(ggml_init_params(
            mem_size=ggml_graph_overhead_custom(graph_size, False)
            + 4 * graph_size * ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
        self.gf, self.inputs, self.out = build(self.ctx)
        self.galloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(backend))
        if not ggml_gallocr_alloc_graph(self.galloc, self.gf):
            raise ModelError("the graph allocator could not place the graph")

    def compute(self, n_threads: int, tiled: bool = False) -> None:
        """Run the graph as llama.cpp's ggml build does: float products of 2 or more rows by
        llamafile's tinyBLAS; with `tiled`, K-quant products of 8 or more by its tiled path."""
        ggml_backend_cpu_set_n_threads(self.backend, n_threads)
        with llamafile_build(), tiled_build() if tiled else contextlib.nullcontext():
            ggml_backend_graph_compute(self.backend, self.gf)

    def free(self) -> None:
        ggml_gallocr_free(self.galloc)
        ggml_free(self.ctx)


class Passes:
    """Built graphs by shape, the most recently used `kept` of them: as llama.cpp reuses a graph
    while its shape stays, a model builds and allocates a graph once per shape."""

    def __init__(self, kept: int) -> None:
        self._passes: LRUCache = LRUCache(kept)

    def clear(self) -> None:
        """Free every kept graph's context and compute buffer."""
        while self._passes:
            self._passes.popitem()[1].free()

    def get(self, key, backend, graph_size: int, build) -> Pass:
        p = self._passes.get(key)
        if p is None:
            while len(self._passes) >= self._passes.maxsize:  # freed before the new one is built
                self._passes.popitem()[1].free()
            p = self._passes[key] = Pass(backend, graph_size, build)
        return p


def set_input(t: Tensor, values: np.ndarray | list[int]) -> None:
    """An input's bytes into its place in the compute buffer (ggml_backend_tensor_set)."""
    data = np.ascontiguousarray(values, dtype=NUMPY_DTYPE[GGMLType(t.type)])
    ggml_backend_tensor_set(t, data, 0, ggml_nbytes(t))


def get_output(t: Tensor) -> np.ndarray:
    """An output's values, copied out of the compute buffer (ggml_backend_tensor_get): read-only,
    as the copy's bytes are (one copy of a vocabulary's logits, not two)."""
    return np.frombuffer(ggml_backend_tensor_get(t, 0, ggml_nbytes(t)), dtype=NUMPY_DTYPE[GGMLType(t.type)])
