"""Op constructors for ggml's state-space and linear-attention ops: Mamba's short convolution
(ggml_ssm_conv) and selective scan (ggml_ssm_scan, Mamba-1 and Mamba-2), RWKV-6 and RWKV-7's WKV
(ggml_rwkv_wkv6, ggml_rwkv_wkv7), gated linear attention (ggml_gated_linear_attn) and the gated
delta rule (ggml_gated_delta_net), as ggml.c builds them in the oracle's version (0.15.3:
ggml_ssm_scan takes no snapshot count, ggml_gated_delta_net takes K).

Each only records (shape, type, sources, the GGML_ASSERTs with ggml's condition text, as ggml.c);
the kernel (engine/compute/kernels/ssm.py) computes.
"""

from __future__ import annotations

from engine.core.api import op
from engine.core.context import Context
from engine.core.errors import ggml_assert
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_are_same_shape, ggml_is_3d, ggml_is_contiguous, \
    ggml_is_contiguous_rows, ggml_is_matrix, ggml_is_vector, ggml_nelements, ggml_new_tensor, \
    ggml_new_tensor_1d, ggml_new_tensor_3d
from engine.core.types import GGMLType, ggml_type_size
from engine.ops.base import ggml_set_op_params_f32, ggml_set_op_params_i32, set_op_src, shape_of


@op
def ggml_ssm_conv(ctx: Context, sx: Tensor, c: Tensor) -> Tensor:
    """ggml_ssm_conv: Mamba's causal depthwise convolution. sx [d_conv - 1 + n_t, d_inner, n_s]
    holds each channel's last d_conv - 1 inputs then the new n_t; c [d_conv, d_inner] the kernels;
    F32 [d_inner, n_t, n_s] with result[i, t, s] = Σ_k sx[t + k, i, s] · c[k, i]."""
    fn = "ggml_ssm_conv"
    ggml_assert(ggml_is_3d(sx), "ggml_is_3d(sx)", fn, f"sx ne = {shape_of(sx)}")
    ggml_assert(ggml_is_matrix(c), "ggml_is_matrix(c)", fn, f"c ne = {shape_of(c)}")
    d_conv, d_inner = int(c.ne[0]), int(c.ne[1])
    n_t, n_s = int(sx.ne[0]) - d_conv + 1, int(sx.ne[2])
    ggml_assert(int(sx.ne[1]) == d_inner, "sx->ne[1] == d_inner", fn, f"{int(sx.ne[1])} channels, c has {d_inner}")
    ggml_assert(n_t >= 0, "n_t >= 0", fn, f"sx holds {int(sx.ne[0])} steps for a kernel of {d_conv}")
    result = ggml_new_tensor_3d(ctx, GGMLType.F32, d_inner, n_t, n_s)
    return set_op_src(result, GGMLOp.SSM_CONV, sx, c)


def _assert_contiguous(fn: str, **tensors: Tensor) -> None:
    for name, t in tensors.items():
        ggml_assert(ggml_is_contiguous(t), f"ggml_is_contiguous({name})", fn)


