"""Gemma 3: next-token logits with a KV cache, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `gemma3` architecture (src/models/gemma3.cpp) with its tensor and key names:
the token embeddings scaled by sqrt(n_embd); per layer an RMS norm, Q/K/V projections, an RMS
norm of each head of Q and of K (QK norms), rope in NeoX mode (pairs (x_i, x_{i+d/2})) with a base
of rope.freq_base on global layers and 10000 on sliding-window ones, Q scaled by 1/sqrt(head_dim),
attention through the KV cache (a causal mask; on sliding-window layers also blind to keys
`sliding_window` or more positions back; every 6th layer is global), the output projection, an
RMS norm of the attention's output (post_attention_norm) and the residual; then an RMS norm, a
GELU-gated feed-forward (gelu(gate)·up, down), an RMS norm of its output (post_ffw_norm) and the
residual; the final RMS norm and the output head, tied to the token embeddings when the file has
no output.weight; the final logit soft-capping when the file asks for it.
Leaves out: vision inputs, flash attention, the separate small cache llama.cpp keeps for
sliding-window layers (here every layer caches all positions; the window is in the mask).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from engine.ggml import (GGML_ROPE_TYPE_NEOX, ggml_add, ggml_build_forward_expand,
                         ggml_geglu_split, ggml_get_rows, ggml_mul, ggml_mul_mat,
                         ggml_new_graph_custom, ggml_reshape_3d, ggml_rms_norm, ggml_rope_ext,
                         ggml_scale, ggml_set_name, ggml_set_output, ggml_tanh)

from .bert import _name, attention
from .common import ModelError, ModelFile
from .decoder import Decoder, DecoderParams, KVCache
from .tokenize import tokenizer_of

SWA_PATTERN = 6  # llama.cpp's default for gemma3: layers 5, 11, 17, ... are global
FREQ_BASE_SWA = 10000.0  # llama_hparams::rope_freq_base_train_swa's default


@dataclass(frozen=True, slots=True)
class Gemma3Params(DecoderParams):  # head_dim: key_length, not n_embd / n_head in Gemma 3;
    # freq_base: the global layers'
    freq_base_swa: float  # sliding-window layers
    n_swa: int  # the window, in positions (0: no sliding window)
    swa_layers: tuple[bool, ...]
    softcap: float  # final_logit_softcapping (0: none)


class Gemma3(Decoder):
    """A Gemma 3 GGUF opened for decoding: hyperparameters, tokenizer, weights, KV cache."""

    windows = {"attn_inp_kq_mask": None}  # set per model below: the sliding window's mask too

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None) -> None:
        super().__init__()
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != "gemma3":
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not 'gemma3'")
        self.file = f
        shared = f.transformer_params()
        n_layer = shared["n_layer"]
        n_swa = int(f.key("{arch}.attention.sliding_window", 0))
        pattern = int(f.key("{arch}.attention.sliding_window_pattern", SWA_PATTERN))
        swa = tuple(n_swa > 0 and (pattern == 0 or il % pattern < pattern - 1)
                    for il in range(n_layer))
        head_dim = int(f.key("{arch}.attention.key_length", shared["n_embd"] // shared["n_head"]))
        if int(f.key("{arch}.attention.value_length", head_dim)) != head_dim:
            raise ModelError(f"{f.path}: key_length and value_length must be equal")
        if int(f.key("{arch}.rope.dimension_count", head_dim)) != head_dim:
            raise ModelError(f"{f.path}: rope.dimension_count must equal key_length {head_dim}")
        self.hp = hp = Gemma3Params(
            **shared, head_dim=head_dim,
            rms_eps=float(f.key("{arch}.attention.layer_norm_rms_epsilon")),
            freq_base=float(f.key("{arch}.rope.freq_base", 10000.0)),
            freq_base_swa=float(f.key("{arch}.rope.freq_base_swa", FREQ_BASE_SWA)),
            n_swa=n_swa, swa_layers=swa,
            softcap=float(f.key("{arch}.final_logit_softcapping", 0.0)))
        if hp.n_head % hp.n_head_kv:
            raise ModelError(f"{f.path}: head_count {hp.n_head} is not a multiple of "
                             f"head_count_kv {hp.n_head_kv}")
        E, Q, G = hp.n_embd, hp.head_dim * hp.n_head, hp.n_embd_gqa
        self.tok_embd = f.tensor("token_embd.weight", (E, hp.n_vocab))
        self.output_norm = f.tensor("output_norm.weight", (E,))
        self.output = f.optional("output.weight", (E, hp.n_vocab)) or self.tok_embd
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                wq=t("attn_q.weight", (E, Q)), wk=t("attn_k.weight", (E, G)),
                wv=t("attn_v.weight", (E, G)), wo=t("attn_output.weight", (Q, E)),
                q_norm=t("attn_q_norm.weight", (hp.head_dim,)),
                k_norm=t("attn_k_norm.weight", (hp.head_dim,)),
                attn_post_norm=t("post_attention_norm.weight", (E,)),
                ffn_norm=t("ffn_norm.weight", (E,)),
                ffn_gate=t("ffn_gate.weight", (E, hp.n_ff)),
                ffn_up=t("ffn_up.weight", (E, hp.n_ff)),
                ffn_down=t("ffn_down.weight", (hp.n_ff, E)),
                ffn_post_norm=t("post_ffw_norm.weight", (E,)),
            ))
        self.tokenizer = tokenizer_of(f)
        self.n_ctx = min(n_ctx or 4096, hp.n_ctx_train)
        self.cache = KVCache(hp, self.n_ctx, f.backend)
        if any(swa):
            self.windows = {"attn_inp_kq_mask": None, "attn_inp_kq_mask_swa": hp.n_swa}

    def graph_size(self) -> int:
        return 64 + 64 * self.hp.n_layer

    def _norm(self, ctx, x, w, name: str, il: int):
        """build_norm(LLM_NORM_RMS): rms_norm(x) * w."""
        return _name(ggml_mul(ctx, ggml_rms_norm(ctx, x, self.hp.rms_eps), w), name, il)

    def build(self, ctx, n_tokens: int, n_kv: int, all_logits: bool = True):
        """The graph for n_tokens new tokens attending to n_kv cache cells: returns the graph,
        the input tensors by name and the logits tensor ([n_vocab, n_outputs])."""
        hp, cache, n = self.hp, self.cache, n_tokens
        hd = hp.head_dim
        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)

        inputs = self.build_inputs(ctx, n, n_kv, all_logits)
        inp_pos, inp_out_ids = inputs["inp_pos"], inputs.get("inp_out_ids")
        x = ggml_get_rows(ctx, self.tok_embd, inputs["inp_tokens"])  # [E, n]
        ggml_set_name(x, "inp_embd")
        x = _name(ggml_scale(ctx, x, math.sqrt(hp.n_embd)), "inp_scaled", -1)

        scale = 1.0 / math.sqrt(hd)  # f_attention_scale (the 27B model's differs)
        for il, L in enumerate(self.layers):
            swa = hp.swa_layers[il]
            rope = dict(n_dims=hd, mode=GGML_ROPE_TYPE_NEOX, n_ctx_orig=hp.n_ctx_train,
                        freq_base=hp.freq_base_swa if swa else hp.freq_base, freq_scale=1.0,
                        ext_factor=0.0, attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
            cur = self._norm(ctx, x, L["attn_norm"], "attn_norm", il)
            q = _name(ggml_mul_mat(ctx, L["wq"], cur), "Qcur", il)
            k = _name(ggml_mul_mat(ctx, L["wk"], cur), "Kcur", il)
            v = _name(ggml_mul_mat(ctx, L["wv"], cur), "Vcur", il)
            q = ggml_reshape_3d(ctx, q, hd, hp.n_head, n)
            k = ggml_reshape_3d(ctx, k, hd, hp.n_head_kv, n)
            v = ggml_reshape_3d(ctx, v, hd, hp.n_head_kv, n)
            q = self._norm(ctx, q, L["q_norm"], "Qcur_normed", il)
            q = ggml_rope_ext(ctx, q, inp_pos, None, **rope)
            k = self._norm(ctx, k, L["k_norm"], "Kcur_normed", il)
            k = _name(ggml_rope_ext(ctx, k, inp_pos, None, **rope), "Kcur", il)
            _name(q, "Qcur", il), _name(v, "Vcur", il)
            q = ggml_scale(ctx, q, scale)
            ggml_build_forward_expand(gf, q)  # llama.cpp's order: q, v, k, then the stores
            ggml_build_forward_expand(gf, v)
            ggml_build_forward_expand(gf, k)

            cache.store(ctx, gf, il, k, v, inputs, "_swa" if swa else "")
            k_all, v_all = cache.view(ctx, il, n_kv)
            mask = inputs["attn_inp_kq_mask_swa" if swa else "attn_inp_kq_mask"]
            cur = attention(ctx, q, k_all, v_all, mask, 1.0, il)
            cur = _name(ggml_mul_mat(ctx, L["wo"], cur), "attn_out", il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                x = ggml_get_rows(ctx, x, inp_out_ids)
            cur = self._norm(ctx, cur, L["attn_post_norm"], "attn_post_norm", il)
            sa_out = _name(ggml_add(ctx, cur, x), "sa_out", il)
            cur = self._norm(ctx, sa_out, L["ffn_norm"], "ffn_norm", il)
            up = _name(ggml_mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)
            gate = _name(ggml_mul_mat(ctx, L["ffn_gate"], cur), "ffn_gate", il)
            cur = _name(ggml_geglu_split(ctx, gate, up), "ffn_geglu", il)  # gelu(gate) * up
            cur = _name(ggml_mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)
            cur = self._norm(ctx, cur, L["ffn_post_norm"], "ffn_post_norm", il)
            x = _name(ggml_add(ctx, cur, sa_out), "l_out", il)

        x = self._norm(ctx, x, self.output_norm, "result_norm", -1)
        logits = ggml_mul_mat(ctx, self.output, x)  # [n_vocab, n_outputs]
        if hp.softcap:
            logits = ggml_scale(ctx, ggml_tanh(ctx, ggml_scale(ctx, logits, 1.0 / hp.softcap)),
                                hp.softcap)
        ggml_set_name(logits, "result_output")
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits
