"""Will it fit? The memory llama.cpp takes for a model file and a context, before loading it.

llama.cpp makes four kinds of buffers when it loads a model and makes its context, and logs each:
the model's (load_tensors: one a buffer type), the output buffer (llama_context::output_reserve),
the memory module's (llama_kv_cache's K and V per layer, one cache for the sliding-window layers
and one for the others, or Mamba's recurrent states) and the scheduler's compute buffer
(sched_reserve). `plan(path, params)` computes each of them as llama.cpp sizes it, from the file's
header alone: the model opened as llama.cpp's memory-fit pass opens it (ModelFile(no_alloc):
weights placed in their buffer types, pointed at dummy buffers, never read; the KV cache the
same), so a file of many gigabytes is planned without a byte of its weights.

- Model: llama_model_loader places each weight in a buffer type (engine/backend/repack.py
  placement: CPU_REPACK for the weights it repacks unless -nr, else CPU). With mmap (llama.cpp's
  default) the CPU weights are not copied: a CPU_Mapped buffer over the file spans from the first
  CPU weight's bytes to the end of the last one's (get_mapping_range), repacked weights between
  them included; without it, a CPU buffer holds them. Every other buffer type holds its tensors'
  sizes, each padded to the type's alignment (ggml_backend_alloc_ctx_tensors_from_buft_size).
- Output: logits for n_vocab tokens of one sequence (output_reserve(n_seq_max) at the start;
  llama.cpp grows it later when a batch asks for more outputs), 4 bytes each.
- Memory: per layer K [n_embd_gqa, cells] of type_k and V of type_v (llama_kv_cache), the
  sliding-window layers in a cache of their own of the window plus a ubatch, padded to 256
  (llama_kv_cache_iswa; the whole context with --swa-full); Mamba's F32 states r and s instead
  (llama_memory_recurrent, one cell).
- Compute: sched_reserve builds the worst-case graphs with the memory full (init_full: every cell
  read): prompt processing, n_tokens = min(n_ctx, n_ubatch) all of them outputs, then token
  generation, one token, then the first again; the graph allocator (engine/backend/alloc.py, as
  ggml_gallocr_reserve_n) plans each and grows the buffer when one needs more. The engine builds
  the same graphs with its own builders (inp_out_ids as llama.cpp keeps it even when every token
  is an output) and plans them with its own graph allocator: the buffer is the largest plan.
  With one CPU backend the scheduler's graph is the model's graph itself (one split, no copies).

`fit` is llama-fit-params for one device (common/fit.cpp): measure at the model's context and at
the minimum context, interpolate linearly to the memory there is, round down to a multiple of 256.
Leaves out: several sequences (-np > 1: streams the graph builders do not build), GPU offload,
embeddings outputs, LoRA adapters.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field

from engine.backend.alloc import GraphAllocator, memory_plan, padded
from engine.backend.buffer import TENSOR_ALIGNMENT
from engine.core.optable import GGMLOp
from engine.core.types import GGMLType, TYPE_TRAITS
from engine.ggml import (ggml_free, ggml_graph_overhead_custom, ggml_init, ggml_init_params,
                         ggml_nbytes, ggml_tensor_overhead)

from . import BUILDERS, ARCHITECTURES
from .common import ModelError, ModelFile
from .decoder import KVCache
from .params import CParams, ContextParams, CTX_PAD

MAPPED = "CPU_Mapped"  # the buffer type llama.cpp names a buffer over the file's mapping
N_SEQ_MAX = 1  # the sequences a context serves (llama_context_params.n_seq_max)
FIT_MIN_CTX = 4096  # common_params.fit_params_min_ctx: the least context --fit goes down to
FIT_MARGIN = 1024 << 20  # common_params.fit_params_target: the memory llama.cpp leaves free


@dataclass(frozen=True, slots=True)
class ModelBuffer:
    """One buffer of the model's weights (load_tensors' "<name> model buffer size")."""

    name: str  # CPU_Mapped, CPU_REPACK or CPU
    size: int  # bytes
    n_tensors: int  # the weights in it (a tied head's repacked copy counts)
    first: int = 0  # CPU_Mapped: the file range it spans, [first, last)
    last: int = 0


@dataclass(frozen=True, slots=True)
class CachePlan:
    """One cache of the memory module: llama_kv_cache (its K and V) or llama_memory_recurrent
    (its r and s states, in k_* and v_*)."""

    name: str  # "KV" (one cache), "non-SWA" and "SWA" (llama_kv_cache_iswa's two), "RS"
    cells: int  # the cells each layer holds (tokens; a recurrent state: sequences)
    layers: tuple[int, ...]
    type_k: GGMLType
    type_v: GGMLType
    k_bytes: int  # every layer's K (r) together
    v_bytes: int  # every layer's V (s)
    size: int  # its buffer: the tensors, each padded to 32 bytes


@dataclass(frozen=True, slots=True)
class LayerPlan:
    """One layer's share: its weights (bytes by buffer type and by ggml type), its cache."""

    il: int  # -1: the weights of no layer (token table, output head, final norm)
    weights: dict[str, int]  # buffer type name -> bytes of this layer's weights placed there
    types: dict[str, int]  # ggml type name -> bytes of this layer's weights of that type
    cache_bytes: int  # its K and V (or r and s)
    cells: int  # its cache's cells (0: none)
    swa: bool  # a sliding-window layer (in the SWA cache)


@dataclass(frozen=True, slots=True)
class ComputeTensor:
    """A tensor of the compute buffer where the worst graph's plan peaks."""

    name: str
    op: str  # GGML_OP name ("NONE": a graph input)
    type: str
    ne: tuple[int, ...]
    size: int  # bytes
    offset: int  # in the compute buffer
    first: int  # the nodes between which it lives (-1: from before the first node)
    last: int


@dataclass(frozen=True, slots=True)
class ReserveGraph:
    """One of sched_reserve's graphs and what the graph allocator needs for it."""

    what: str  # "pp" (prompt processing) or "tg" (token generation)
    n_tokens: int
    n_outputs: int
    n_nodes: int
    size: int  # bytes the graph allocator's plan reaches


@dataclass(frozen=True, slots=True)
class Plan:
    """What llama.cpp allocates for a model file with a context's settings, in bytes."""

    path: str
    arch: str
    context: CParams  # the settings resolved (n_ctx padded, n_batch, n_ubatch, flash attention)
    mmap: bool
    n_ctx_train: int  # the model's own context (context_length): -c 0 asks for it
    n_vocab: int
    model: tuple[ModelBuffer, ...]
    caches: tuple[CachePlan, ...]
    output: int  # the CPU output buffer
    compute: int  # the CPU compute buffer
    graphs: tuple[ReserveGraph, ...]  # sched_reserve's, in its order
    peak: tuple[ComputeTensor, ...]  # the tensors live where the largest plan peaks, largest first
    layers: tuple[LayerPlan, ...] = field(default=())

    @property
    def total(self) -> int:
        return (sum(b.size for b in self.model) + sum(c.size for c in self.caches) + self.output
                + self.compute)

    def to_json(self) -> dict:
        """Every figure in bytes: {"model": {buffer type: bytes}, "kv": {cache: bytes},
        "compute": {"CPU": bytes}, "output": {"CPU": bytes}, "total", the settings, the caches,
        the graphs, the peak's tensors and the layers."""
        c = self.context
        return {
            "model": {b.name: b.size for b in self.model},
            "kv": {k.name: k.size for k in self.caches},
            "compute": {"CPU": self.compute},
            "output": {"CPU": self.output},
            "total": self.total,
            "file": self.path, "arch": self.arch, "mmap": self.mmap,
            "n_ctx_train": self.n_ctx_train, "n_vocab": self.n_vocab,
            "context": {"n_ctx": c.n_ctx, "n_batch": c.n_batch, "n_ubatch": c.n_ubatch,
                        "flash_attn": c.flash_attn, "type_k": TYPE_TRAITS[c.type_k].type_name,
                        "type_v": TYPE_TRAITS[c.type_v].type_name, "swa_full": c.swa_full,
                        "no_repack": c.no_repack},
            "caches": [{"name": k.name, "cells": k.cells, "layers": list(k.layers),
                        "type_k": TYPE_TRAITS[k.type_k].type_name,
                        "type_v": TYPE_TRAITS[k.type_v].type_name, "k_bytes": k.k_bytes,
                        "v_bytes": k.v_bytes, "size": k.size} for k in self.caches],
            "graphs": [{"what": g.what, "n_tokens": g.n_tokens, "n_outputs": g.n_outputs,
                        "n_nodes": g.n_nodes, "size": g.size} for g in self.graphs],
            "peak": [{"name": t.name, "op": t.op, "type": t.type, "ne": list(t.ne),
                      "size": t.size, "offset": t.offset, "first": t.first, "last": t.last}
                     for t in self.peak],
            "layers": [{"il": la.il, "weights": la.weights, "types": la.types,
                        "cache_bytes": la.cache_bytes, "cells": la.cells, "swa": la.swa}
                       for la in self.layers],
        }


def open_planned(path: str | os.PathLike, params: ContextParams):
    """The model in the file opened as llama.cpp's memory-fit pass opens it: its builder's
    object over weights and caches placed in dummy buffers (nothing read, nothing allocated),
    with llama.cpp's graph topology (inp_out_ids always)."""
    f = ModelFile(path, repack=not params.no_repack, no_alloc=True)
    if f.arch not in BUILDERS or f.arch == "bert":
        f.close()
        raise ModelError(f"{f.path}: architecture '{f.arch}' is not planned; ggml-lens plans "
                         + ", ".join(f"'{a}'" for a in ARCHITECTURES if a != "bert"))
    module, cls = BUILDERS[f.arch]
    try:
        model = getattr(importlib.import_module(f".{module}", __package__), cls)(f, params=params)
    except Exception:
        f.close()
        raise
    model.full_topology = True
    # the graphs' node budget as llama.cpp sets it (llama_context::graph_max_nodes): a capacity,
    # not a part of the graph, larger than some builders' own for many layers and a rotated cache
    n_max = max(1024, 8 * len(f.reader.tensors), model.graph_size())
    model.graph_size = lambda: n_max
    return model


def plan(path: str | os.PathLike, params: ContextParams | None = None,
         mmap: bool | None = None) -> Plan:
    """The buffers llama.cpp makes for the model at `path` with these settings (llama-cli's
    defaults without), in bytes; `mmap` False: llama.cpp's -lm none (by default, the
    settings' load mode)."""
    params = params or ContextParams()
    mmap = params.use_mmap if mmap is None else mmap
    model = open_planned(path, params)
    try:
        f = model.file
        model_bufs = tuple(model_buffers(f, mmap))
        caches = tuple(cache_plans(model))
        graphs, peak = reserve(model)
        return Plan(path=f.path, arch=f.arch, context=model.cparams, mmap=mmap,
                    n_ctx_train=model.hp.n_ctx_train, n_vocab=vocab_size(f), model=model_bufs, caches=caches,
                    output=output_size(f), compute=max(g.size for g in graphs), graphs=graphs,
                    peak=peak, layers=tuple(layer_plans(model)))
    finally:
        model.cache.free()
        model.file.close()


# --- the model's buffers ------------------------------------------------------------------------

