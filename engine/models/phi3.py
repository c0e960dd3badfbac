"""Phi-3: next-token logits with a KV cache, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `phi3` architecture (src/models/phi3.cpp) with its tensor, key and node
names: per layer an RMS norm, Q/K/V from one fused attn_qkv product (three views of it; separate
attn_q/k/v when the file has those instead), rope in NeoX mode (pairs (x_i, x_{i+d/2})) with the
per-dimension frequency factors rope_factors_long or rope_factors_short when the file has them
(long when the context, padded to 256 cells as llama.cpp pads it, exceeds
rope.scaling.original_context_length) and rope.scaling.attn_factor, Q scaled by 1/sqrt(head_dim),
grouped-query attention through the KV cache under a causal mask, the output projection and the
residual; an RMS norm, a SwiGLU feed-forward whose ffn_up holds gate and up as its two halves
(silu(first half) · second half, then ffn_down) and the residual; the final RMS norm and the
output head (the token embeddings when the file has no output.weight).
With ContextParams (engine/models/params.py): flash attention, a quantized cache, ubatches.
Leaves out: the MoE layers (Phi-3.5-MoE is `phimoe` anyway), YaRN rope scaling,
several sequences. A sliding window the file names is ignored, as llama.cpp ignores it for phi3.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from engine.ggml import (GGML_ROPE_TYPE_NEOX, ggml_add, ggml_build_forward_expand,
                         ggml_get_rows, ggml_mul_mat, ggml_rope_ext,
                         ggml_scale, ggml_set_name, ggml_set_output, ggml_swiglu)

from .common import ModelError, ModelFile
from .decoder import KV_PAD, Decoder, KVCache, inv_sqrt_f32, load_qkv
from .llm_graph import build_qkv, named, rms_norm
from .llama import LlamaParams
from .params import ContextParams
from .tokenize import tokenizer_of


@dataclass(frozen=True, slots=True)
class Phi3Params(LlamaParams):
    n_ctx_orig: int  # rope.scaling.original_context_length (context_length when absent)
    attn_factor: float  # rope.scaling.attn_factor: rope's magnitude scale


class Phi3(Decoder):
    """A Phi-3 GGUF opened for decoding: hyperparameters, weights, KV cache, graph builder."""

    hp: Phi3Params
    cache: KVCache

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None,
                 params: ContextParams | None = None) -> None:
        super().__init__()
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != "phi3":
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not 'phi3'")
        self.file = f
        shared = f.transformer_params()
        head_dim = shared["n_embd"] // shared["n_head"]
        scaling = f.key("{arch}.rope.scaling.type", "linear")
        if scaling not in ("none", "linear", "longrope"):
            raise ModelError(f"{f.path}: rope scaling '{scaling}' is not supported")
        self.hp = hp = Phi3Params(
            **shared, head_dim=head_dim,
            n_rot=int(f.key("{arch}.rope.dimension_count", head_dim)),
            rms_eps=float(f.key("{arch}.attention.layer_norm_rms_epsilon")),
            freq_base=float(f.key("{arch}.rope.freq_base", 10000.0)),
            freq_scale=(1.0 if scaling == "none"
                        else 1.0 / float(f.key("{arch}.rope.scaling.factor", 1.0))),
            n_ctx_orig=int(f.key("{arch}.rope.scaling.original_context_length",
                                 shared["n_ctx_train"])),
            attn_factor=float(f.key("{arch}.rope.scaling.attn_factor", 1.0)))
        if hp.n_rot != head_dim:
            raise ModelError(f"{f.path}: rope.dimension_count {hp.n_rot} must equal the head "
                             f"size {head_dim}")
        if hp.n_head % hp.n_head_kv:
            raise ModelError(f"{f.path}: head_count {hp.n_head} is not a multiple of "
                             f"head_count_kv {hp.n_head_kv}")
        E, G = hp.n_embd, hp.n_embd_gqa
        # tied embeddings: without output.weight the token table is the head too
        self.tok_embd, self.output_norm, self.output = f.token_table_and_head(E, hp.n_vocab)
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                **load_qkv(f, i, E, E, G, G),
                wo=t("attn_output.weight", (E, E)),
                ffn_norm=t("ffn_norm.weight", (E,)),
                ffn_up=t("ffn_up.weight", (E, 2 * hp.n_ff)),  # gate, then up
                ffn_down=t("ffn_down.weight", (hp.n_ff, E)),
            ))
        if params is not None and n_ctx is not None:
            params = params.with_(n_ctx=n_ctx)
        self.open_context(f, params, min(n_ctx or hp.n_ctx_train, hp.n_ctx_train))
        # llama_model::get_rope_factors: long ones when the context (llama.cpp's n_ctx_seq,
        # padded to 256) exceeds the original one
        n_ctx_seq = -(-self.n_ctx // KV_PAD) * KV_PAD
        which = "long" if n_ctx_seq > hp.n_ctx_orig else "short"
        self.rope_factors = f.optional(f"rope_factors_{which}.weight", (hp.n_rot // 2,))
        self.tokenizer = tokenizer_of(f)

    def graph_size(self) -> int:
        return 64 + 48 * self.hp.n_layer

    def build(self, ctx, n_tokens: int, n_kv: int, all_logits: bool = True):
        """The graph for n_tokens new tokens attending to n_kv cache cells: returns the graph,
        the input tensors by name and the logits tensor ([n_vocab, n_outputs])."""
        hp, n, eps = self.hp, n_tokens, self.hp.rms_eps
        hd = hp.head_dim
        gf, inputs, x = self.embedded_tokens(ctx, n, n_kv, all_logits)  # x: [E, n]
        inp_pos, inp_out_ids = inputs["inp_pos"], inputs.get("inp_out_ids")
        rope: dict[str, Any] = dict(n_dims=hp.n_rot, mode=GGML_ROPE_TYPE_NEOX, n_ctx_orig=hp.n_ctx_orig,
                                    freq_base=hp.freq_base, freq_scale=hp.freq_scale, ext_factor=0.0,
                                    attn_factor=hp.attn_factor, beta_fast=32.0, beta_slow=1.0)
        for il, L in enumerate(self.layers):
            residual = x
            cur = rms_norm(ctx, x, L["attn_norm"], eps, "attn_norm", il)
            q, k, v = build_qkv(ctx, L, cur, hd, hp.n_head, hp.n_head_kv, il)
            q = named(ggml_rope_ext(ctx, q, inp_pos, self.rope_factors, **rope), "Qcur", il)
            k = named(ggml_rope_ext(ctx, k, inp_pos, self.rope_factors, **rope), "Kcur", il)
            q = named(ggml_scale(ctx, q, inv_sqrt_f32(hd)), "Qcur", il)
            cur = self.attend(ctx, gf, inputs, il, q, k, v, n_kv, 1.0)
            cur = ggml_mul_mat(ctx, L["wo"], cur)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                residual = ggml_get_rows(ctx, residual, inp_out_ids)
            residual = ggml_add(ctx, cur, residual)  # unnamed in llama.cpp too
            cur = rms_norm(ctx, residual, L["ffn_norm"], eps, "ffn_norm", il)
            up = named(ggml_mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)  # [2 n_ff, n]
            cur = named(ggml_swiglu(ctx, up), "ffn_swiglu", il)  # silu(gate half) * up half
            cur = named(ggml_mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)
            x = named(ggml_add(ctx, residual, cur), "l_out", il)

        x = rms_norm(ctx, x, self.output_norm, eps, "result_norm", -1)
        logits = ggml_mul_mat(ctx, self.output, x)  # [n_vocab, n_outputs]
        ggml_set_name(logits, "result_output")
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits
