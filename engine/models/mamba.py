"""Mamba (the first one): next-token logits with a recurrent state, built as llama.cpp builds them.

Mirrors llama.cpp's `mamba` architecture (src/models/mamba.cpp, build_mamba_layer in
mamba-base.cpp) with its tensor and key names: per layer an RMS norm and a selective-state-space
block: ssm_in projects each token to x and z (2·d_inner); x, after the layer's last d_conv - 1
inputs, goes through the causal depthwise convolution ggml_ssm_conv (ssm_conv1d, its bias, SiLU);
ssm_x projects it to dt (dt_rank), B and C (d_state each); dt through ssm_dt and its bias; the
selective scan ggml_ssm_scan (softplus(dt), the decays ssm_a) gives y and the layer's new state;
y + x·ssm_d, gated by silu(z) (ggml_swiglu_split), projected back by ssm_out; the residual; then
the final RMS norm and the output head (tied to the token embeddings when the file has none).

The memory is llama.cpp's recurrent one (llama-memory-recurrent.cpp) for one sequence: per layer
an F32 conv state r [(d_conv - 1)·d_inner, 1] and an F32 ssm state s [d_state·d_inner, 1] in a
CPU buffer of their own, cleared to zeros; each graph reads the states through build_rs (the
cell named by the input rs_s_copy, zeroed first when the sequence is new) and copies the new
ones back, so decoding token by token carries them. Positions play no part (no inp_pos, no
mask); the graph's shape is the token count and whether the state is new (llama.cpp's rs_z).
With ContextParams (engine/models/params.py) a prompt goes in llama.cpp's ubatches (no KV
cache: flash attention and the cache types change nothing here).
Leaves out: Mamba-2, FalconMamba's RMS norms of dt, B and C (ssm.dt_b_c_rms), several sequences,
state snapshots for rollback (n_rs_seq).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from engine.ggml import (GGML_TYPE_F32, GGML_TYPE_I32, Tensor, ggml_add,
                         ggml_build_forward_expand, ggml_concat, ggml_cont, ggml_cpy,
                         ggml_element_size, ggml_free, ggml_get_rows, ggml_init, ggml_init_params,
                         ggml_mul, ggml_mul_mat, ggml_new_graph_custom, ggml_new_tensor_2d,
                         ggml_reshape_2d, ggml_reshape_3d, ggml_reshape_4d, ggml_rms_norm,
                         ggml_scale_inplace, ggml_set_name, ggml_set_output, ggml_silu,
                         ggml_ssm_conv, ggml_ssm_scan, ggml_swiglu_split, ggml_tensor_overhead,
                         ggml_transpose, ggml_view_1d, ggml_view_2d, ggml_view_3d, ggml_view_4d)
from engine.ggml_backend import ggml_backend_buffer_free, ggml_backend_get_default_buffer_type

from .common import ModelError, ModelFile, alloc_ctx_tensors, set_input
from .decoder import Decoder
from .llm_graph import named
from .params import ContextParams
from .tokenize import tokenizer_of


@dataclass(frozen=True, slots=True)
class MambaParams:
    """Mamba's hyperparameters (llama_hparams, in part)."""

    n_vocab: int
    n_ctx_train: int
    n_embd: int
    n_layer: int
    d_conv: int  # ssm.conv_kernel: the convolution's width
    d_inner: int  # ssm.inner_size: 2 * n_embd
    d_state: int  # ssm.state_size
    dt_rank: int  # ssm.time_step_rank
    rms_eps: float

    @property
    def n_embd_r(self) -> int:  # a conv state: the last d_conv - 1 inputs of every channel
        return (self.d_conv - 1) * self.d_inner

    @property
    def n_embd_s(self) -> int:  # an ssm state: d_state per channel
        return self.d_state * self.d_inner