def model_buffers(f: ModelFile, mmap: bool) -> list[ModelBuffer]:
    """load_tensors' buffers: per buffer type, its tensors' sizes each padded to the type's
    alignment (ggml_backend_alloc_ctx_tensors_from_buft_size); the CPU weights, with mmap, a
    CPU_Mapped buffer over the file from the first one's bytes to the last one's end."""
    out = []
    for name, tensors in placed_by_buft(f).items():
        buft = f.loaded.buffers[name].buft
        if name == "CPU" and mmap:
            spans = [(f.reader.tensors[f.reader.find_tensor(t.name)].data_offset, ggml_nbytes(t))
                     for t in tensors]
            first, last = min(o for o, _ in spans), max(o + n for o, n in spans)
            out.append(ModelBuffer(MAPPED, last - first, len(tensors), first, last))
        else:
            out.append(ModelBuffer(name, sum(padded(buft.alloc_size(t), buft.alignment)
                                             for t in tensors), len(tensors)))
    order = {MAPPED: 0, "CPU": 0, "CPU_REPACK": 1}
    return sorted(out, key=lambda b: order.get(b.name, 2))


def placed_by_buft(f: ModelFile) -> dict[str, list]:
    """The weights by the buffer type they went to (a tied head's repacked copy included)."""
    out: dict[str, list] = {}
    for name, t in f.loaded.tensors.items():
        out.setdefault(f.loaded.placed[name][0], []).append(t)
    if f.loaded.head is not None:
        out.setdefault(f.loaded.placed["output.weight"][0], []).append(f.loaded.head)
    return out


def vocab_size(f: ModelFile) -> int:
    """llama_vocab's n_tokens: the tokenizer's tokens, or without a vocabulary ('none',
    'no_vocab') the <arch>.vocab_size key (0 when absent)."""
    if f.reader.get("tokenizer.ggml.model") in ("none", "no_vocab", None):
        return int(f.key("{arch}.vocab_size", 0, required=False) or 0)
    i = f.reader.find_key("tokenizer.ggml.tokens")
    return len(f.reader.kvs[i].value) if i >= 0 else 0


def output_size(f: ModelFile) -> int:
    """llama_context::output_reserve(n_seq_max) when the context is made: logits of n_vocab
    floats for each of n_seq_max outputs (no embeddings asked for)."""
    return vocab_size(f) * max(N_SEQ_MAX, 1) * 4


# --- the memory module --------------------------------------------------------------------------

def cache_plans(model) -> list[CachePlan]:
    """The memory module's caches: one llama_kv_cache, or llama_kv_cache_iswa's two (non-SWA,
    SWA), or Mamba's recurrent states; each with its layers, cells and bytes."""
    cache = model.cache
    if not isinstance(cache, KVCache):  # llama_memory_recurrent: r and s per layer, F32
        layers = tuple(range(len(cache.r)))
        return [_cache("RS", int(cache.r[0].ne[1]), layers, cache.r, cache.s)]
    swa = cache.swa_layers
    if not any(swa):
        layers = tuple(range(len(cache.k)))
        return [_cache("KV", cache.n_ctx, layers, cache.k, cache.v)]
    out = []
    for name, flag, cells in (("non-SWA", False, cache.n_ctx), ("SWA", True, cache.n_ctx_swa)):
        layers = tuple(il for il, s in enumerate(swa) if s == flag)
        out.append(_cache(name, cells, layers, [cache.k[il] for il in layers],
                          [cache.v[il] for il in layers]))
    return out


def _cache(name: str, cells: int, layers, k, v) -> CachePlan:
    kb, vb = sum(ggml_nbytes(t) for t in k), sum(ggml_nbytes(t) for t in v)
    size = sum(padded(ggml_nbytes(t), TENSOR_ALIGNMENT) for t in list(k) + list(v))
    return CachePlan(name, cells, tuple(layers), GGMLType(k[0].type), GGMLType(v[0].type), kb, vb,
                     size)


# --- the compute buffer -------------------------------------------------------------------------

