"""BERT (e.g. all-MiniLM-L6-v2): sentence embeddings, built the way llama.cpp builds its graph.

Mirrors llama.cpp's `bert` architecture (src/models/bert.cpp with llm_graph_context's norm, qkv,
attention and feed-forward helpers) with its tensor names: token + token-type(0) + position
embeddings, a layer norm, then per layer separate Q/K/V projections with biases, non-causal
attention (KQ = K·Q, soft_max_ext with mask and 1/sqrt(head_dim), V transposed), the output
projection, residual and post-norm, a GELU feed-forward, residual and post-norm; then the pooling
the file's `bert.pooling_type` names (mean: a matrix product with a column of 1/n; cls: row 0)
and L2 normalisation, as llama.cpp's embedding example does by default.
Leaves out: flash attention, batches of several sequences, rank pooling (classifier heads),
the jina/nomic variants (rope, GEGLU, fused QKV).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ggml import (GGML_TYPE_F32, GGML_TYPE_I32, Tensor, ggml_add, ggml_build_forward_expand,
                         ggml_cont, ggml_gelu, ggml_get_rows, ggml_l2_norm, ggml_mul, ggml_mul_mat,
                         ggml_new_graph_custom, ggml_new_tensor_1d, ggml_new_tensor_2d, ggml_norm,
                         ggml_reshape_3d, ggml_set_input, ggml_set_name, ggml_set_output,
                         ggml_transpose, ggml_view_1d)

from .common import ModelError, ModelFile, Passes, get_output, set_input
from .llm_graph import attention, named
from .tokenizer import WordPiece

# llama_pooling_type
POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST, POOLING_RANK = 0, 1, 2, 3, 4
POOLING_NAMES = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}


@dataclass(frozen=True, slots=True)
class BertParams:
    n_vocab: int
    n_ctx_train: int  # rows of the position table: the longest input
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    norm_eps: float  # layer_norm_epsilon
    causal: bool  # bert.attention.causal (false for BERT)
    pooling: int  # bert.pooling_type

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True, slots=True)
class Embedding:
    tokens: list[str]  # as the vocabulary spells them (WordPiece pieces, '▁' starts a word)
    token_ids: list[int]
    embedding: np.ndarray  # [n_embd] pooled and L2-normalised, or [n_tokens, n_embd] for none
    seconds: float  # compute time of the graph


class Bert:
    """A BERT GGUF opened for embedding: hyperparameters, weights, tokenizer, graph builder."""

    def __init__(self, path: str | os.PathLike | ModelFile) -> None:
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != "bert":
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not 'bert'")
        self.file = f
        self.hp = BertParams(
            **f.transformer_params(),
            norm_eps=float(f.key("{arch}.attention.layer_norm_epsilon")),
            causal=bool(f.key("{arch}.attention.causal", True)),
            pooling=int(f.key("{arch}.pooling_type", POOLING_NONE)),
        )
        hp = self.hp
        if hp.pooling not in (POOLING_NONE, POOLING_MEAN, POOLING_CLS, POOLING_LAST):
            raise ModelError(f"{f.path}: pooling type {hp.pooling} "
                             f"({POOLING_NAMES.get(hp.pooling, '?')}) is not supported")
        n_kv = hp.head_dim * hp.n_head_kv
        n_token_types = int(f.key("tokenizer.ggml.token_type_count", 0))
        if n_token_types == 0:
            raise ModelError(f"{f.path}: architecture 'bert' needs key "
                             "'tokenizer.ggml.token_type_count' (> 0)")
        E = hp.n_embd
        self.tok_embd = f.tensor("token_embd.weight", (E, hp.n_vocab))
        self.type_embd = f.optional("token_types.weight", (E, n_token_types))
        self.pos_embd = f.tensor("position_embd.weight", (E, hp.n_ctx_train))
        self.tok_norm = f.tensor("token_embd_norm.weight", (E,))
        self.tok_norm_b = f.tensor("token_embd_norm.bias", (E,))
        self.layers: list[dict[str, Any]] = []  # a layer's weights by name (None: absent)
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            o = lambda name, ne: f.optional(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                wq=t("attn_q.weight", (E, E)), bq=o("attn_q.bias", (E,)),
                wk=t("attn_k.weight", (E, n_kv)), bk=o("attn_k.bias", (n_kv,)),
                wv=t("attn_v.weight", (E, n_kv)), bv=o("attn_v.bias", (n_kv,)),
                wo=t("attn_output.weight", (E, E)), bo=o("attn_output.bias", (E,)),
                attn_out_norm=t("attn_output_norm.weight", (E,)),
                attn_out_norm_b=t("attn_output_norm.bias", (E,)),
                ffn_up=t("ffn_up.weight", (E, hp.n_ff)), ffn_up_b=o("ffn_up.bias", (hp.n_ff,)),
                ffn_down=t("ffn_down.weight", (hp.n_ff, E)), ffn_down_b=o("ffn_down.bias", (E,)),
                layer_out_norm=t("layer_output_norm.weight", (E,)),
                layer_out_norm_b=t("layer_output_norm.bias", (E,)),
            ))
        self.tokenizer = WordPiece.from_model_file(f)
        self._passes = Passes(kept=4)  # built graphs by token count

    # --- the graph ----------------------------------------------------------------------------

    def graph_size(self) -> int:
        return 64 + 48 * self.hp.n_layer

    def build(self, ctx, n_tokens: int):
        """Build the forward graph for one sequence of n_tokens in ctx; return the graph, the
        input tensors by name and the output tensor."""
        hp, E, n = self.hp, self.hp.n_embd, n_tokens
        inp_tokens = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(inp_tokens, "inp_tokens")
        ggml_set_input(inp_tokens)
        inp_pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n)
        ggml_set_name(inp_pos, "inp_pos")
        ggml_set_input(inp_pos)

        # input embeddings: token + token type 0 ("sentence A") + position
        x = ggml_get_rows(ctx, self.tok_embd, inp_tokens)  # [E, n]
        if self.type_embd is not None:
            x = ggml_add(ctx, x, ggml_view_1d(ctx, self.type_embd, E, 0))  # broadcast over rows
        x = ggml_add(ctx, ggml_get_rows(ctx, self.pos_embd, inp_pos), x)
        ggml_set_name(x, "inp_embd")
        x = _layer_norm(ctx, x, self.tok_norm, self.tok_norm_b, hp.norm_eps)
        ggml_set_name(x, "inp_norm")

        # no KV cache: the mask is [n_kv = n, n_q = n], 0 where a query may look, -inf elsewhere
        kq_mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n)
        ggml_set_name(kq_mask, "self_kq_mask")
        ggml_set_input(kq_mask)

        kq_scale = 1.0 / math.sqrt(hp.head_dim)
        for il, L in enumerate(self.layers):
            q = _linear(ctx, L["wq"], L["bq"], x)
            k = _linear(ctx, L["wk"], L["bk"], x)
            v = _linear(ctx, L["wv"], L["bv"], x)
            q = ggml_reshape_3d(ctx, q, hp.head_dim, hp.n_head, n)  # [head_dim, n_head, n]
            k = ggml_reshape_3d(ctx, k, hp.head_dim, hp.n_head_kv, n)
            v = ggml_reshape_3d(ctx, v, hp.head_dim, hp.n_head_kv, n)
            named(q, "Qcur", il), named(k, "Kcur", il), named(v, "Vcur", il)
            cur = attention(ctx, q, k, v, kq_mask, kq_scale, il)
            cur = _linear(ctx, L["wo"], L["bo"], cur)
            cur = ggml_add(ctx, cur, x)  # re-add the layer input
            cur = _layer_norm(ctx, cur, L["attn_out_norm"], L["attn_out_norm_b"], hp.norm_eps)
            ffn_inp = named(cur, "ffn_inp", il)
            cur = _linear(ctx, L["ffn_up"], L["ffn_up_b"], cur)  # [n_ff, n]
            cur = named(ggml_gelu(ctx, cur), "ffn_gelu", il)
            cur = _linear(ctx, L["ffn_down"], L["ffn_down_b"], cur)
            cur = ggml_add(ctx, cur, ffn_inp)
            x = _layer_norm(ctx, cur, L["layer_out_norm"], L["layer_out_norm_b"], hp.norm_eps)
            named(x, "l_out", il)
        ggml_set_name(x, "result_embd")

        inputs = {"inp_tokens": inp_tokens, "inp_pos": inp_pos, "self_kq_mask": kq_mask}
        out = x
        if hp.pooling == POOLING_MEAN:
            inp_mean = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 1)  # a column of 1/n
            ggml_set_name(inp_mean, "inp_mean")
            ggml_set_input(inp_mean)
            inputs["inp_mean"] = inp_mean
            out = ggml_mul_mat(ctx, ggml_cont(ctx, ggml_transpose(ctx, x)), inp_mean)  # [E, 1]
        elif hp.pooling in (POOLING_CLS, POOLING_LAST):
            inp_cls = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 1)  # the row to keep
            ggml_set_name(inp_cls, "inp_cls")
            ggml_set_input(inp_cls)
            inputs["inp_cls"] = inp_cls
            out = ggml_get_rows(ctx, x, inp_cls)
        if hp.pooling != POOLING_NONE:
            ggml_set_name(out, "result_embd_pooled")
            out = ggml_l2_norm(ctx, out, 1e-12)  # what llama.cpp's embedding example does next
            ggml_set_name(out, "result_embd_normalized")
        ggml_set_output(out)

        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)
        ggml_build_forward_expand(gf, out)
        return gf, inputs, out

    def set_inputs(self, inputs: dict[str, Tensor], token_ids: list[int]) -> None:
        """llm_graph_input_*::set_input: token ids, positions 0..n-1, the mask, the pooling."""
        n = len(token_ids)
        set_input(inputs["inp_tokens"], np.asarray(token_ids))
        set_input(inputs["inp_pos"], np.arange(n))
        mask = np.zeros((n, n), dtype=np.float32)  # [q, kv] in numpy order
        if self.hp.causal:
            mask[np.triu_indices(n, 1)] = -np.inf
        set_input(inputs["self_kq_mask"], mask)
        if "inp_mean" in inputs:
            set_input(inputs["inp_mean"], np.full((1, n), 1.0 / n, dtype=np.float32))
        if "inp_cls" in inputs:
            row = 0 if self.hp.pooling == POOLING_CLS else n - 1
            set_input(inputs["inp_cls"], np.array([row]))

    # --- running ------------------------------------------------------------------------------

    def check_length(self, n_tokens: int) -> None:
        if n_tokens > self.hp.n_ctx_train:
            raise ModelError(f"the text is {n_tokens} tokens long; this model's context "
                             f"(bert.context_length) holds at most {self.hp.n_ctx_train}")
        if n_tokens == 0:
            raise ModelError("nothing to embed: the text gave no tokens")

    def embed(self, text: str | list[int], n_threads: int = 1) -> Embedding:
        """Tokenize (unless given ids), build, compute; the pooled, normalised embedding."""
        import time

        ids = self.tokenizer.encode(text) if isinstance(text, str) else [int(i) for i in text]
        self.check_length(len(ids))
        if any(not 0 <= i < self.hp.n_vocab for i in ids):
            raise ModelError(f"token ids must lie in [0, {self.hp.n_vocab})")
        p = self._passes.get(len(ids), self.file.backend, self.graph_size(),
                             lambda c: self.build(c, len(ids)))
        self.set_inputs(p.inputs, ids)
        t0 = time.perf_counter()
        p.compute(n_threads)
        seconds = time.perf_counter() - t0
        result = get_output(p.out)
        if self.hp.pooling != POOLING_NONE:
            result = result.reshape(-1)
        return Embedding([self.tokenizer.token_text(i) for i in ids], ids, result, seconds)


def _linear(ctx, w: Tensor, b: Tensor | None, x: Tensor) -> Tensor:
    """build_lora_mm plus the bias: w·x (+ b)."""
    y = ggml_mul_mat(ctx, w, x)
    return ggml_add(ctx, y, b) if b is not None else y


def _layer_norm(ctx, x: Tensor, w: Tensor, b: Tensor, eps: float) -> Tensor:
    """build_norm(LLM_NORM): (x - mean) / sqrt(var + eps) * w + b."""
    return ggml_add(ctx, ggml_mul(ctx, ggml_norm(ctx, x, eps), w), b)