@op
def ggml_ssm_scan(ctx: Context, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
                  ids: Tensor) -> Tensor:
    """ggml_ssm_scan: Mamba's selective scan. s [d_state, head_dim, n_head, ≥n_seqs] the states,
    x [head_dim, n_head, n_t, n_s], dt [n_head, n_t, n_s], A [d_state or 1, n_head] (1: Mamba-2's
    scalar decay per head), B and C [d_state, n_group, n_t, n_s], ids [n_s] I32 (each sequence's
    state in s). F32 1-d: y (the elements of x) then the n_s final states."""
    fn = "ggml_ssm_scan"
    _assert_contiguous(fn, s=s, dt=dt, A=A)
    for name, t in (("x", x), ("B", B), ("C", C)):
        ggml_assert(int(t.nb[0]) == ggml_type_size(t.type), f"{name}->nb[0] == ggml_type_size({name}->type)",
                    fn)
    for name, t in (("x", x), ("B", B), ("C", C)):
        ggml_assert(int(t.nb[1]) == int(t.ne[0]) * int(t.nb[0]),
                    f"{name}->nb[1] == {name}->ne[0]*{name}->nb[0]", fn)
    ggml_assert(ggml_are_same_shape(B, C), "ggml_are_same_shape(B, C)", fn, f"B {shape_of(B)}, C {shape_of(C)}")
    ggml_assert(ids.type == GGMLType.I32, "ids->type == GGML_TYPE_I32", fn)
    d_state, head_dim, n_head = int(s.ne[0]), int(x.ne[0]), int(x.ne[1])
    n_seq_tokens, n_seqs = int(x.ne[2]), int(x.ne[3])
    checks = (
        (int(dt.ne[0]) == n_head, "dt->ne[0] == n_head"),
        (int(dt.ne[1]) == n_seq_tokens, "dt->ne[1] == n_seq_tokens"),
        (int(dt.ne[2]) == n_seqs, "dt->ne[2] == n_seqs"),
        (ggml_is_3d(dt), "ggml_is_3d(dt)"),
        (int(s.ne[1]) == head_dim, "s->ne[1] == head_dim"),
        (int(s.ne[2]) == n_head, "s->ne[2] == n_head"),
        (int(B.ne[0]) == d_state, "B->ne[0] == d_state"),
        (int(B.ne[2]) == n_seq_tokens, "B->ne[2] == n_seq_tokens"),
        (int(B.ne[3]) == n_seqs, "B->ne[3] == n_seqs"),
        (int(ids.ne[0]) == n_seqs, "ids->ne[0] == n_seqs"),
        (ggml_is_vector(ids), "ggml_is_vector(ids)"),
        (int(A.ne[1]) == n_head, "A->ne[1] == n_head"),
        (ggml_is_matrix(A), "ggml_is_matrix(A)"),
        (int(A.ne[0]) == 1 or int(A.ne[0]) == d_state, "A->ne[0] == d_state"),  # Mamba-1: a decay per state
    )
    for ok, cond in checks:
        ggml_assert(ok, cond, fn,
                    f"s {shape_of(s)}, x {shape_of(x)}, dt {shape_of(dt)}, A {shape_of(A)}, B {shape_of(B)}, "
                    f"ids {shape_of(ids)}")
    n = ggml_nelements(x) + d_state * head_dim * n_head * int(ids.ne[0])
    result = ggml_new_tensor_1d(ctx, GGMLType.F32, n)
    return set_op_src(result, GGMLOp.SSM_SCAN, s, x, dt, A, B, C, ids)


def _linear_attn(ctx: Context, fn: str, op: GGMLOp, lead: Tensor, same: dict, state: Tensor,
                 srcs: tuple) -> Tensor:
    """What ggml_rwkv_wkv6, ggml_gated_linear_attn and ggml_rwkv_wkv7 share: S, H, n_tokens from
    `lead` ([S, H, n_tokens]), n_seqs from state->ne[1]; F32 [S*H, n_tokens + S*n_seqs] (the
    outputs, then the final states)."""
    S, H, n_tokens = int(lead.ne[0]), int(lead.ne[1]), int(lead.ne[2])
    n_seqs = int(state.ne[1])
    for name, t in same.items():
        ggml_assert(int(t.ne[0]) == S and int(t.ne[1]) == H and int(t.ne[2]) == n_tokens,
                    f"{name}->ne[0] == S && {name}->ne[1] == H && {name}->ne[2] == n_tokens", fn,
                    f"{name} ne = {shape_of(t)}, S = {S}, H = {H}, n_tokens = {n_tokens}")
    ggml_assert(ggml_nelements(state) == S * S * H * n_seqs, "ggml_nelements(state) == S * S * H * n_seqs",
                fn, f"state ne = {shape_of(state)}")
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [S * H, n_tokens + S * n_seqs, 1, 1])
    return set_op_src(result, op, *srcs)


@op
def ggml_rwkv_wkv6(ctx: Context, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor,
                   state: Tensor) -> Tensor:
    """ggml_rwkv_wkv6: RWKV-6's WKV. k, v, r, td [S, H, n_tokens], tf [S, H] (time_first),
    state [S*S*H, n_seqs]; out = r·(tf⊙kvᵀ + state), state = td⊙state + kvᵀ, token by token."""
    fn = "ggml_rwkv_wkv6"
    _assert_contiguous(fn, k=k, v=v, r=r, tf=tf, td=td, state=state)
    return _linear_attn(ctx, fn, GGMLOp.RWKV_WKV6, k, {"v": v, "r": r, "td": td}, state,
                        (k, v, r, tf, td, state))


@op
def ggml_gated_linear_attn(ctx: Context, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor,
                           scale: float) -> Tensor:
    """ggml_gated_linear_attn: gated linear attention. k, v, q, g [S, H, n_tokens], state
    [S*S*H, n_seqs]; state = g⊙state + kvᵀ, out = (scale·q)·state; op_params {scale}."""
    fn = "ggml_gated_linear_attn"
    _assert_contiguous(fn, k=k, v=v, q=q, g=g, state=state)
    result = _linear_attn(ctx, fn, GGMLOp.GATED_LINEAR_ATTN, k, {"v": v, "q": q, "g": g}, state,
                          (k, v, q, g, state))
    ggml_set_op_params_f32(result, 0, scale)
    return result


@op
def ggml_rwkv_wkv7(ctx: Context, r: Tensor, w: Tensor, k: Tensor, v: Tensor, a: Tensor, b: Tensor,
                   state: Tensor) -> Tensor:
    """ggml_rwkv_wkv7: RWKV-7's WKV. r, w, k, v, a, b [S, H, n_tokens], state [S*S*H, n_seqs];
    state = state·diag(w) + v kᵀ + (state·a) bᵀ, out = state·r, token by token."""
    fn = "ggml_rwkv_wkv7"
    _assert_contiguous(fn, r=r, w=w, k=k, v=v, a=a, b=b, state=state)
    return _linear_attn(ctx, fn, GGMLOp.RWKV_WKV7, k, {"w": w, "k": k, "v": v, "a": a, "b": b}, state,
                        (r, w, k, v, a, b, state))


@op
def ggml_gated_delta_net(ctx: Context, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor,
                         state: Tensor, K: int) -> Tensor:
    """ggml_gated_delta_net: the gated delta rule. q, k [S_v, H_qk, n_tokens, n_seqs_qk] (heads and
    sequences broadcast), v [S_v, H, n_tokens, n_seqs], g [1 or S_v (KDA), H, n_tokens, n_seqs],
    beta [1, H, n_tokens, n_seqs], state [S_v, S_v, H, n_seqs]; F32 [S_v*H, n_tokens*n_seqs +
    K*S_v*n_seqs]: the outputs, then K state snapshots (slot 0 the newest); op_params {K}."""
    fn = "ggml_gated_delta_net"
    for name, t in (("q", q), ("k", k), ("v", v)):
        ggml_assert(ggml_is_contiguous_rows(t), f"ggml_is_contiguous_rows({name})", fn)
    _assert_contiguous(fn, g=g, beta=beta, state=state)
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta), ("state", state)):
        ggml_assert(t.type == GGMLType.F32, f"{name}->type == GGML_TYPE_F32", fn)
    S_v, H, n_tokens, n_seqs = (int(n) for n in v.ne)
    ggml_assert(int(g.ne[0]) == 1 or int(g.ne[0]) == S_v, "g->ne[0] == 1 || g->ne[0] == S_v", fn,
                f"g ne = {shape_of(g)}")
    ggml_assert(int(beta.ne[0]) == 1, "beta->ne[0] == 1", fn, f"beta ne = {shape_of(beta)}")
    for i, want, name in ((0, S_v, "S_v"), (1, S_v, "S_v"), (2, H, "H"), (3, n_seqs, "n_seqs")):
        ggml_assert(int(state.ne[i]) == want, f"state->ne[{i}] == {name}", fn, f"state ne = {shape_of(state)}")
    ggml_assert(K >= 1, "K >= 1", fn, f"K = {K}")
    result = ggml_new_tensor(ctx, GGMLType.F32, 4, [S_v * H, n_tokens * n_seqs + K * S_v * n_seqs, 1, 1])
    ggml_set_op_params_i32(result, 0, int(K))
    return set_op_src(result, GGMLOp.GATED_DELTA_NET, q, k, v, g, beta, state)