def reserve(model) -> tuple[tuple[ReserveGraph, ...], tuple[ComputeTensor, ...]]:
    """sched_reserve: the prompt-processing graph (n_ubatch tokens, all outputs), the
    token-generation graph (one token), the first again, each over the full memory; the compute
    buffer grows to the largest plan (ggml_gallocr_reserve_n reallocates only to grow). Returns
    the graphs in that order (the first once: the same graph plans the same) and the tensors
    live at the largest plan's peak."""
    c = model.cparams
    n_tokens = min(c.n_ctx, c.n_ubatch)
    shape = model.memory_shape(0, model.n_ctx)  # init_full: every cell read, a new sequence
    graphs, peaks = [], []
    for what, n in (("pp", n_tokens), ("tg", N_SEQ_MAX)):
        size, n_nodes, peak = _plan_graph(model, n, shape)
        graphs.append(ReserveGraph(what, n, n, n_nodes, size))
        peaks.append(peak)
    best = max(range(len(graphs)), key=lambda i: graphs[i].size)
    return tuple(graphs), peaks[best]


def _plan_graph(model, n_tokens: int, shape) -> tuple[int, int, tuple[ComputeTensor, ...]]:
    """One reserve graph built by the model's builder and planned by the graph allocator (no
    buffer allocated): (bytes, nodes, the tensors live at its peak)."""
    size = model.graph_size()
    ctx = ggml_init(ggml_init_params(mem_size=ggml_graph_overhead_custom(size, False)
                                     + 4 * size * ggml_tensor_overhead(), mem_buffer=None,
                                     no_alloc=True))
    try:
        gf, _, _ = model.build(ctx, n_tokens, shape, True)
        galloc = GraphAllocator([model.file.loaded.buffers["CPU"].buft])
        alloc = galloc.reserve(gf, no_alloc=True)
        n_nodes = len(gf.nodes)
        return sum(alloc.chunk_sizes[0]), n_nodes, _peak(alloc, n_nodes)
    finally:
        ggml_free(ctx)


def _peak(alloc, n_nodes: int) -> tuple[ComputeTensor, ...]:
    """The tensors in the compute buffer when its highest byte is first reached, largest first."""
    bars = memory_plan(alloc, n_nodes)
    if not bars:
        return ()
    top = max(b.offset + b.size for b in bars)
    at = min(b.start for b in bars if b.offset + b.size == top)
    live = [b for b in bars if b.start <= at <= b.end]
    live.sort(key=lambda b: (-b.size, b.offset))
    return tuple(ComputeTensor(b.tensor.name, GGMLOp(b.tensor.op).name,
                               TYPE_TRAITS[b.tensor.type].type_name,
                               tuple(int(x) for x in b.tensor.ne), b.size, b.offset, b.start,
                               b.end) for b in live)


# --- per layer ----------------------------------------------------------------------------------

def layer_plans(model) -> list[LayerPlan]:
    """Each layer's weights by buffer type and by ggml type, and its cache; first the weights
    of no layer (il -1)."""
    f, cache = model.file, model.cache
    n_layer = len(cache.k) if isinstance(cache, KVCache) else len(cache.r)
    weights: list[dict[str, int]] = [dict() for _ in range(n_layer + 1)]
    types: list[dict[str, int]] = [dict() for _ in range(n_layer + 1)]
    placed = dict(f.loaded.tensors)
    if f.loaded.head is not None:
        placed["output.weight"] = f.loaded.head
    for name, t in placed.items():
        parts = name.split(".")
        il = int(parts[1]) if parts[0] == "blk" and parts[1].isdigit() else -1
        where = f.loaded.placed[name][0]
        n = ggml_nbytes(t)
        weights[il + 1][where] = weights[il + 1].get(where, 0) + n
        tname = TYPE_TRAITS[t.type].type_name
        types[il + 1][tname] = types[il + 1].get(tname, 0) + n
    out = [LayerPlan(-1, weights[0], types[0], 0, 0, False)]
    for il in range(n_layer):
        if isinstance(cache, KVCache):
            kv, cells, swa = (ggml_nbytes(cache.k[il]) + ggml_nbytes(cache.v[il]),
                              cache.cells(il), cache.swa_layers[il])
        else:
            kv, cells, swa = ggml_nbytes(cache.r[il]) + ggml_nbytes(cache.s[il]), 1, False
        out.append(LayerPlan(il, weights[il + 1], types[il + 1], kv, cells, swa))
    return out


# --- llama-fit-params ---------------------------------------------------------------------------

def fit_bytes(p: Plan) -> int:
    """What llama-fit-params counts of a plan (common_get_device_memory_data with the host as
    the one device): the memory breakdown of its fit pass (no_alloc, no mmap: every CPU weight
    in a CPU buffer) in host buffer types only -- the CPU weights, the caches, the compute
    buffer, which that pass sizes by the prompt graph alone (ggml_backend_sched_reserve_size
    of the first reserve graph). CPU_REPACK is not a host buffer type (its is_host is NULL), so
    it is not counted; nor is the output buffer (not in the breakdown)."""
    return (sum(b.size for b in p.model if b.name in ("CPU", MAPPED))
            + sum(c.size for c in p.caches) + p.graphs[0].size)


@dataclass(frozen=True, slots=True)
class Fit:
    """llama-fit-params' answer for the host as its one device, and the largest context whose
    whole plan fits."""

    n_ctx: int | None  # the context it sets (-c); None: it aborts (nothing fits)
    n_ubatch: int
    free: int  # the memory given (llama.cpp: the host's total memory)
    margin: int  # what it leaves free (--fit-target)
    used_max: int  # fit_bytes at the model's own context
    used_min: int  # at the minimum context (0 when not measured)
    plan: Plan | None  # the plan at n_ctx, with the mmap asked for (None: no n_ctx)
    largest: int | None = None  # the largest multiple of 256 whose whole plan (every buffer,
    # CPU_REPACK and output included) fits free - margin; None: not even 256 cells


def fit(path: str | os.PathLike, free: int, params: ContextParams | None = None,
        mmap: bool = True, margin: int = FIT_MARGIN, n_ctx_min: int = FIT_MIN_CTX) -> Fit:
    """common_params_fit_impl's context step with the host as its one device: measured at the
    model's training context, the model fits if it leaves `margin` of `free`; else measured at
    n_ctx_min too, the context is interpolated linearly between the two to use free - margin,
    rounded down to a multiple of 256 (at least n_ctx_min); when even n_ctx_min leaves too
    little (or the model's context is no larger), llama.cpp gives up (n_ctx None). Also the
    largest context whose whole plan fits (a bisection over multiples of 256)."""
    params = params or ContextParams()
    if params.n_ctx:
        raise ModelError(f"--fit chooses the context: leave -c unset (it is {params.n_ctx}); "
                         "llama-fit-params leaves a context the user set as it is")
    full = plan(path, params, mmap=False)
    n_ctx_max, ubatch = full.n_ctx_train, full.context.n_ubatch
    used_max, used_min, target = fit_bytes(full), 0, free - margin
    n_ctx = None
    if used_max <= target:
        n_ctx = n_ctx_max
    elif n_ctx_max > n_ctx_min:
        used_min = fit_bytes(plan(path, params.with_(n_ctx=n_ctx_min), mmap=False))
        if target > used_min:
            n_ctx = n_ctx_min + (n_ctx_max - n_ctx_min) * (target - used_min) // (used_max - used_min)
            n_ctx = max(n_ctx - n_ctx % CTX_PAD, n_ctx_min)
    chosen = None if n_ctx is None else plan(path, params.with_(n_ctx=n_ctx), mmap)
    return Fit(n_ctx, ubatch, free, margin, used_max, used_min, chosen,
               _largest(path, params, mmap, target, n_ctx_max))


def _largest(path, params: ContextParams, mmap: bool, target: int, n_ctx_max: int) -> int | None:
    """The largest context (a multiple of 256, at most the model's) whose whole plan fits
    `target` bytes: a bisection (the plan grows with the context)."""
    fits = lambda cells: plan(path, params.with_(n_ctx=cells), mmap).total <= target  # noqa: E731
    if fits(n_ctx_max):
        return n_ctx_max
    lo, hi = 0, -(-n_ctx_max // CTX_PAD)  # in units of 256 cells: lo fits (0: nothing), hi not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid * CTX_PAD) else (lo, mid)
    return lo * CTX_PAD or None