class RecurrentState:
    """llama_memory_recurrent for one sequence (one cell, head 0): per layer r [n_embd_r, 1] and
    s [n_embd_s, 1], F32, in a CPU backend buffer of their own cleared to zeros. `n_past` counts
    the tokens the states have seen; 0 means a new sequence, whose cell the next graph zeroes.
    `no_alloc`: a dummy buffer (a plan's, common.py)."""

    def __init__(self, hp: MambaParams, backend, no_alloc: bool = False) -> None:
        size = (2 * hp.n_layer + 1) * ggml_tensor_overhead()
        self.ctx = ggml_init(ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=True))
        self.size, self.n_past = 1, 0
        self.r: list[Tensor] = []
        self.s: list[Tensor] = []
        for il in range(hp.n_layer):
            for name, n_embd, tensors in (("r", hp.n_embd_r, self.r), ("s", hp.n_embd_s, self.s)):
                t = ggml_new_tensor_2d(self.ctx, GGML_TYPE_F32, n_embd, self.size)
                ggml_set_name(t, f"cache_{name}_l{il}")
                tensors.append(t)
        self.buffer = alloc_ctx_tensors(self.ctx, ggml_backend_get_default_buffer_type(backend),
                                        no_alloc, clear=True)

    def rs_z(self, n_past: int) -> int:
        """The cell to zero before it is read (a new sequence's), or -1 (get_rs_z)."""
        return 0 if n_past == 0 else -1

    def inputs(self, ctx, inputs: dict[str, Tensor], new) -> None:
        """rs_s_copy [n_rs]: the cell each used state is read from (build_rs_inp), viewed as the
        sequences' own (main) and the rest (extra, none here)."""
        s_copy = new("rs_s_copy", GGML_TYPE_I32, self.size)
        inputs["rs_s_copy_main"] = ggml_view_1d(ctx, s_copy, 1, 0)
        inputs["rs_s_copy_extra"] = ggml_view_1d(ctx, s_copy, self.size - 1, int(s_copy.nb[0]))

    def set_inputs(self, inputs: dict[str, Tensor]) -> None:
        set_input(inputs["rs_s_copy"], [0])  # the sequence's cell is its own source

    def read(self, ctx, gf, s: Tensor, inputs: dict[str, Tensor], rs_z: int,
             rows=ggml_get_rows) -> Tensor:
        """build_rs: zero the cell rs_z (a zero-sized view when none), then `rows(ctx, states,
        ids)` of the states (by default their rows, ggml_get_rows), and the other cells copied
        into place (none: one sequence)."""
        state_size, zero = int(s.ne[0]), rs_z >= 0
        states = ggml_reshape_2d(ctx, s, state_size, int(s.ne[1]))
        state_zero = ggml_view_1d(ctx, states, state_size * zero, rs_z * int(states.nb[1]) * zero)
        ggml_build_forward_expand(gf, ggml_scale_inplace(ctx, state_zero, 0))
        out = rows(ctx, states, inputs["rs_s_copy_main"])
        ggml_build_forward_expand(gf, out)
        extra = ggml_get_rows(ctx, states, inputs["rs_s_copy_extra"])
        n_extra = self.size - 1
        ggml_build_forward_expand(gf, ggml_cpy(ctx, extra, ggml_view_2d(
            ctx, s, state_size, n_extra, int(s.nb[1]), 1 * int(s.nb[1]))))
        return out

    def free(self) -> None:
        ggml_backend_buffer_free(self.buffer)
        ggml_free(self.ctx)


class Mamba(Decoder):
    """A Mamba GGUF opened for decoding: hyperparameters, weights, recurrent states, graph."""

    hp: MambaParams
    cache: RecurrentState
    ARCH = "mamba"

    def __init__(self, path: str | os.PathLike | ModelFile, n_ctx: int | None = None,
                 params: ContextParams | None = None) -> None:
        super().__init__()
        f = path if isinstance(path, ModelFile) else ModelFile(path)
        if f.arch != self.ARCH:
            raise ModelError(f"{f.path}: architecture '{f.arch}' is not '{self.ARCH}'")
        self.file = f
        if f.key("{arch}.ssm.dt_b_c_rms", False):
            raise ModelError(f"{f.path}: RMS norms of dt, B and C (ssm.dt_b_c_rms, FalconMamba) "
                             "are not supported")
        E = int(f.key("{arch}.embedding_length"))
        self.hp = hp = MambaParams(
            n_vocab=int(f.tensor("token_embd.weight").ne[1]),
            n_ctx_train=int(f.key("{arch}.context_length")), n_embd=E,
            n_layer=int(f.key("{arch}.block_count")),
            d_conv=int(f.key("{arch}.ssm.conv_kernel")),
            d_inner=int(f.key("{arch}.ssm.inner_size")),
            d_state=int(f.key("{arch}.ssm.state_size")),
            dt_rank=int(f.key("{arch}.ssm.time_step_rank")),
            rms_eps=float(f.key("{arch}.attention.layer_norm_rms_epsilon")),
        )
        if hp.d_inner != 2 * E:  # as llama.cpp, which supports no other expansion factor
            raise ModelError(f"{f.path}: ssm.inner_size {hp.d_inner} must be 2 * "
                             f"embedding_length ({2 * E})")
        D, S, R = hp.d_inner, hp.d_state, hp.dt_rank
        # tied embeddings: without output.weight the token table is the head too
        self.tok_embd, self.output_norm, self.output = f.token_table_and_head(E, hp.n_vocab)
        self.layers = []
        for i in range(hp.n_layer):
            t = lambda name, ne: f.tensor(f"blk.{i}.{name}", ne)  # noqa: E731
            self.layers.append(dict(
                attn_norm=t("attn_norm.weight", (E,)),
                ssm_in=t("ssm_in.weight", (E, 2 * D)),
                ssm_conv1d=t("ssm_conv1d.weight", (hp.d_conv, D)),
                ssm_conv1d_b=t("ssm_conv1d.bias", (D,)),
                ssm_x=t("ssm_x.weight", (D, R + 2 * S)),
                ssm_dt=t("ssm_dt.weight", (R, D)), ssm_dt_b=t("ssm_dt.bias", (D,)),
                ssm_a=t("ssm_a", (S, D)), ssm_d=t("ssm_d", (D,)),  # no '.weight' on these two
                ssm_out=t("ssm_out.weight", (D, E)),
            ))
        if params is not None and n_ctx is not None:
            params = params.with_(n_ctx=n_ctx)
        self.open_context(f, params, min(n_ctx or hp.n_ctx_train, hp.n_ctx_train), kv_cache=False)
        self.cache = RecurrentState(hp, f.backend, f.no_alloc)
        self.tokenizer = tokenizer_of(f)

    # --- the memory: recurrent states, not a KV cache ------------------------------------------

    def memory_inputs(self, ctx, inputs: dict[str, Tensor], new, n: int, rs_z: int) -> None:
        self.cache.inputs(ctx, inputs, new)

    def set_memory_inputs(self, inputs: dict[str, Tensor], n: int, n_past: int) -> None:
        self.cache.set_inputs(inputs)

    def memory_shape(self, n_past: int, n: int) -> int:
        return self.cache.rs_z(n_past)

    # --- the graph ----------------------------------------------------------------------------

    def graph_size(self) -> int:
        return 64 + 48 * self.hp.n_layer

    def _norm(self, ctx, x, w, il: int):
        """build_norm(LLM_NORM_RMS): rms_norm(x), named 'norm', times w."""
        return ggml_mul(ctx, named(ggml_rms_norm(ctx, x, self.hp.rms_eps), "norm", il), w)

    def build(self, ctx, n_tokens: int, rs_z: int, all_logits: bool = True):
        """The graph for n_tokens new tokens after the states (zeroed first when rs_z is 0):
        returns the graph, the inputs by name and the logits ([n_vocab, n_outputs])."""
        hp = self.hp
        gf = ggml_new_graph_custom(ctx, self.graph_size(), False)
        inputs = self.build_inputs(ctx, n_tokens, rs_z, all_logits)
        inp_out_ids = inputs.get("inp_out_ids")
        x = self.token_rows(ctx, gf, inputs, "inp_embd")  # [E, n]
        for il, L in enumerate(self.layers):
            cur = named(self._norm(ctx, x, L["attn_norm"], il), "attn_norm", il)
            cur = self.mamba_layer(ctx, gf, cur, L, inputs, rs_z, il)
            if il == hp.n_layer - 1 and inp_out_ids is not None:
                cur = ggml_get_rows(ctx, cur, inp_out_ids)
                x = ggml_get_rows(ctx, x, inp_out_ids)
            x = named(ggml_add(ctx, cur, x), "l_out", il)  # the residual
        x = named(self._norm(ctx, x, self.output_norm, -1), "result_norm", -1)
        logits = named(ggml_mul_mat(ctx, self.output, x), "result_output", -1)
        ggml_set_output(logits)
        ggml_build_forward_expand(gf, logits)
        return gf, inputs, logits

    def mamba_layer(self, ctx, gf, cur, L: dict, inputs: dict[str, Tensor], rs_z: int, il: int):
        """build_mamba_layer for one sequence of n tokens: cur [n_embd, n] -> [n_embd, n], the
        layer's conv and ssm states read and written back."""
        hp, cache = self.hp, self.cache
        d_conv, d_inner, d_state, dt_rank = hp.d_conv, hp.d_inner, hp.d_state, hp.dt_rank
        n = int(cur.ne[1])
        conv_states, ssm_states = cache.r[il], cache.s[il]
        conv = cache.read(ctx, gf, conv_states, inputs, rs_z)  # [n_embd_r, 1]
        conv = ggml_reshape_3d(ctx, conv, d_conv - 1, d_inner, 1)
        cur = ggml_reshape_3d(ctx, cur, int(cur.ne[0]), n, 1)
        xz = ggml_mul_mat(ctx, L["ssm_in"], cur)  # [2 * d_inner, n, 1]: x, then z
        x = ggml_view_3d(ctx, xz, d_inner, n, 1, int(xz.nb[1]), int(xz.nb[2]), 0)
        z = ggml_view_3d(ctx, xz, d_inner, n, 1, int(xz.nb[1]), int(xz.nb[2]),
                         d_inner * ggml_element_size(xz))

        # the convolution: each channel's last d_conv - 1 inputs, then the n new ones
        conv_x = ggml_concat(ctx, conv, ggml_transpose(ctx, x), 0)  # [d_conv - 1 + n, d_inner, 1]
        last = ggml_view_3d(ctx, conv_x, d_conv - 1, d_inner, 1, int(conv_x.nb[1]),
                            int(conv_x.nb[2]), n * int(conv_x.nb[0]))
        ggml_build_forward_expand(gf, ggml_cpy(ctx, last, ggml_view_1d(
            ctx, conv_states, (d_conv - 1) * d_inner, 0)))  # the new conv state, into cell 0
        x = ggml_ssm_conv(ctx, conv_x, L["ssm_conv1d"])  # [d_inner, n, 1]
        x = ggml_silu(ctx, ggml_add(ctx, x, L["ssm_conv1d_b"]))

        # the selective scan
        x_db = ggml_mul_mat(ctx, L["ssm_x"], x)  # [dt_rank + 2 * d_state, n, 1]: dt, B, C
        es = ggml_element_size(x_db)
        dt = ggml_view_3d(ctx, x_db, dt_rank, n, 1, int(x_db.nb[1]), int(x_db.nb[2]), 0)
        B = ggml_view_4d(ctx, x_db, d_state, 1, n, 1, d_state * int(x_db.nb[0]), int(x_db.nb[1]),
                         int(x_db.nb[2]), es * dt_rank)
        C = ggml_view_4d(ctx, x_db, d_state, 1, n, 1, d_state * int(x_db.nb[0]), int(x_db.nb[1]),
                         int(x_db.nb[2]), es * (dt_rank + d_state))
        dt = ggml_cont(ctx, dt)
        dt = ggml_add(ctx, ggml_mul_mat(ctx, L["ssm_dt"], dt), L["ssm_dt_b"])  # [d_inner, n, 1]
        xc = x
        x = ggml_reshape_4d(ctx, x, 1, d_inner, n, 1)  # heads of one channel each

        def scan(ctx, states, ids):
            ssm = ggml_reshape_4d(ctx, states, d_state, 1, d_inner, cache.size)
            return ggml_ssm_scan(ctx, ssm, x, dt, L["ssm_a"], B, C, ids)

        y_ssm = cache.read(ctx, gf, ssm_states, inputs, rs_z, scan)  # y, then the new state
        ggml_build_forward_expand(gf, ggml_cpy(
            ctx, ggml_view_1d(ctx, y_ssm, d_state * d_inner, int(x.nb[3]) * int(x.ne[3])),
            ggml_view_1d(ctx, ssm_states, d_state * d_inner, 0)))  # the new ssm state
        y = ggml_view_3d(ctx, y_ssm, d_inner, n, 1, int(x.nb[2]), int(x.nb[3]), 0)
        y = ggml_add(ctx, y, ggml_mul(ctx, xc, L["ssm_d"]))
        y = ggml_swiglu_split(ctx, ggml_cont(ctx, z), y)  # silu(z) * y
        cur = ggml_mul_mat(ctx, L["ssm_out"], y)  # [n_embd, n, 1]
        return ggml_reshape_2d(ctx, cur, int(cur.ne[0]), n)
