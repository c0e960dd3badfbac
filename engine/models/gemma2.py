"""Gemma 2: next-token logits with a KV cache, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `gemma2` architecture (src/models/gemma2.cpp) with its tensor, key and node
names: the token embeddings scaled by sqrt(n_embd); per layer an RMS norm, Q/K/V projections
(fused attn_qkv or separate), rope in NeoX mode (pairs (x_i, x_{i+d/2})), Q scaled by
1/sqrt(attention.key_length) (1/sqrt(n_embd / n_head) for the 27B model, as llama.cpp decides by
its 46 layers), attention through the KV cache with its logits soft-capped
(softcap · tanh(KQ / softcap), attn_logit_softcapping, 50 by default) under a causal mask, on
alternate layers (0, 2, 4, ...; attention.sliding_window_pattern otherwise) also blind to keys
`sliding_window` (4096 by default) or more positions back; the output projection, an RMS norm of
the attention's output (post_attention_norm) and the residual; an RMS norm, a GELU-gated
feed-forward (gelu(gate)·up, down), an RMS norm of its output (post_ffw_norm) and the residual;
the final RMS norm, the output head (always the token embeddings: llama.cpp reads no
output.weight for Gemma 2) and the final logit soft-capping (final_logit_softcapping, 30 by
default).

`Gemma2` is also the frame of Gemma 3 (engine/models/gemma3.py), whose graph differs by a few
switches (class attributes below).
With ContextParams (engine/models/params.py) it runs as llama.cpp runs it with those settings:
flash attention, a quantized cache, batches split into ubatches (decoder.py).
Leaves out: the separate small cache llama.cpp keeps for sliding-window layers when swa_full is
off (here every layer caches all positions, the window is in the mask: the same as llama.cpp's
while the context fits the window plus a ubatch), several sequences.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ggml import (GGML_ROPE_TYPE_NEOX, ggml_add, ggml_build_forward_expand,
                         ggml_geglu_split, ggml_get_rows, ggml_mul_mat, ggml_rope_ext,
                         ggml_scale, ggml_set_name, ggml_set_output, ggml_tanh)

from .common import ModelError, ModelFile
from .decoder import Decoder, DecoderParams, KVCache, inv_sqrt_f32, load_qkv, swa_layers
from .llm_graph import build_qkv, named, rms_norm
from .params import ContextParams
from .tokenize import tokenizer_of


@dataclass(frozen=True, slots=True)
class GemmaParams(DecoderParams):  # head_dim: key_length; freq_base: the global layers'
    freq_base_swa: float  # the sliding-window layers'
    n_swa: int  # the window, in positions (0: no sliding window)
    swa_layers: tuple[bool, ...]
    q_scale: float  # f_attention_scale: Q's scale before attention
    attn_softcap: float  # attn_logit_softcapping (0: none)
    final_softcap: float  # final_logit_softcapping (0: none)


class Gemma2(Decoder):
    """A Gemma 2 GGUF opened for decoding: hyperparameters, tokenizer, weights, KV cache."""

    hp: GemmaParams
    cache: KVCache
    ARCH = "gemma2"
    N_SWA = 4096  # attention.sliding_window when the file has none (0: no sliding window)
    SWA_PATTERN = 2  # every 2nd layer is global (1, 3, 5, ...)
    FREQ_BASE_SWA: float | None = None  # rope.freq_base_swa's default (None: rope.freq_base)
    ATTN_SOFTCAP: float | None = 50.0  # attn_logit_softcapping's default (None: never capped)
    FINAL_SOFTCAP = 30.0  # final_logit_softcapping's default
    N_LAYER_27B = 46  # the 27B model's layers: Q scaled by 1/sqrt(n_embd / n_head)
    QK_NORM = False  # an RMS norm of each Q and K head before rope
    OUTPUT_WEIGHT = False  # output.weight read when the file has it (else the token embeddings)
    LAYER_OF_POST_FFW = False  # the post-FFW norm's node named with its layer (gemma2.cpp: not)

    windows = {"attn_inp_kq_mask": None}  # set per model below: the sliding window's mask too

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None,
                 params: ContextParams | None = None) -> None:
        super().__init__()
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != self.ARCH:
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not '{self.ARCH}'")
        self.file = f
        shared = f.transformer_params()
        n_layer = shared["n_layer"]
        n_swa = int(f.key("{arch}.attention.sliding_window", self.N_SWA))
        swa = swa_layers(f, n_layer, self.SWA_PATTERN) if n_swa > 0 else (False,) * n_layer
        head_dim = int(f.key("{arch}.attention.key_length", shared["n_embd"] // shared["n_head"]))
        if int(f.key("{arch}.attention.value_length", head_dim)) != head_dim:
            raise ModelError(f"{f.path}: key_length and value_length must be equal")
        if int(f.key("{arch}.rope.dimension_count", head_dim)) != head_dim:
            raise ModelError(f"{f.path}: rope.dimension_count must equal key_length {head_dim}")
        freq_base = float(f.key("{arch}.rope.freq_base", 10000.0))
        big = n_layer == self.N_LAYER_27B
        self.hp = hp = GemmaParams(
            **shared, head_dim=head_dim,
            rms_eps=float(f.key("{arch}.attention.layer_norm_rms_epsilon")),
            freq_base=freq_base,
            freq_base_swa=float(f.key("{arch}.rope.freq_base_swa",
                                      self.FREQ_BASE_SWA or freq_base)),
            n_swa=n_swa, swa_layers=swa,
            q_scale=inv_sqrt_f32(shared["n_embd"] // shared["n_head"] if big else head_dim),
            attn_softcap=(0.0 if self.ATTN_SOFTCAP is None else
                          float(f.key("{arch}.attn_logit_softcapping", self.ATTN_SOFTCAP))),
            final_softcap=float(f.key("{arch}.final_logit_softcapping", self.FINAL_SOFTCAP)))
        if hp.n_head % hp.n_head_kv:
            raise ModelError(f"{f.path}: head_count {hp.n_head} is not a multiple of "
                             f"head_count_kv {hp.n_head_kv}")
        E, Q, G = hp.n_embd, hp.head_dim * hp.n_head, hp.n_embd_gqa
        self.tok_embd, self.output_norm, self.output = f.token_table_and_head(
            E, hp.n_vocab, tied=not self.OUTPUT_WEIGHT)
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            qk_norms = dict(q_norm=t("attn_q_norm.weight", (hp.head_dim,)),
                            k_norm=t("attn_k_norm.weight", (hp.head_dim,))) if self.QK_NORM else {}
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                **load_qkv(f, i, E, Q, G, G), **qk_norms,
                wo=t("attn_output.weight", (Q, E)),
                attn_post_norm=t("post_attention_norm.weight", (E,)),
                ffn_norm=t("ffn_norm.weight", (E,)),
                ffn_gate=t("ffn_gate.weight", (E, hp.n_ff)),
                ffn_up=t("ffn_up.weight", (E, hp.n_ff)),
                ffn_down=t("ffn_down.weight", (hp.n_ff, E)),
                ffn_post_norm=t("post_ffw_norm.weight", (E,)),
            ))
        self.tokenizer = tokenizer_of(f)
        if params is not None and n_ctx is not None:
            params = params.with_(n_ctx=n_ctx)
        self.open_context(f, params, min(n_ctx or 4096, hp.n_ctx_train))
        if any(swa):
            self.windows = {"attn_inp_kq_mask": None, "attn_inp_kq_mask_swa": hp.n_swa}
            if self.cparams.swa_cells(hp.n_swa) < self.n_ctx:
                self.swa_cells = self.cparams.swa_cells(hp.n_swa)

    def graph_size(self) -> int:
        return 64 + 72 * self.hp.n_layer

    def build(self, ctx, n_tokens: int, n_kv: int, all_logits: bool = True):
        """The graph for n_tokens new tokens attending to n_kv cache cells: returns the graph,
        the input tensors by name and the logits tensor ([n_vocab, n_outputs])."""
        hp, n, eps = self.hp, n_tokens, self.hp.rms_eps
        hd = hp.head_dim
        gf, inputs, x = self.embedded_tokens(ctx, n, n_kv, all_logits)  # x: [E, n]
        inp_pos, inp_out_ids = inputs["inp_pos"], inputs.get("inp_out_ids")
        x = named(ggml_scale(ctx, x, float(np.sqrt(np.float32(hp.n_embd)))), "inp_scaled", -1)

        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            rope: dict[str, Any] = dict(n_dims=hd, mode=GGML_ROPE_TYPE_NEOX, n_ctx_orig=hp.n_ctx_train,
                                        freq_base=hp.freq_base_swa if swa else hp.freq_base, freq_scale=1.0,
                                        ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
            cur = rms_norm(ctx, x, L["attn_norm"], eps, "attn_norm", il)
            q, k, v = build_qkv(ctx, L, cur, hd, hp.n_head, hp.n_head_kv, il)
            if self.QK_NORM:
                q = rms_norm(ctx, q, L["q_norm"], eps, "Qcur_normed", il)
            q = named(ggml_rope_ext(ctx, q, inp_pos, None, **rope), "Qcur", il)
            if self.QK_NORM:
                k = rms_norm(ctx, k, L["k_norm"], eps, "Kcur_normed", il)
            k = named(ggml_rope_ext(ctx, k, inp_pos, None, **rope), "Kcur", il)
            q = ggml_scale(ctx, q, hp.q_scale)
            cur = self.attend(ctx, gf, inputs, il, q, k, v, n_kv, 1.0, hp.attn_softcap, swa)
            cur = ggml_mul_mat(ctx, L["wo"], cur)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                x = ggml_get_rows(ctx, x, inp_out_ids)
            cur = rms_norm(ctx, cur, L["attn_post_norm"], eps, "attn_post_norm", il)
            sa_out = named(ggml_add(ctx, cur, x), "sa_out", il)
            cur = rms_norm(ctx, sa_out, L["ffn_norm"], eps, "ffn_norm", il)
            up = named(ggml_mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)
            gate = named(ggml_mul_mat(ctx, L["ffn_gate"], cur), "ffn_gate", il)
            cur = named(ggml_geglu_split(ctx, gate, up), "ffn_geglu", il)  # gelu(gate) * up
            cur = named(ggml_mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)
            cur = rms_norm(ctx, cur, L["ffn_post_norm"], eps, "ffn_post_norm",
                           il if self.LAYER_OF_POST_FFW else -1)
            x = named(ggml_add(ctx, cur, sa_out), "l_out", il)

        x = rms_norm(ctx, x, self.output_norm, eps, "result_norm", -1)
        logits = ggml_mul_mat(ctx, self.output, x)  # [n_vocab, n_outputs]
        if hp.final_softcap:
            logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits,
                                                                1.0 / hp.final_softcap)),
                                hp.final_softcap)
        ggml_set_name(logits, "result_output")
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits
