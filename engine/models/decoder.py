"""What every decoder-only model shares: feeding tokens through the graph with a KV cache.

A model (engine/models/llama.py, gemma2.py, gemma3.py, phi3.py) builds llama.cpp's graph for n
new tokens attending to n_kv cache cells (`build`) and says its hyperparameters; `Decoder` runs it
the way llama_decode does: the graph's tensors placed by the graph allocator in a CPU compute
buffer and run by the CPU backend (engine/models/common.py `Pass`), the inputs (token ids,
positions, the cells the new K and V rows go to, the attention masks) set with
ggml_backend_tensor_set, the cache growing by the tokens decoded, and greedy or sampled
generation. The settings are llama.cpp's context parameters (engine/models/params.py): opened
with ContextParams, a model runs a prompt in batches of n_batch split into ubatches of n_ubatch
(a graph each), with flash attention or without, over a cache of the types asked for; opened
without, it runs the engine's plain settings (`CParams.plain`: the prompt in one graph, no flash
attention, an F16 cache).

The KV cache (`KVCache`) is llama.cpp's unified single-sequence cache: per layer a K tensor
[n_embd_gqa, n_ctx] and a V tensor of the same size (F16 by default; any of llama.cpp's cache
types; a sliding-window layer's with the cells of llama_kv_cache_iswa's SWA cache, the window
plus a ubatch unless swa_full), V transposed unless flash attention reads it, a quantized one rotated by Hadamard
matrices (`Decoder.attend`); new rows are written by ggml_set_rows at indices that are graph
inputs, so, as in llama.cpp, one graph (and its compute context and plan) serves every token
while the padded cell count n_kv stays the same.
The memory is pluggable: a model with another one (Mamba's recurrent states,
engine/models/mamba.py) overrides `memory_inputs`, `set_memory_inputs` and `memory_shape`.

What several decoders load alike lives here too: `load_qkv` (create_tensor_qkv: the fused
attn_qkv weight or separate Q, K and V) and `swa_layers` (which layers attend through a sliding
window). The graph pieces they build with, llm_graph_context's, are in engine/models/llm_graph.py.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator, Protocol

import numpy as np

from engine.ggml import (GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, GGML_TYPE_I64, Tensor,
                         ggml_build_forward_expand, ggml_build_forward_select, ggml_cont_2d, ggml_free, ggml_get_rows,
                         ggml_init, ggml_init_params, ggml_is_contiguous, ggml_new_graph_custom,
                         ggml_new_tensor_1d, ggml_new_tensor_2d, ggml_reshape_2d, ggml_row_size,
                         ggml_set_input, ggml_set_name, ggml_set_rows, ggml_tensor_overhead,
                         ggml_view_2d, ggml_view_3d)
from engine.ggml_backend import ggml_backend_buffer_free, ggml_backend_get_default_buffer_type

from .common import ModelError, ModelFile, Pass, Passes, alloc_ctx_tensors, get_output, set_input
from .llm_graph import attention, mul_mat_hadamard
from .params import CParams, ContextParams, ParamsError, rotation
from .tokenize import Tokenizer


# texts llama.cpp's vocabulary loader takes as end-of-generation tokens (llama-vocab.cpp)
END_OF_TURN = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
               "<|end_of_text|>", "<EOT>", "<|eom_id|>", "<end_of_utterance>")


@dataclass(frozen=True, slots=True)
class Decoded:
    token_ids: list[int]
    logits: np.ndarray  # [n_outputs, n_vocab]: every position, or only the last
    seconds: float


@dataclass(frozen=True, slots=True)
class DecoderParams:
    """The hyperparameters every decoder here reads (llama.cpp's llama_hparams, in part)."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int  # fewer than n_head: grouped-query attention
    head_dim: int  # attention.key_length (n_embd / n_head unless the file says otherwise)
    rms_eps: float
    freq_base: float

    @property
    def n_embd_gqa(self) -> int:  # K or V width of one token: head_dim * n_head_kv
        return self.head_dim * self.n_head_kv


KV_PAD = 256  # llama_kv_cache::get_n_kv pads the cells attention reads to a multiple of this


def kv_cells(n_used: int, n_ctx: int) -> int:
    """How many cache cells the attention reads when n_used hold tokens: llama.cpp pads it to a
    multiple of 256 (at least 256, at most the cache), so one graph shape serves many batches;
    the cells past the tokens are masked out."""
    return min(n_ctx, max(KV_PAD, -(-n_used // KV_PAD) * KV_PAD))


def causal_mask(n: int, n_past: int, window: int | None = None,
                n_kv: int | None = None) -> np.ndarray:
    """[n queries, n_kv keys] (n_kv: n_past + n unless given): 0 where a query at position
    n_past + q may look at key k (k <= its position, and for a sliding window q_pos - k <
    window), -inf elsewhere."""
    q_pos = np.arange(n_past, n_past + n)[:, None]
    k_pos = np.arange(n_past + n if n_kv is None else n_kv)[None, :]
    masked = k_pos > q_pos
    if window is not None:
        masked |= q_pos - k_pos >= window  # llama_hparams::is_masked_swa (standard)
    return np.where(masked, -np.inf, 0.0).astype(np.float32)


def swa_layers(f: ModelFile, n_layer: int, n_pattern: int) -> tuple[bool, ...]:
    """llama_model_base::load_swa_pattern: per layer, whether it attends through the sliding
    window. attention.sliding_window_pattern is one flag per layer, or a period n (layer il
    slides when il % n < n - 1, so every n-th is global; 0: all slide); `n_pattern` when absent."""
    value = f.key("{arch}.attention.sliding_window_pattern", n_pattern)
    if isinstance(value, (int, np.integer)):
        n = int(value)
        return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
    flags = tuple(bool(x) for x in value)
    if len(flags) != n_layer:
        raise ModelError(f"{f.path}: attention.sliding_window_pattern has {len(flags)} flags "
                         f"for {n_layer} layers")
    return flags


def inv_sqrt_f32(x: float) -> float:
    """1.0f / sqrtf(x) as C computes it: two float roundings (a scale such as 1/sqrt(head_dim)
    rounded once from double can differ in its last bit)."""
    return float(np.float32(1.0) / np.sqrt(np.float32(x)))


def load_qkv(f: ModelFile, il: int, n_embd: int, n_q: int, n_k: int, n_v: int) -> dict:
    """create_tensor_qkv: the fused blk.il.attn_qkv (with its bias, or Q/K/V biases, when
    present), else separate attn_q, attn_k, attn_v and their optional biases."""
    t = lambda name, ne: f.tensor(f"blk.{il}.{name}", ne)  # noqa: E731
    o = lambda name, ne: f.optional(f"blk.{il}.{name}", ne)  # noqa: E731
    biases = dict(bq=o("attn_q.bias", (n_q,)), bk=o("attn_k.bias", (n_k,)),
                  bv=o("attn_v.bias", (n_v,)))
    wqkv = o("attn_qkv.weight", (n_embd, n_q + n_k + n_v))
    if wqkv is not None:
        bqkv = o("attn_qkv.bias", (n_q + n_k + n_v,))
        return dict(wqkv=wqkv, bqkv=bqkv, **(biases if bqkv is None else {}))
    return dict(wq=t("attn_q.weight", (n_embd, n_q)), wk=t("attn_k.weight", (n_embd, n_k)),
                wv=t("attn_v.weight", (n_embd, n_v)), **biases)


class KVCache:
    """llama_kv_cache, unified and single-sequence: per layer k [n_embd_gqa, n_ctx] of type_k and
    v [n_embd_gqa, n_ctx] of type_v in a CPU backend buffer of its own, cleared to zeros as
    llama.cpp clears it. Without flash attention V is kept transposed (v_trans: element j of cell
    c at j * n_ctx + c, each stored as a row of one element); with it, cell by cell as K. A
    quantized cache whose heads are a multiple of 64 is rotated (attn_rot_k, attn_rot_v: the
    widths of the Hadamard matrices Q and K, and V, are multiplied by; 0 for none).
    The layers flagged in `swa_layers` have n_ctx_swa cells (llama_kv_cache_iswa's SWA cache;
    its other layers are the non-SWA one); `no_alloc`: a dummy buffer (a plan's, common.py)."""

    def __init__(self, hp, n_ctx: int, backend, type_k: int = GGML_TYPE_F16,
                 type_v: int = GGML_TYPE_F16, v_trans: bool = True,
                 swa_layers: tuple[bool, ...] = (), n_ctx_swa: int | None = None,
                 no_alloc: bool = False) -> None:
        G = hp.n_embd_gqa
        self.ctx = ggml_init(ggml_init_params(mem_size=(2 * hp.n_layer + 1) * ggml_tensor_overhead(),
                                              mem_buffer=None, no_alloc=True))
        self.type_k, self.type_v, self.v_trans = type_k, type_v, v_trans
        self.n_ctx, self.n_past = n_ctx, 0
        self.n_ctx_swa = n_ctx if n_ctx_swa is None else n_ctx_swa
        self.swa_layers = tuple(bool(x) for x in swa_layers) + (False,) * (hp.n_layer - len(swa_layers))
        self.head_dim, self.n_head_kv, self.n_embd_gqa = hp.head_dim, hp.n_head_kv, G
        self.attn_rot_k = rotation(type_k, hp.head_dim, k=True)
        self.attn_rot_v = rotation(type_v, hp.head_dim, k=False)
        self.k: list[Tensor] = []
        self.v: list[Tensor] = []
        for il in range(hp.n_layer):
            cells = self.n_ctx_swa if self.swa_layers[il] else n_ctx
            for name, type_, tensors in (("k", type_k, self.k), ("v", type_v, self.v)):
                t = ggml_new_tensor_2d(self.ctx, type_, G, cells)
                ggml_set_name(t, f"cache_{name}_l{il}")
                tensors.append(t)
        # the cache's buffer, cleared as llama.cpp clears it
        self.buffer = alloc_ctx_tensors(self.ctx, ggml_backend_get_default_buffer_type(backend),
                                        no_alloc, clear=True)

    def cells(self, il: int) -> int:
        """Layer il's cells: n_ctx, or n_ctx_swa for a sliding-window layer."""
        return int(self.k[il].ne[1])

    def n_kv_of(self, n_kv: int, swa: bool) -> int:
        """The cells attention reads in a cache: n_kv, at most the cache's size (the SWA cache's
        get_n_kv is its own; a reserve graph reads all of each, llama_kv_cache::init_full)."""
        return min(n_kv, self.n_ctx_swa if swa else self.n_ctx)

    def inputs(self, ctx, inputs: dict[str, Tensor], n: int, suffix: str = "") -> None:
        """attn_inp_k_idxs (the cell of each new token) and attn_inp_v_idxs (the same, or with V
        transposed the element each new value goes to), I64, as llama.cpp's build_input_k/v_idxs."""
        for name, size in (("k", n), ("v", n * self.n_embd_gqa if self.v_trans else n)):
            t = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, size)
            ggml_set_input(t)
            ggml_set_name(t, f"attn_inp_{name}_idxs{suffix}")
            inputs[f"attn_inp_{name}_idxs{suffix}"] = t

    def rotation_inputs(self, ctx, inputs: dict[str, Tensor], suffix: str = "") -> None:
        """build_input_k_rot / _v_rot: the Hadamard matrices, F32 [n, n], when the cache rotates."""
        for name, n in (("k", self.attn_rot_k), ("v", self.attn_rot_v)):
            if n:
                t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n)
                ggml_set_input(t)
                ggml_set_name(t, f"attn_inp_{name}_rot")
                inputs[f"attn_inp_{name}_rot{suffix}"] = t

    def set_inputs(self, inputs: dict[str, Tensor], n: int, n_past: int) -> None:
        cells = np.arange(n_past, n_past + n, dtype=np.int64)
        for name, t in inputs.items():
            if name.startswith("attn_inp_k_idxs"):
                set_input(t, cells)
            elif name.startswith("attn_inp_v_idxs"):
                size = self.n_ctx_swa if name.endswith("_swa") else self.n_ctx
                elements = (np.arange(self.n_embd_gqa, dtype=np.int64)[None, :] * size
                            + cells[:, None]).reshape(-1)
                set_input(t, elements if self.v_trans else cells)
            elif name.startswith(("attn_inp_k_rot", "attn_inp_v_rot")):
                set_input(t, hadamard_matrix(int(t.ne[0])))

    def store(self, ctx, gf, il: int, k, v, inputs: dict[str, Tensor], suffix: str = "") -> None:
        """cpy_k and cpy_v: the new K rows [head_dim, n_head_kv, n] into their cells of k; the new
        V rows likewise, or with V transposed its values, one element per row."""
        G, n = self.n_embd_gqa, int(k.ne[2])
        k2 = ggml_view_2d(ctx, k, G, n, int(k.nb[2]), 0)
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, self.k[il], k2,
                                                    inputs[f"attn_inp_k_idxs{suffix}"]))
        if not self.v_trans:
            v2 = ggml_view_2d(ctx, v, G, n, int(v.nb[2]), 0)
            ggml_build_forward_expand(gf, ggml_set_rows(ctx, self.v[il], v2,
                                                        inputs[f"attn_inp_v_idxs{suffix}"]))
            return
        v2 = ggml_reshape_2d(ctx, v, G, n) if ggml_is_contiguous(v) else ggml_cont_2d(ctx, v, G, n)
        v_view = ggml_reshape_2d(ctx, self.v[il], 1, G * self.cells(il))
        v1 = ggml_reshape_2d(ctx, v2, 1, G * n)
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, v_view, v1,
                                                    inputs[f"attn_inp_v_idxs{suffix}"]))

    def view(self, ctx, il: int, n_kv: int):
        """get_k and get_v: the first n_kv cells (at most the layer's), K as [head_dim, n_head_kv,
        n_kv], V likewise, or (transposed) as [n_kv, n_head_kv, head_dim]."""
        hd, G, tk, tv = self.head_dim, self.n_embd_gqa, self.type_k, self.type_v
        cells = self.cells(il)
        n_kv = min(n_kv, cells)
        k = ggml_view_3d(ctx, self.k[il], hd, self.n_head_kv, n_kv, ggml_row_size(tk, hd),
                         ggml_row_size(tk, G), 0)
        if self.v_trans:
            v = ggml_view_3d(ctx, self.v[il], n_kv, self.n_head_kv, hd,
                             ggml_row_size(tv, cells * hd), ggml_row_size(tv, cells), 0)
        else:
            v = ggml_view_3d(ctx, self.v[il], hd, self.n_head_kv, n_kv, ggml_row_size(tv, hd),
                             ggml_row_size(tv, G), 0)
        ggml_set_name(k, f"k_cache_view-{il}")
        ggml_set_name(v, f"v_cache_view-{il}")
        return k, v

    def free(self) -> None:
        ggml_backend_buffer_free(self.buffer)
        ggml_free(self.ctx)


def hadamard_matrix(n: int) -> np.ndarray:
    """ggml_gen_hadamard: the orthonormal Walsh-Hadamard matrix of size n (a power of two),
    1.0 / sqrtf(n) in its corner, grown by [[H, H], [H, -H]]."""
    h = np.full((1, 1), np.float32(1.0 / float(np.sqrt(np.float32(n)))), np.float32)
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h


class ModelParams(Protocol):
    """What a Decoder itself reads of its model's hyperparameters."""

    @property
    def n_vocab(self) -> int: ...
    @property
    def n_ctx_train(self) -> int: ...


class Memory(Protocol):
    """What a Decoder itself reads of its model's memory: the tokens it holds."""

    n_past: int


class Decoder:
    """A model with a memory of the tokens decoded (a KV cache by default): subclasses set hp
    (n_vocab, ...), cache (with n_past, the tokens it holds), n_ctx and build()."""

    hp: ModelParams  # each model's own record (DecoderParams, MambaParams ...)
    cache: Memory  # a KVCache (open_context's), or the model's own (Mamba's RecurrentState)
    file: ModelFile
    tok_embd: Tensor
    n_ctx: int
    cparams: CParams  # the settings it runs with (llama_cparams): batches, flash attention...
    tokenizer: Tokenizer | None  # None: token ids in and out
    windows: dict[str, int | None] = {"attn_inp_kq_mask": None}  # mask input -> its window
    swa_cells: int | None = None  # the sliding-window layers' cache, when smaller than n_ctx
    # llama.cpp's whole input topology, which a plan's reserve graphs need (engine/models/plan.py)
    # and decoding skips: inp_embd beside inp_tokens (build_inp_embd selects one of the two),
    # inp_out_ids (and its rows taken) even when every token is an output (build_inp_out_ids)
    full_topology = False

    def __init__(self) -> None:
        self._passes = Passes(kept=2)  # the prompt's graph and the next token's

    def open_context(self, f: ModelFile, params: ContextParams | None, n_ctx: int,
                     kv_cache: bool = True) -> None:
        """llama_init_from_model for this model: `params` resolved (its n_ctx, else the model's
        context_length), or without params the engine's own plain settings (n_ctx cells as given,
        no flash attention, an F16 cache, the whole prompt in one graph, one thread); then the KV
        cache those settings make (kv_cache=False: the model keeps another memory)."""
        if params is None:
            self.cparams = CParams.plain(n_ctx)
        else:
            head = getattr(self.hp, "head_dim", 0)
            try:
                self.cparams = params.resolve(f.arch, self.hp.n_ctx_train, head, head)
            except ParamsError as e:
                raise ModelError(f"{f.path}: {e}") from None
        self.n_ctx = self.cparams.n_ctx
        if kv_cache:  # with the sliding-window layers' cells as llama_kv_cache_iswa sizes them
            c, swa = self.cparams, getattr(self.hp, "swa_layers", ())
            n_ctx_swa = c.swa_cells(getattr(self.hp, "n_swa", 0)) if any(swa) else None
            self.cache = KVCache(self.hp, self.n_ctx, f.backend, c.type_k, c.type_v, c.v_trans,
                                 swa, n_ctx_swa, f.no_alloc)

    def graph_size(self) -> int:
        raise NotImplementedError

    def build(self, ctx, n_tokens: int, shape, all_logits: bool = True):
        """The graph for n_tokens new tokens: (graph, inputs by name, logits)."""
        raise NotImplementedError

    def embedded_tokens(self, ctx, n: int, shape, all_logits: bool):
        """A pass's graph, its inputs (build_inputs) and the new tokens' rows of the token table
        (llama.cpp's build_inp_embd: get_rows, named 'embd')."""
        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)
        inputs = self.build_inputs(ctx, n, shape, all_logits)
        return gf, inputs, self.token_rows(ctx, gf, inputs, "embd")

    def token_rows(self, ctx, gf, inputs: dict[str, Tensor], name: str) -> Tensor:
        """build_inp_embd: the token table's rows of inp_tokens, named `name`; with
        full_topology also llama.cpp's other input, inp_embd (embeddings given instead of
        tokens), and ggml_build_forward_select of the two, the rows chosen (both in the graph,
        both inputs in the compute buffer)."""
        x = ggml_get_rows(ctx, self.tok_embd, inputs["inp_tokens"])
        ggml_set_name(x, name)
        if not self.full_topology:
            return x
        embd = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, int(x.ne[0]), int(x.ne[1]))
        ggml_set_name(embd, "inp_embd")
        ggml_set_input(embd)
        inputs["inp_embd"] = embd
        return ggml_build_forward_select(gf, [x, embd], 0)

    def build_inputs(self, ctx, n: int, shape, all_logits: bool) -> dict[str, Tensor]:
        """The graph's inputs, as llama.cpp makes them: inp_tokens, the memory's (see
        memory_inputs) and, when only the last position's logits are wanted, inp_out_ids (of
        every position, with out_ids_always, when all are)."""
        inputs: dict[str, Tensor] = {}

        def new(name: str, type_: int, *ne: int) -> Tensor:
            t = (ggml_new_tensor_1d if len(ne) == 1 else ggml_new_tensor_2d)(ctx, type_, *ne)
            ggml_set_name(t, name)
            ggml_set_input(t)
            inputs[name] = t
            return t

        new("inp_tokens", GGML_TYPE_I32, n)
        self.memory_inputs(ctx, inputs, new, n, shape)
        if self.full_topology or (not all_logits and n > 1):
            new("inp_out_ids", GGML_TYPE_I32, n if all_logits else 1)
        return inputs

    def memory_inputs(self, ctx, inputs: dict[str, Tensor], new, n: int, n_kv: int) -> None:
        """A KV cache's inputs: inp_pos, where the new K and V go (one pair per cache: iswa
        models keep a sliding-window one) and the masks [n_kv, n]. A model with another memory
        (a recurrent state) overrides this, set_memory_inputs and memory_shape."""
        new("inp_pos", GGML_TYPE_I32, n)  # positions n_past .. n_past+n-1
        mask_type = GGML_TYPE_F16 if self.cparams.flash_attn else GGML_TYPE_F32
        for name in self.windows:  # a cache and its mask per window (the causal, the sliding)
            suffix = name.removeprefix("attn_inp_kq_mask")
            self.kv_cache.inputs(ctx, inputs, n, suffix)
            # 0 where a query may look, -inf elsewhere
            new(name, mask_type, self.kv_cache.n_kv_of(n_kv, suffix == "_swa"), n)
        for name in self.windows:  # the Hadamard matrices of a rotated (quantized) cache
            self.kv_cache.rotation_inputs(ctx, inputs, name.removeprefix("attn_inp_kq_mask"))

    def attend(self, ctx, gf, inputs: dict[str, Tensor], il: int, q: Tensor, k: Tensor,
               v: Tensor, n_kv: int, kq_scale: float, softcap: float = 0.0,
               swa: bool = False) -> Tensor:
        """build_attn with a KV cache (llm_graph_input_attn_kv, or _kv_iswa with a sliding-window
        cache): a quantized cache's rotations of Q and K, and of V (llama_mul_mat_hadamard); Q,
        V, K expanded in llama.cpp's order (Q, K, V with a sliding-window cache), K and V stored
        (cpy_k, cpy_v), attention over the first n_kv cells (build_attn_mha, with flash
        attention as the context says) and V's rotation undone. Returns [d * n_head, n]."""
        suffix = "_swa" if swa else ""
        k_rot, v_rot = inputs.get("attn_inp_k_rot" + suffix), inputs.get("attn_inp_v_rot" + suffix)
        if k_rot is not None:
            q, k = mul_mat_hadamard(ctx, q, k_rot), mul_mat_hadamard(ctx, k, k_rot)
        if v_rot is not None:
            v = mul_mat_hadamard(ctx, v, v_rot)
        for t in (q, k, v) if len(self.windows) > 1 else (q, v, k):
            ggml_build_forward_expand(gf, t)
        self.kv_cache.store(ctx, gf, il, k, v, inputs, suffix)
        k_all, v_all = self.kv_cache.view(ctx, il, n_kv)
        cur = attention(ctx, q, k_all, v_all, inputs["attn_inp_kq_mask" + suffix], kq_scale, il,
                        softcap, flash=self.cparams.flash_attn)
        return cur if v_rot is None else mul_mat_hadamard(ctx, cur, v_rot)

    def set_inputs(self, inputs: dict[str, Tensor], token_ids: list[int], n_past: int) -> None:
        n = len(token_ids)
        set_input(inputs["inp_tokens"], np.asarray(token_ids))
        self.set_memory_inputs(inputs, n, n_past)
        if "inp_out_ids" in inputs:  # the last ne[0] positions
            set_input(inputs["inp_out_ids"], np.arange(n - int(inputs["inp_out_ids"].ne[0]), n))

    def set_memory_inputs(self, inputs: dict[str, Tensor], n: int, n_past: int) -> None:
        set_input(inputs["inp_pos"], np.arange(n_past, n_past + n))
        self.kv_cache.set_inputs(inputs, n, n_past)
        for name, window in self.windows.items():
            n_kv = self.kv_cache.n_kv_of(self.n_kv(n_past + n), name.endswith("_swa"))
            set_input(inputs[name], causal_mask(n, n_past, window, n_kv))

    def memory_shape(self, n_past: int, n: int):
        """What besides the token count shapes the graph: for a KV cache, the cells attention
        reads (n_kv)."""
        return self.n_kv(n_past + n)

    def n_kv(self, n_used: int) -> int:
        return kv_cells(n_used, self.kv_cache.n_ctx)

    @property
    def kv_cache(self) -> KVCache:
        """The memory as the KV cache the methods above work on (a model with another memory
        overrides them)."""
        cache = self.cache
        assert isinstance(cache, KVCache), type(cache)
        return cache

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        """The prompt's token ids, BOS first when the vocabulary asks for it."""
        if self.tokenizer is None:
            model = self.file.reader.get("tokenizer.ggml.model") or "none"
            raise ModelError(f"{self.file.path}: its tokenizer ('{model}') is not built here, "
                             "only SentencePiece ('llama'), BPE ('gpt2', 'gemma4') and WordPiece "
                             "('bert'); give the prompt as token ids")
        return self.tokenizer.encode(text, True, parse_special)

    def end_of_generation(self) -> set[int]:
        """llama_vocab_is_eog's tokens: EOS, EOT and EOM by their keys, and the end-of-turn
        tokens llama.cpp recognises by their text (Gemma's <end_of_turn>, ChatML's <|im_end|>)."""
        key = self.file.reader.get
        ids = {key(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot", "eom")}
        if self.tokenizer is not None:
            ids |= {self.tokenizer.ids[t] for t in END_OF_TURN if t in self.tokenizer.ids}
        return {int(i) for i in ids if i is not None}

    def reset(self) -> None:
        """Forget the cached tokens (llama_memory_clear)."""
        self.cache.n_past = 0

    def close(self) -> None:
        """llama_free and llama_model_free: the kept graphs' compute buffers, the cache's buffer
        and the weights' buffers freed (a buffer lives until it is freed, as in ggml)."""
        self._passes.clear()
        cache = getattr(self, "cache", None)
        if cache is not None:
            cache.free()
            del self.cache  # (a closed model holds no memory)
        self.file.close()

    def decode(self, token_ids: list[int], n_threads: int | None = None,
               all_logits: bool = True) -> Decoded:
        """Run the new tokens through the model after what the cache holds; their logits (every
        position's, or the last one's). As llama.cpp runs a prompt: in batches of n_batch, each
        split into ubatches of n_ubatch tokens, one graph each (cparams); on n_threads threads
        (None: the context's)."""
        ids = [int(i) for i in token_ids]
        n_past = self.cache.n_past
        if not ids:
            raise ModelError("nothing to decode: no tokens")
        if any(not 0 <= i < self.hp.n_vocab for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.hp.n_vocab})")
        if n_past + len(ids) > self.n_ctx:
            raise ModelError(f"{n_past} cached + {len(ids)} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        if self.swa_cells is not None and n_past + len(ids) > self.swa_cells:
            raise ModelError(f"{n_past} cached + {len(ids)} new tokens overflow the "
                             f"sliding-window layers' cache of {self.swa_cells} cells (swa_full "
                             "off): llama.cpp would reuse its cells, which is not built here; "
                             "use swa_full")
        n_threads = self.cparams.n_threads if n_threads is None else n_threads
        ubatches = self.cparams.batches(len(ids))
        rows, seconds = [], 0.0
        for a, b in ubatches:
            last = b == len(ids)
            n_past = self.cache.n_past
            p = self._pass(b - a, self.memory_shape(n_past, b - a), all_logits)
            self.set_inputs(p.inputs, ids[a:b], n_past)
            t0 = time.perf_counter()
            p.compute(n_threads, self.cparams.tiled)
            seconds += time.perf_counter() - t0
            if all_logits or last:  # (an earlier ubatch's last logits are nobody's)
                rows.append(get_output(p.out).reshape(-1, self.hp.n_vocab))
            self.cache.n_past += b - a
        return Decoded(ids, rows[0] if len(rows) == 1 else np.concatenate(rows), seconds)

    def _pass(self, n: int, shape, all_logits: bool) -> Pass:
        """The graph for n tokens over the memory's shape (n_kv cells of a KV cache): built and
        allocated once (the graph allocator's plan in a compute buffer), then reused while the
        shape stays, as llama.cpp reuses its graphs."""
        return self._passes.get((n, shape, all_logits), self.file.backend, self.graph_size(),
                                lambda ctx: self.build(ctx, n, shape, all_logits))

    def stream(self, prompt: list[int], n_new: int, n_threads: int | None = None,
               pick: Callable[[np.ndarray], int] | None = None,
               stop: set[int] | None = None) -> Iterator[int]:
        """Decode the prompt, then yield n_new tokens, each chosen by `pick` from the last
        logits (the most likely by default) and fed back (one token per graph)."""
        self.reset()
        if len(prompt) + n_new > self.n_ctx + 1:
            raise ModelError(f"{len(prompt)} prompt + {n_new} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        pick = pick or (lambda logits: int(np.argmax(logits)))
        logits = self.decode(prompt, n_threads, all_logits=False).logits[-1]
        for k in range(n_new):
            token = pick(logits)
            yield token
            if stop and token in stop:
                return
            if k + 1 < n_new:
                logits = self.decode([token], n_threads, all_logits=False).logits[-1]

    def generate(self, prompt: list[int], n_new: int, n_threads: int | None = None) -> list[int]:
        """Greedy generation: the n_new most likely tokens, one after another."""
        return list(self.stream(prompt, n_new, n_threads))
