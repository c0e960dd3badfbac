"""LLaMA: next-token logits with a KV cache, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `llama` architecture (src/models/llama.cpp) with its tensor and key names: per
layer an RMS norm, Q/K/V projections, rope (normal mode) on Q and K, K and V stored into the KV
cache, grouped-query attention over everything cached so far (a causal mask, 1/sqrt(head_dim)),
the output projection and residual; an RMS norm and a SwiGLU feed-forward (silu(gate)·up, down)
and residual; then the final RMS norm and the output head. The KV cache is one F16 K and one F16 V
tensor per layer in its own context (llama.cpp's default cache types); V is kept transposed, and
new rows are written with ggml_cpy into ggml_view's of the cache — the way llama.cpp did before
it switched to ggml_set_rows (same bytes, same results).
Leaves out: flash attention, MoE layers, rope scaling other than linear, several sequences,
samplers other than greedy.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

import numpy as np

from engine.ggml import (GGML_TYPE_F16, GGML_TYPE_F32, GGML_TYPE_I32, Tensor, ggml_add,
                         ggml_build_forward_expand, ggml_cpy, ggml_free, ggml_get_rows,
                         ggml_graph_compute_with_ctx, ggml_init, ggml_init_params, ggml_mul,
                         ggml_mul_mat, ggml_new_graph_custom, ggml_new_tensor_1d,
                         ggml_new_tensor_2d, ggml_reshape_2d, ggml_reshape_3d, ggml_rms_norm,
                         ggml_rope_ext, ggml_row_size, ggml_set_input, ggml_set_name,
                         ggml_set_output, ggml_swiglu_split, ggml_tensor_overhead,
                         ggml_transpose, ggml_view_1d, ggml_view_2d, ggml_view_3d, set_data,
                         to_numpy)

from .bert import _name, attention
from .common import ModelError, ModelFile, compute_context, measure

LLAMA_ROPE_TYPE_NORM = 0  # rope on consecutive pairs (x0, x1), (x2, x3), ...


@dataclass(frozen=True, slots=True)
class LlamaParams:
    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int  # fewer than n_head: grouped-query attention
    n_rot: int  # rope dimensions (= head_dim)
    rms_eps: float
    freq_base: float
    freq_scale: float  # 1 / rope.scaling.factor (linear scaling)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def n_embd_gqa(self) -> int:  # K or V width of one token: head_dim * n_head_kv
        return self.head_dim * self.n_head_kv


class KVCache:
    """llama_kv_cache, unified and single-sequence: per layer k [n_embd_gqa * n_ctx] and
    v [n_embd_gqa * n_ctx] (V transposed: row j holds element j of every cell), F16."""

    def __init__(self, hp: LlamaParams, n_ctx: int, type_: int = GGML_TYPE_F16) -> None:
        n = hp.n_embd_gqa * n_ctx
        row = ggml_row_size(type_, n)
        self.ctx = ggml_init(ggml_init_params(
            mem_size=2 * hp.n_layer * (ggml_tensor_overhead() + row), mem_buffer=None,
            no_alloc=False))
        self.type, self.n_ctx, self.n_past = type_, n_ctx, 0
        self.k, self.v = [], []
        for il in range(hp.n_layer):
            k = ggml_new_tensor_1d(self.ctx, type_, n)
            v = ggml_new_tensor_1d(self.ctx, type_, n)
            ggml_set_name(k, f"cache_k_l{il}")
            ggml_set_name(v, f"cache_v_l{il}")
            set_data(k, np.zeros(n, np.float32))  # llama.cpp clears the cache buffer
            set_data(v, np.zeros(n, np.float32))
            self.k.append(k)
            self.v.append(v)

    def free(self) -> None:
        ggml_free(self.ctx)


@dataclass(frozen=True, slots=True)
class Decoded:
    token_ids: list[int]
    logits: np.ndarray  # [n_outputs, n_vocab]: every position, or only the last
    seconds: float


class Llama:
    """A LLaMA GGUF opened for decoding: hyperparameters, weights, KV cache, graph builder."""

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None) -> None:
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != "llama":
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not 'llama'")
        self.file = f
        shared = f.transformer_params()
        n_embd, n_head = shared["n_embd"], shared["n_head"]
        scaling = f.key("{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ModelError(f"{f.path}: rope scaling '{scaling}' is not supported")
        self.hp = hp = LlamaParams(
            **shared,
            n_rot=int(f.key("{arch}.rope.dimension_count", n_embd // n_head)),
            rms_eps=float(f.key("{arch}.attention.layer_norm_rms_epsilon")),
            freq_base=float(f.key("{arch}.rope.freq_base", 10000.0)),
            freq_scale=1.0 / float(f.key("{arch}.rope.scaling.factor", 1.0)),
        )
        if hp.n_rot != hp.head_dim:
            raise ModelError(f"{f.path}: rope.dimension_count {hp.n_rot} must equal the head "
                             f"size {hp.head_dim}")
        if hp.n_head % hp.n_head_kv:
            raise ModelError(f"{f.path}: head_count {hp.n_head} is not a multiple of "
                             f"head_count_kv {hp.n_head_kv}")
        E, G = n_embd, hp.n_embd_gqa
        self.tok_embd = f.tensor("token_embd.weight", (E, hp.n_vocab))
        self.output_norm = f.tensor("output_norm.weight", (E,))
        # tied embeddings: without output.weight the token table is the head too
        self.output = f.optional("output.weight", (E, hp.n_vocab)) or self.tok_embd
        self.rope_freqs = f.optional("rope_freqs.weight", (hp.n_rot // 2,))
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                wq=t("attn_q.weight", (E, E)), wk=t("attn_k.weight", (E, G)),
                wv=t("attn_v.weight", (E, G)), wo=t("attn_output.weight", (E, E)),
                bo=f.optional(f"blk.{i}.attn_output.bias", (E,)),
                ffn_norm=t("ffn_norm.weight", (E,)),
                ffn_gate=t("ffn_gate.weight", (E, hp.n_ff)),
                ffn_up=t("ffn_up.weight", (E, hp.n_ff)),
                ffn_down=t("ffn_down.weight", (hp.n_ff, E)),
            ))
        self.n_ctx = min(n_ctx or hp.n_ctx_train, hp.n_ctx_train)
        self.cache = KVCache(hp, self.n_ctx)
        self._mem: dict[tuple, int] = {}

    # --- the graph ----------------------------------------------------------------------------

    def graph_size(self) -> int:
        return 64 + 40 * self.hp.n_layer

    def build(self, ctx, n_tokens: int, n_past: int, all_logits: bool = True):
        """The graph for n_tokens new tokens after n_past cached ones: returns the graph, the
        input tensors by name and the logits tensor ([n_vocab, n_outputs])."""
        hp, cache, n = self.hp, self.cache, n_tokens
        n_kv = n_past + n  # cells the attention looks at
        hd, G = hp.head_dim, hp.n_embd_gqa
        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)

        inp_tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(inp_tokens, "inp_tokens")
        ggml_set_input(inp_tokens)
        inp_pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)  # positions n_past .. n_past+n-1
        ggml_set_name(inp_pos, "inp_pos")
        ggml_set_input(inp_pos)
        kq_mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_kv, n)  # causal: -inf after the query
        ggml_set_name(kq_mask, "attn_inp_kq_mask")
        ggml_set_input(kq_mask)
        inputs = {"inp_tokens": inp_tokens, "inp_pos": inp_pos, "attn_inp_kq_mask": kq_mask}
        inp_out_ids = None
        if not all_logits and n > 1:  # only the last position's logits are wanted
            inp_out_ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1)
            ggml_set_name(inp_out_ids, "inp_out_ids")
            ggml_set_input(inp_out_ids)
            inputs["inp_out_ids"] = inp_out_ids

        x = ggml_get_rows(ctx, self.tok_embd, inp_tokens)  # [E, n]
        ggml_set_name(x, "inp_embd")
        kq_scale = 1.0 / math.sqrt(hd)
        rope = dict(n_dims=hp.n_rot, mode=LLAMA_ROPE_TYPE_NORM, n_ctx_orig=hp.n_ctx_train,
                    freq_base=hp.freq_base, freq_scale=hp.freq_scale, ext_factor=0.0,
                    attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
        for il, L in enumerate(self.layers):
            inp_sa = x
            cur = _name(ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), L["attn_norm"]),
                        "attn_norm", il)
            q = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L["wq"], cur), hd, hp.n_head, n)
            k = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L["wk"], cur), hd, hp.n_head_kv, n)
            v = ggml_reshape_3d(ctx, ggml_mul_mat(ctx, L["wv"], cur), hd, hp.n_head_kv, n)
            q = _name(ggml_rope_ext(ctx, q, inp_pos, self.rope_freqs, **rope), "Qcur", il)
            k = _name(ggml_rope_ext(ctx, k, inp_pos, self.rope_freqs, **rope), "Kcur", il)
            _name(v, "Vcur", il)
            ggml_build_forward_expand(gf, q)  # llama.cpp's order: q, v, k, then the stores
            ggml_build_forward_expand(gf, v)
            ggml_build_forward_expand(gf, k)

            # store: K rows n_past.. of the cache; V columns n_past.. of the transposed cache
            k_dst = ggml_view_1d(ctx, cache.k[il], n * G, ggml_row_size(cache.type, G) * n_past)
            ggml_build_forward_expand(gf, _name(ggml_cpy(ctx, k, k_dst), "k_cache_store", il))
            v_dst = ggml_view_2d(ctx, cache.v[il], n, G, ggml_row_size(cache.type, cache.n_ctx),
                                 ggml_row_size(cache.type, n_past))
            v_src = ggml_transpose(ctx, ggml_reshape_2d(ctx, v, G, n))  # [n, G]
            ggml_build_forward_expand(gf, _name(ggml_cpy(ctx, v_src, v_dst), "v_cache_store", il))

            # read: everything cached so far, K as [hd, n_head_kv, n_kv], V as [n_kv, ...]
            k_all = ggml_view_3d(ctx, cache.k[il], hd, hp.n_head_kv, n_kv,
                                 ggml_row_size(cache.type, hd), ggml_row_size(cache.type, G), 0)
            v_all = ggml_view_3d(ctx, cache.v[il], n_kv, hp.n_head_kv, hd,
                                 ggml_row_size(cache.type, cache.n_ctx * hd),
                                 ggml_row_size(cache.type, cache.n_ctx), 0)
            _name(k_all, "k_cache_view", il), _name(v_all, "v_cache_view", il)
            cur = attention(ctx, q, k_all, v_all, kq_mask, kq_scale, il)
            cur = ggml_mul_mat(ctx, L["wo"], cur)
            if L["bo"] is not None:
                cur = ggml_add(ctx, cur, L["bo"])
            _name(cur, "attn_out", il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                inp_sa = ggml_get_rows(ctx, inp_sa, inp_out_ids)
            ffn_inp = _name(ggml_add(ctx, cur, inp_sa), "ffn_inp", il)
            cur = _name(ggml_mul(ctx, ggml_rms_norm(ctx, ffn_inp, hp.rms_eps), L["ffn_norm"]),
                        "ffn_norm", il)
            up = _name(ggml_mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)
            gate = _name(ggml_mul_mat(ctx, L["ffn_gate"], cur), "ffn_gate", il)
            cur = _name(ggml_swiglu_split(ctx, gate, up), "ffn_swiglu", il)  # silu(gate) * up
            cur = _name(ggml_mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)
            x = _name(ggml_add(ctx, cur, ffn_inp), "l_out", il)

        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), self.output_norm)
        ggml_set_name(x, "result_norm")
        logits = ggml_mul_mat(ctx, self.output, x)  # [n_vocab, n_outputs]
        ggml_set_name(logits, "result_output")
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits

    def set_inputs(self, inputs: dict[str, Tensor], token_ids: list[int], n_past: int) -> None:
        n = len(token_ids)
        set_data(inputs["inp_tokens"], np.asarray(token_ids, dtype=np.int32))
        set_data(inputs["inp_pos"], np.arange(n_past, n_past + n, dtype=np.int32))
        mask = np.zeros((n, n_past + n), dtype=np.float32)  # [q, kv] in numpy order
        for q in range(n):
            mask[q, n_past + q + 1:] = -np.inf  # a token sees itself and what came before
        set_data(inputs["attn_inp_kq_mask"], mask)
        if "inp_out_ids" in inputs:
            set_data(inputs["inp_out_ids"], np.array([n - 1], dtype=np.int32))

    # --- running ------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the cached tokens (llama_memory_clear)."""
        self.cache.n_past = 0

    def decode(self, token_ids: list[int], n_threads: int = 1, all_logits: bool = True) -> Decoded:
        """Run the new tokens through the model after what the cache holds; their logits."""
        ids = [int(i) for i in token_ids]
        n_past = self.cache.n_past
        if not ids:
            raise ModelError("nothing to decode: no tokens")
        if any(not 0 <= i < self.hp.n_vocab for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.hp.n_vocab})")
        if n_past + len(ids) > self.n_ctx:
            raise ModelError(f"{n_past} cached + {len(ids)} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        key = (len(ids), n_past, all_logits, n_threads)
        if key not in self._mem:
            self._mem[key] = measure(lambda c: self.build(c, len(ids), n_past, all_logits)[0],
                                     self.graph_size(), n_threads)
        ctx = compute_context(self._mem[key])
        try:
            gf, inputs, logits = self.build(ctx, len(ids), n_past, all_logits)
            self.set_inputs(inputs, ids, n_past)
            t0 = time.perf_counter()
            ggml_graph_compute_with_ctx(ctx, gf, n_threads)
            seconds = time.perf_counter() - t0
            out = np.array(to_numpy(logits), dtype=np.float32).reshape(-1, self.hp.n_vocab)
        finally:
            ggml_free(ctx)
        self.cache.n_past += len(ids)
        return Decoded(ids, out, seconds)

    def generate(self, prompt: list[int], n_new: int, n_threads: int = 1) -> list[int]:
        """Greedy generation: decode the prompt, then feed back the most likely token n_new
        times (one token per graph, the cache growing by one cell each time)."""
        self.reset()
        if len(prompt) + n_new > self.n_ctx + 1:
            raise ModelError(f"{len(prompt)} prompt + {n_new} new tokens do not fit this "
                             f"model's context of {self.n_ctx} tokens")
        out: list[int] = []
        logits = self.decode(prompt, n_threads, all_logits=False).logits[-1]
        for k in range(n_new):
            out.append(int(np.argmax(logits)))
            if k + 1 < n_new:
                logits = self.decode([out[-1]], n_threads, all_logits=False).logits[-1]
        return out

