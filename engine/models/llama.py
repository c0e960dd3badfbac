"""LLaMA, Qwen2, Qwen3 and Qwen3-MoE: next-token logits with a KV cache, as llama.cpp builds them.

Mirrors llama.cpp's `llama` architecture (src/models/llama.cpp) with its tensor and key names: per
layer an RMS norm, Q/K/V projections (with their biases when the file has them), rope on Q and K,
K and V stored into the KV cache, grouped-query attention over everything cached so far (a causal
mask, 1/sqrt(head_dim)), the output projection and residual; an RMS norm and a SwiGLU
feed-forward (silu(gate)·up, down) and residual; then the final RMS norm and the output head.
`qwen2` (src/models/qwen2.cpp) is the same graph with rope in NeoX mode (pairs (x_i, x_{i+d/2}));
`qwen3` (qwen3.cpp) adds an RMS norm of each head of Q and of K before rope (QK norms) and takes
its head size from attention.key_length. `qwen3moe` (qwen3moe.cpp) is Qwen3 with a mixture of
experts in place of the feed-forward (llama-graph.cpp's build_moe_ffn: a router ffn_gate_inp, a
softmax, the expert_used_count most probable experts by argsort, their probabilities renormalised
to sum 1, each chosen expert's SwiGLU by ggml_mul_mat_id over the 3-D ffn_{gate,up,down}_exps,
the weighted outputs summed). The KV cache (engine/models/decoder.py) is llama.cpp's:
one F16 K and one F16 V tensor per layer in a CPU buffer, V kept transposed, new rows written by
ggml_set_rows at cells that are graph inputs.
With ContextParams (engine/models/params.py) it runs as llama.cpp runs it with those settings:
flash attention (V then kept as K is, not transposed), a quantized cache (rotated by Hadamard
matrices), batches split into ubatches.
Leaves out: rope scaling other than linear, several sequences; for MoE, expert
groups, per-layer expert counts, shared experts and the other gating functions (sigmoid, ...),
which qwen3moe does not use.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from engine.ggml import (GGML_ROPE_TYPE_NEOX, ggml_add, ggml_argsort_top_k,
                         ggml_build_forward_expand, ggml_clamp, ggml_cont, ggml_div, ggml_get_rows,
                         ggml_mul, ggml_mul_mat, ggml_mul_mat_id, ggml_new_graph_custom,
                         ggml_reshape_2d, ggml_reshape_3d, ggml_rms_norm, ggml_rope_ext,
                         ggml_set_name, ggml_set_output, ggml_soft_max, ggml_sum_rows,
                         ggml_swiglu_split, ggml_view_2d)

from .common import ModelError, ModelFile
from .decoder import Decoded, Decoder, DecoderParams, KVCache  # noqa: F401 - Decoded, KVCache: this module's API
from .llm_graph import named
from .params import ContextParams
from .tokenize import tokenizer_of

LLAMA_ROPE_TYPE_NORM = 0  # rope on consecutive pairs (x0, x1), (x2, x3), ...
LLAMA_ROPE_TYPE_NEOX = GGML_ROPE_TYPE_NEOX  # rope on pairs (x_i, x_{i+d/2})
F16_MIN_NORMAL = 6.103515625e-5  # build_moe_ffn's floor for the sum of the experts' weights


@dataclass(frozen=True, slots=True)
class LlamaParams(DecoderParams):
    n_rot: int  # rope dimensions (= head_dim)
    freq_scale: float  # 1 / rope.scaling.factor (linear scaling)


class Llama(Decoder):
    """A LLaMA GGUF opened for decoding: hyperparameters, weights, KV cache, graph builder."""

    hp: LlamaParams
    cache: KVCache
    ARCH = "llama"
    ROPE_MODE = LLAMA_ROPE_TYPE_NORM
    QK_NORM = False  # an RMS norm of each Q and K head before rope (qwen3)

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None,
                 params: ContextParams | None = None) -> None:
        super().__init__()
        f = self.file = self._open(path)
        shared = f.transformer_params()
        n_embd, n_head = shared["n_embd"], shared["n_head"]
        scaling = f.key("{arch}.rope.scaling.type", "none")
        if scaling not in ("none", "linear"):
            raise ModelError(f"{f.path}: rope scaling '{scaling}' is not supported")
        head_dim = int(f.key("{arch}.attention.key_length", n_embd // n_head))
        if int(f.key("{arch}.attention.value_length", head_dim)) != head_dim:
            raise ModelError(f"{f.path}: key_length and value_length must be equal")
        self.hp = hp = LlamaParams(
            **shared, head_dim=head_dim,
            n_rot=int(f.key("{arch}.rope.dimension_count", head_dim)),
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
        E, Q, G = n_embd, head_dim * n_head, hp.n_embd_gqa
        # tied embeddings: without output.weight the token table is the head too
        self.tok_embd, self.output_norm, self.output = f.token_table_and_head(E, hp.n_vocab)
        self.output_b = f.optional("output.bias", (hp.n_vocab,))
        self.rope_freqs = f.optional("rope_freqs.weight", (hp.n_rot // 2,))
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            o = lambda name, ne: f.optional(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                wq=t("attn_q.weight", (E, Q)), wk=t("attn_k.weight", (E, G)),
                wv=t("attn_v.weight", (E, G)), wo=t("attn_output.weight", (Q, E)),
                bq=o("attn_q.bias", (Q,)), bk=o("attn_k.bias", (G,)), bv=o("attn_v.bias", (G,)),
                bo=o("attn_output.bias", (E,)),
                q_norm=t("attn_q_norm.weight", (hd := head_dim,)) if self.QK_NORM else None,
                k_norm=t("attn_k_norm.weight", (hd,)) if self.QK_NORM else None,
                ffn_norm=t("ffn_norm.weight", (E,)),
                **self._ffn_tensors(t),
            ))
        if params is not None and n_ctx is not None:
            params = params.with_(n_ctx=n_ctx)
        self.open_context(f, params, min(n_ctx or hp.n_ctx_train, hp.n_ctx_train))
        self.tokenizer = tokenizer_of(f)

    @classmethod
    def _open(cls, path: str | os.PathLike | ModelFile) -> ModelFile:
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != cls.ARCH:
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not '{cls.ARCH}'")
        return f

    def _ffn_tensors(self, t) -> dict:
        """A layer's feed-forward weights; `t(name, ne)` fetches blk.<i>.<name>."""
        E, F = self.hp.n_embd, self.hp.n_ff
        return dict(ffn_gate=t("ffn_gate.weight", (E, F)), ffn_up=t("ffn_up.weight", (E, F)),
                    ffn_down=t("ffn_down.weight", (F, E)))

    # --- the graph ----------------------------------------------------------------------------

    def _norm(self, ctx, x, w):
        """build_norm(LLM_NORM_RMS): rms_norm(x) * w."""
        return ggml_mul(ctx, ggml_rms_norm(ctx, x, self.hp.rms_eps), w)

    @staticmethod
    def _projection(ctx, x, w, b, name: str, il: int):
        """build_qkv's separate path: w·x, plus the bias when there is one."""
        y = named(ggml_mul_mat(ctx, w, x), name, il)
        return y if b is None else named(ggml_add(ctx, y, b), name, il)

    def graph_size(self) -> int:
        return 64 + 40 * self.hp.n_layer

    def build(self, ctx, n_tokens: int, n_kv: int, all_logits: bool = True):
        """The graph for n_tokens new tokens attending to n_kv cache cells (the cached ones, the
        new ones, padding): returns the graph, the input tensors by name and the logits tensor
        ([n_vocab, n_outputs]). Where the tokens go is an input: one graph serves every n_past."""
        hp, n = self.hp, n_tokens
        hd = hp.head_dim
        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)

        inputs = self.build_inputs(ctx, n, n_kv, all_logits)
        inp_pos, inp_out_ids = inputs["inp_pos"], inputs.get("inp_out_ids")

        x = self.token_rows(ctx, gf, inputs, "inp_embd")  # [E, n]
        kq_scale = 1.0 / math.sqrt(hd)
        rope: dict[str, Any] = dict(n_dims=hp.n_rot, mode=self.ROPE_MODE, n_ctx_orig=hp.n_ctx_train,
                                    freq_base=hp.freq_base, freq_scale=hp.freq_scale, ext_factor=0.0,
                                    attn_factor=1.0, beta_fast=32.0, beta_slow=1.0)
        for il, L in enumerate(self.layers):
            inp_sa = x
            cur = named(ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), L["attn_norm"]),
                        "attn_norm", il)
            q = self._projection(ctx, cur, L["wq"], L["bq"], "Qcur", il)
            k = self._projection(ctx, cur, L["wk"], L["bk"], "Kcur", il)
            v = self._projection(ctx, cur, L["wv"], L["bv"], "Vcur", il)
            q = ggml_reshape_3d(ctx, q, hd, hp.n_head, n)
            k = ggml_reshape_3d(ctx, k, hd, hp.n_head_kv, n)
            v = ggml_reshape_3d(ctx, v, hd, hp.n_head_kv, n)
            if self.QK_NORM:
                q = named(self._norm(ctx, q, L["q_norm"]), "Qcur_normed", il)
                k = named(self._norm(ctx, k, L["k_norm"]), "Kcur_normed", il)
            q = named(ggml_rope_ext(ctx, q, inp_pos, self.rope_freqs, **rope), "Qcur", il)
            k = named(ggml_rope_ext(ctx, k, inp_pos, self.rope_freqs, **rope), "Kcur", il)
            named(v, "Vcur", il)
            cur = self.attend(ctx, gf, inputs, il, q, k, v, n_kv, kq_scale)
            cur = ggml_mul_mat(ctx, L["wo"], cur)
            if L["bo"] is not None:
                cur = ggml_add(ctx, cur, L["bo"])
            named(cur, "attn_out", il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                inp_sa = ggml_get_rows(ctx, inp_sa, inp_out_ids)
            ffn_inp = named(ggml_add(ctx, cur, inp_sa), "ffn_inp", il)
            cur = named(ggml_mul(ctx, ggml_rms_norm(ctx, ffn_inp, hp.rms_eps), L["ffn_norm"]),
                        "ffn_norm", il)
            cur = self.ffn(ctx, gf, cur, L, il)
            x = named(ggml_add(ctx, cur, ffn_inp), "l_out", il)

        x = ggml_mul(ctx, ggml_rms_norm(ctx, x, hp.rms_eps), self.output_norm)
        ggml_set_name(x, "result_norm")
        logits = ggml_mul_mat(ctx, self.output, x)  # [n_vocab, n_outputs]
        if self.output_b is not None:
            logits = ggml_add(ctx, logits, self.output_b)
        ggml_set_name(logits, "result_output")
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits

    def ffn(self, ctx, gf, cur, L: dict, il: int):
        """build_ffn(LLM_FFN_SILU, LLM_FFN_PAR): down · (silu(gate · x) * (up · x))."""
        up = named(ggml_mul_mat(ctx, L["ffn_up"], cur), "ffn_up", il)
        gate = named(ggml_mul_mat(ctx, L["ffn_gate"], cur), "ffn_gate", il)
        cur = named(ggml_swiglu_split(ctx, gate, up), "ffn_swiglu", il)  # silu(gate) * up
        return named(ggml_mul_mat(ctx, L["ffn_down"], cur), "ffn_out", il)


class Qwen2(Llama):
    """Qwen2: LLaMA's graph with Q/K/V biases and rope in NeoX mode."""

    ARCH = "qwen2"
    ROPE_MODE = LLAMA_ROPE_TYPE_NEOX


class Qwen3(Llama):
    """Qwen3: rope in NeoX mode and an RMS norm of every Q and K head before it."""

    ARCH = "qwen3"
    ROPE_MODE = LLAMA_ROPE_TYPE_NEOX
    QK_NORM = True


@dataclass(frozen=True, slots=True)
class MoeParams:
    """A mixture-of-experts feed-forward's hyperparameters (llama_hparams, in part)."""

    n_expert: int  # expert_count: the experts of each layer
    n_expert_used: int  # expert_used_count: how many each token goes through
    n_ff_exp: int  # expert_feed_forward_length (n_ff / n_expert_used when the file has none)

    @classmethod
    def read(cls, f: ModelFile) -> "MoeParams":
        n_expert, n_used = int(f.key("{arch}.expert_count")), f.key("{arch}.expert_used_count")
        if not isinstance(n_used, int):
            raise ModelError(f"{f.path}: a per-layer expert_used_count is not supported")
        if n_expert <= 0 or not 0 < n_used <= n_expert:
            raise ModelError(f"{f.path}: expert_used_count {n_used} must lie in [1, "
                             f"expert_count {n_expert}]")
        if int(f.key("{arch}.expert_group_count", 0)) > 1:
            raise ModelError(f"{f.path}: expert groups (expert_group_count) are not supported")
        n_ff = int(f.key("{arch}.feed_forward_length"))
        return cls(n_expert, n_used, int(f.key("{arch}.expert_feed_forward_length", 0))
                   or n_ff // n_used)


def moe_ffn(ctx, gf, cur, L: dict, moe: MoeParams, il: int, norm_w: bool = True):
    """build_moe_ffn with softmax gating and SwiGLU experts, no biases, no weight scale:
    cur [n_embd, n_tokens] -> [n_embd, n_tokens]. The router gives each token a softmax over the
    experts; the n_expert_used most probable are chosen (argsort, descending), their
    probabilities taken as weights (renormalised to sum 1 when norm_w), each chosen expert's
    SwiGLU computed by ggml_mul_mat_id, and the weighted outputs summed."""
    n_embd, n_tokens, k = int(cur.ne[0]), int(cur.ne[1]), moe.n_expert_used
    logits = named(ggml_mul_mat(ctx, L["ffn_gate_inp"], cur), "ffn_moe_logits", il)
    probs = named(ggml_soft_max(ctx, logits), "ffn_moe_probs", il)  # [n_expert, n_tokens]
    selected = ggml_argsort_top_k(ctx, probs, k)  # [k, n_tokens]: a view of the argsort
    named(selected.source(0), "ffn_moe_argsort", il)
    named(selected, "ffn_moe_topk", il)
    probs = ggml_reshape_3d(ctx, probs, 1, moe.n_expert, n_tokens)
    weights = named(ggml_get_rows(ctx, probs, selected), "ffn_moe_weights", il)  # [1, k, n]
    if norm_w:
        weights = ggml_reshape_2d(ctx, weights, k, n_tokens)
        total = named(ggml_sum_rows(ctx, weights), "ffn_moe_weights_sum", il)  # [1, n]
        total = named(ggml_clamp(ctx, total, F16_MIN_NORMAL, math.inf),
                      "ffn_moe_weights_sum_clamped", il)  # no division by zero
        weights = named(ggml_div(ctx, weights, total), "ffn_moe_weights_norm", il)
        weights = ggml_reshape_3d(ctx, weights, 1, k, n_tokens)
    ggml_build_forward_expand(gf, weights)  # llama.cpp expands the weights early

    cur = ggml_reshape_3d(ctx, cur, n_embd, 1, n_tokens)  # one input row for all k experts
    up = named(ggml_mul_mat_id(ctx, L["ffn_up_exps"], cur, selected), "ffn_moe_up", il)
    gate = named(ggml_mul_mat_id(ctx, L["ffn_gate_exps"], cur, selected), "ffn_moe_gate", il)
    cur = named(ggml_swiglu_split(ctx, gate, up), "ffn_moe_swiglu", il)  # [n_ff_exp, k, n]
    experts = named(ggml_mul_mat_id(ctx, L["ffn_down_exps"], cur, selected), "ffn_moe_down", il)
    experts = named(ggml_mul(ctx, experts, weights), "ffn_moe_weighted", il)  # [n_embd, k, n]
    ggml_build_forward_expand(gf, experts)
    # the k weighted outputs summed, each a view [n_embd, n_tokens]: the views first, then adds
    views = [ggml_view_2d(ctx, experts, n_embd, n_tokens, int(experts.nb[2]),
                          i * int(experts.nb[1])) for i in range(k)]
    for v in views:
        ggml_build_forward_expand(gf, v)
    out = views[0]
    for v in views[1:]:
        out = ggml_add(ctx, out, v)
        ggml_build_forward_expand(gf, out)
    if k == 1:
        out = ggml_cont(ctx, out)  # not a strided view
    return named(out, "ffn_moe_out", il)


class Qwen3Moe(Qwen3):
    """Qwen3-MoE: Qwen3's attention, and a mixture of experts in place of the feed-forward."""

    ARCH = "qwen3moe"

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None,
                 params: ContextParams | None = None) -> None:
        f = self._open(path)
        self.moe = MoeParams.read(f)
        super().__init__(f, n_ctx, params)

    def _ffn_tensors(self, t) -> dict:
        E, m = self.hp.n_embd, self.moe
        return dict(ffn_gate_inp=t("ffn_gate_inp.weight", (E, m.n_expert)),
                    ffn_gate_exps=t("ffn_gate_exps.weight", (E, m.n_ff_exp, m.n_expert)),
                    ffn_up_exps=t("ffn_up_exps.weight", (E, m.n_ff_exp, m.n_expert)),
                    ffn_down_exps=t("ffn_down_exps.weight", (m.n_ff_exp, E, m.n_expert)))

    def graph_size(self) -> int:
        return 64 + (40 + 24 + 2 * self.moe.n_expert_used) * self.hp.n_layer

    def ffn(self, ctx, gf, cur, L: dict, il: int):
        return moe_ffn(ctx, gf, cur, L, self.moe, il)  # qwen3moe always renormalises
