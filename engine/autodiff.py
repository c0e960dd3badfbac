"""Automatic differentiation: ggml_build_backward_expand and each op's backward rule.

Mirrors ggml.c. A graph made with `grads=True` has two arrays beside its hash set, `grads` and
`grad_accs`, one slot per hash slot. ggml_build_backward_expand walks the forward nodes once to
decide which need a gradient (parameters, the loss, and everything between), gives the loss a
gradient accumulator, then visits the forward nodes from last to first: each node's backward rule
builds new nodes in the same context (a MUL for MUL's inputs, an OUT_PROD for MUL_MAT's, a
SILU_BACK for SILU ...), records them in `grads` and expands the graph with them, so the
backward nodes follow the forward ones in the one node list. Where a tensor already has a
gradient, the new contribution is added to it (in place when it is an accumulator).

Leaves out: ggml_build_backward_gradient_checkpointing (not in ggml 0.15.3's ggml.h).
"""

from __future__ import annotations

from typing import Callable

from engine.core.api import writes
from engine.core.errors import GGMLAssertionError, ggml_assert, ggml_assert_not_null
from engine.core.graph import GGML_HASHSET_FULL, Graph, ggml_build_forward_expand, ggml_graph_cpy, \
    ggml_graph_get_grad, ggml_graph_get_grad_acc, ggml_new_graph_custom
from engine.core.layout import GGML_MAX_DIMS, GGML_MAX_SRC
from engine.core.optable import GGMLGluOp, GGMLOp, GGMLUnaryOp
from engine.core.tensor import GGML_TENSOR_FLAG_LOSS, GGML_TENSOR_FLAG_PARAM, Tensor, \
    ggml_are_same_shape, ggml_element_size, ggml_format_name, ggml_is_contiguous, ggml_is_scalar, \
    ggml_nbytes, ggml_nelements, ggml_new_tensor
from engine.core.tensor_data import data_bytes
from engine.core.types import GGMLType
from engine.ops.backward import ggml_cross_entropy_loss_back, ggml_get_rows_back, ggml_im2col_back, \
    ggml_pool_2d_back, ggml_repeat_back, ggml_rms_norm_back, ggml_silu_back, ggml_soft_max_ext_back
from engine.ops.base import ggml_get_op_params_i32
from engine.ops.math import ggml_acc, ggml_acc_inplace, ggml_add, ggml_add1, ggml_add1_inplace, \
    ggml_add_inplace, ggml_div, ggml_mean, ggml_mul, ggml_repeat, ggml_scale, ggml_sub, ggml_sub_inplace
from engine.ops.matmul import ggml_out_prod
from engine.ops.nn import ggml_diag_mask_zero
from engine.ops.rope import ggml_rope_ext_back, ggml_rope_multi_back
from engine.ops.unary import ggml_cos, ggml_exp, ggml_neg, ggml_sgn, ggml_sigmoid, ggml_silu, ggml_sin, \
    ggml_step
from engine.ops.views import ggml_cont, ggml_permute, ggml_reshape, ggml_transpose, ggml_view_4d

O = GGMLOp
U = GGMLUnaryOp


# --- reading a graph's gradients ----------------------------------------------------------------

@writes()
def ggml_graph_dup(ctx, g: Graph, force_grads: bool) -> Graph:
    """ggml_graph_dup: a new graph of the same size (with gradients if g has them or
    force_grads), holding a copy of g."""
    result = ggml_new_graph_custom(ctx, g.size, g.grad_addresses is not None or force_grads)
    ggml_graph_cpy(g, result)
    return result


@writes()
def ggml_set_zero(t: Tensor) -> Tensor:
    """ggml_set_zero: every byte of t's data to 0."""
    if ggml_nelements(t) > 0:
        ggml_assert(t.data is not None, "tensor->data", "ggml_set_zero")
        data_bytes(t, ggml_nbytes(t))[:] = 0
    return t


@writes()
def ggml_graph_reset(g: Graph | None) -> None:
    """ggml_graph_reset: loss accumulators to 1, every other gradient accumulator to 0, and the
    AdamW moments of OPT_STEP_ADAMW nodes to 0."""
    if g is None:
        return
    ggml_assert(g.grad_addresses is not None, "cgraph->grads != NULL", "ggml_graph_reset")
    for node in g.nodes:
        acc = ggml_graph_get_grad_acc(g, node)
        if node.op == O.OPT_STEP_ADAMW:
            ggml_set_zero(node.source(2))
            ggml_set_zero(node.source(3))
        if acc is None:
            continue
        if node.flags & GGML_TENSOR_FLAG_LOSS:
            ggml_assert(acc.type == GGMLType.F32, "grad_acc->type == GGML_TYPE_F32",
                        "ggml_graph_reset")
            ggml_assert(ggml_is_scalar(acc), "ggml_is_scalar(grad_acc)", "ggml_graph_reset")
            data_bytes(acc, 4).view("<f4")[0] = 1.0
        else:
            ggml_set_zero(acc)


# --- adding a contribution to a gradient -------------------------------------------------------

class _Backward:
    """One ggml_build_backward_expand: the graph, its context and which slots need gradients."""

    def __init__(self, ctx, g: Graph, needed: set[int]) -> None:
        self.ctx, self.g, self.needed = ctx, g, needed
        tables = g.grad_tables
        assert tables is not None  # (ggml_build_backward_expand asserts cgraph->grads)
        self.grads, self.accs = tables

    def slot(self, t: Tensor | None) -> int | None:
        return None if t is None else self.g.slot_of(t)

    def needs(self, t: Tensor | None) -> bool:
        """Does t (a src of the node being differentiated) need a gradient?"""
        slot = self.slot(t)
        return slot is not None and slot in self.needed

    def grad_of(self, t: Tensor) -> Tensor | None:
        a = int(self.grads[self.slot(t)])
        return self.g.tensor(a) if a else None

    def _set(self, src: Tensor, grad: Tensor) -> None:
        """Record grad as src's gradient, name it and add it to the graph."""
        self.grads[self.slot(src)] = grad.address
        ggml_format_name(grad, "grad for %s", src.name_bytes)
        ggml_build_forward_expand(self.g, grad)

    def in_place(self, src: Tensor) -> bool:
        return bool(int(self.accs[self.slot(src)]))

    def add_or_set(self, src: Tensor, t: Tensor) -> None:
        """ggml_add_or_set."""
        old = self.grad_of(src)
        if old is not None:
            t = (ggml_add_inplace if self.in_place(src) else ggml_add)(self.ctx, old, t)
        self._set(src, t)

    def sub_or_set(self, src: Tensor, t: Tensor) -> None:
        """ggml_sub_or_set."""
        old = self.grad_of(src)
        t = (ggml_sub_inplace if self.in_place(src) else ggml_sub)(self.ctx, old, t) \
            if old is not None else ggml_neg(self.ctx, t)
        self._set(src, t)

    def add1_or_set(self, src: Tensor, t: Tensor) -> None:
        """ggml_add1_or_set."""
        old = self.grad_of(src)
        t = (ggml_add1_inplace if self.in_place(src) else ggml_add1)(self.ctx, old, t) \
            if old is not None else ggml_repeat(self.ctx, t, src)
        self._set(src, t)

    def acc_or_set(self, src: Tensor, t: Tensor, nb1: int, nb2: int, nb3: int,
                   offset: int) -> None:
        """ggml_acc_or_set: into a zero tensor shaped like src (scale by 0) the first time."""
        old = self.grad_of(src)
        if old is not None:
            acc = ggml_acc_inplace if self.in_place(src) else ggml_acc
            t = acc(self.ctx, old, t, nb1, nb2, nb3, offset)
        else:
            t = ggml_acc(self.ctx, ggml_scale(self.ctx, src, 0.0), t, nb1, nb2, nb3, offset)
        self._set(src, t)


# --- ggml_build_backward_expand ---------------------------------------------------------------

def _ignored_srcs(node: Tensor) -> set[int]:
    """The srcs whose gradients cannot reach node's output (shapes, indices, positions)."""
    if node.op in (O.IM2COL, O.IM2COL_BACK):
        return {0}
    if node.op == O.UNARY and int(node.op_params[0]) in (U.SGN, U.STEP):
        return {0}
    if node.op in (O.CPY, O.GET_ROWS, O.GET_ROWS_BACK, O.ROPE):
        return {1}
    return set()


@writes()
def ggml_build_backward_expand(ctx, g: Graph, grad_accs: list[Tensor | None] | None = None) -> None:
    """ggml_build_backward_expand: append the backward pass of g's loss to g.

    grad_accs, if given, holds a gradient accumulator (or None) for each forward node by index.
    """
    fn = "ggml_build_backward_expand"
    ggml_assert(g.n_nodes > 0, "cgraph->n_nodes > 0", fn)
    grads, accs = ggml_assert_not_null(g.grad_tables, "cgraph->grads", fn,
                                       "make the graph with ggml_new_graph_custom(ctx, size, grads=True)")
    forward = g.nodes
    grads[:] = 0
    accs[:] = 0
    ggml_assert(any(n.flags & GGML_TENSOR_FLAG_PARAM for n in forward),
                "any_params && \"no trainable parameters found, did you forget to call "
                "ggml_set_param?\"", fn)
    ggml_assert(any(n.flags & GGML_TENSOR_FLAG_LOSS for n in forward),
                "any_loss && \"no training loss found, did you forget to call ggml_set_loss?\"",
                fn)

    needed: set[int] = set()
    for i, node in enumerate(forward):
        if node.type == GGMLType.I32:
            continue
        needs = bool(node.flags & (GGML_TENSOR_FLAG_PARAM | GGML_TENSOR_FLAG_LOSS))
        ignored = _ignored_srcs(node)
        for j in range(GGML_MAX_SRC):
            src = node.src[j]
            if src is None or j in ignored or g.hash_find(src) not in needed:
                continue
            ggml_assert(src.type in (GGMLType.F32, GGMLType.F16),
                        "node->src[j]->type == GGML_TYPE_F32 || node->src[j]->type == "
                        "GGML_TYPE_F16", fn)
            needs = True
            break
        if not needs:
            continue
        ggml_assert(node.view_src is None or node.op in (O.CPY, O.VIEW, O.RESHAPE, O.PERMUTE,
                                                          O.TRANSPOSE),
                    "!node->view_src || node->op == GGML_OP_CPY || node->op == GGML_OP_VIEW || "
                    "node->op == GGML_OP_RESHAPE || node->op == GGML_OP_PERMUTE || node->op == "
                    "GGML_OP_TRANSPOSE", fn, f"'{node.name}' is an in-place "
                    f"{GGMLOp(node.op).name}: in-place ops cannot be differentiated")
        slot = g.hash_find(node)
        ggml_assert(slot != GGML_HASHSET_FULL, "ihash != GGML_HASHSET_FULL", fn)
        ggml_assert(g.is_used(slot), "ggml_bitset_get(cgraph->visited_hash_set.used, ihash)", fn)
        given = grad_accs[i] if grad_accs is not None else None
        if given is not None:
            accs[slot] = grads[slot] = given.address
        elif node.flags & GGML_TENSOR_FLAG_LOSS:  # a loss always gets an accumulator
            acc = ggml_new_tensor(ctx, GGMLType.F32, GGML_MAX_DIMS, [int(x) for x in node.ne])
            accs[slot] = grads[slot] = acc.address
        needed.add(slot)

    bw = _Backward(ctx, g, needed)
    for node in reversed(forward):
        _compute_backward(bw, node)


def _compute_backward(bw: _Backward, tensor: Tensor) -> None:
    """ggml_compute_backward: the gradient contributions of one forward node to its srcs."""
    grad = ggml_graph_get_grad(bw.g, tensor)
    if grad is None:
        return
    ctx = bw.ctx
    src0, src1, src2 = tensor.src[0], tensor.src[1], tensor.src[2]
    n0, n1, n2 = bw.needs(src0), bw.needs(src1), bw.needs(src2)
    rule = _RULES.get(tensor.op)
    if rule is None:
        raise GGMLAssertionError("false", "ggml_compute_backward",
                                 f"unsupported ggml op for backward pass: {GGMLOp(tensor.op).name}")
    rule(bw, ctx, tensor, grad, src0, src1, src2, n0, n1)
    fn = "ggml_compute_backward"
    for src, needed, k in ((src0, n0, 0), (src1, n1, 1), (src2, n2, 2)):
        if needed:
            src_grad = bw.grad_of(src) if src is not None else None
            assert src is not None and src_grad is not None  # (needed: the rule gave it a gradient)
            ggml_assert(ggml_are_same_shape(src, src_grad),
                        f"!src{k}_needs_grads || ggml_are_same_shape(src{k}, "
                        f"cgraph->grads[isrc{k}])", fn)


# Each rule: (bw, ctx, tensor, grad, src0, src1, src2, src0 needs grad, src1 needs grad)

def _dup(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, grad)


def _add(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, grad)
    if n1:
        bw.add_or_set(s1, grad if ggml_are_same_shape(s0, s1) else ggml_repeat_back(ctx, grad, s1))


def _add1(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, grad)
    if n1:
        bw.add_or_set(s1, ggml_mean(ctx, grad))  # as ggml (a mean, not a sum)


def _acc_rule(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, grad)
    if n1:
        nb1, nb2, nb3, offset = (ggml_get_op_params_i32(t, i) for i in range(4))
        view = ggml_view_4d(ctx, grad, *(int(x) for x in s1.ne), nb1, nb2, nb3, offset)
        bw.add_or_set(s1, ggml_reshape(ctx, ggml_cont(ctx, view), s1))


def _sub(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, grad)
    if n1:
        bw.sub_or_set(s1, grad)


def _mul(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_mul(ctx, grad, s1))
    if n1:
        tmp = ggml_mul(ctx, s0, grad)
        bw.add_or_set(s1, tmp if ggml_are_same_shape(s0, s1) else ggml_repeat_back(ctx, tmp, s1))


def _div(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_div(ctx, grad, s1))
    if n1:
        bw.sub_or_set(s1, ggml_mul(ctx, grad, ggml_div(ctx, t, s1)))


def _sqr(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_scale(ctx, ggml_mul(ctx, s0, grad), 2.0))


def _sqrt(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_scale(ctx, ggml_div(ctx, grad, t), 0.5))


def _log(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_div(ctx, grad, s0))


def _sin(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_mul(ctx, grad, ggml_cos(ctx, s0)))


def _cos(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.sub_or_set(s0, ggml_mul(ctx, grad, ggml_sin(ctx, s0)))


def _sum(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add1_or_set(s0, grad)


def _sum_rows(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_repeat(ctx, grad, s0))


def _mean(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add1_or_set(s0, ggml_scale(ctx, grad, 1.0 / int(s0.ne[0])))


def _repeat(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_repeat_back(ctx, grad, s0))


def _repeat_back(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_repeat(ctx, grad, s0))


def _rms_norm(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        eps = float(t.op_params.view("<f4")[0])
        bw.add_or_set(s0, ggml_rms_norm_back(ctx, grad, s0, eps))


def _mul_mat(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    # t: [m, p, qq, rr], s0: [n, m, q1, r1], s1: [n, p, qq, rr]
    fn = "ggml_compute_backward"
    if n0:
        ggml_assert(int(grad.ne[2]) == int(s1.ne[2]), "grad->ne[2] == src1->ne[2]", fn)
        ggml_assert(int(grad.ne[3]) == int(s1.ne[3]), "grad->ne[3] == src1->ne[3]", fn)
        tmp = ggml_out_prod(ctx, s1, grad)  # [n, m, qq, rr]
        if not ggml_are_same_shape(tmp, s0):  # s0 was broadcast over dims 2 and 3
            ggml_assert(int(tmp.ne[0]) == int(s0.ne[0]), "tmp->ne[0] == src0->ne[0]", fn)
            ggml_assert(int(tmp.ne[1]) == int(s0.ne[1]), "tmp->ne[1] == src0->ne[1]", fn)
            ggml_assert(int(tmp.ne[3]) == 1, "tmp->ne[3] == 1", fn)
            nr2 = int(tmp.ne[2]) // int(s0.ne[2])
            nb2, nb3 = int(tmp.nb[2]) * nr2, int(tmp.nb[2])
            tmp = ggml_view_4d(ctx, tmp, int(s0.ne[0]), int(s0.ne[1]), int(s0.ne[2]), nr2,
                               int(tmp.nb[1]), nb2, nb3, 0)
            tmp = ggml_repeat_back(ctx, tmp, s0)
        bw.add_or_set(s0, tmp)
    if n1:  # the transpose of the (smaller) gradient rather than of src0
        bw.add_or_set(s1, ggml_out_prod(ctx, s0, ggml_transpose(ctx, grad)))


def _scale_rule(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_scale(ctx, grad, float(t.op_params.view("<f4")[0])))


def _set_rule(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    nb1, nb2, nb3, offset = (ggml_get_op_params_i32(t, i) for i in range(4))
    view = None
    if n0 or n1:
        fn = "ggml_compute_backward"
        ggml_assert(s0.type == t.type, "src0->type == tensor->type", fn)
        g0 = bw.grad_of(s0)
        ggml_assert(g0 is None or g0.type == grad.type,
                    "!cgraph->grads[isrc0] || cgraph->grads[isrc0]->type == grad->type", fn)
        g1 = bw.grad_of(s1)
        ggml_assert(g1 is None or not n1 or g1.type == grad.type,
                    "!cgraph->grads[isrc1] || !src1_needs_grads || cgraph->grads[isrc1]->type "
                    "== grad->type", fn)
        view = ggml_view_4d(ctx, grad, *(int(x) for x in s1.ne), nb1, nb2, nb3, offset)
    if n0:
        tmp = ggml_neg(ctx, view)
        bw.add_or_set(s0, ggml_acc(ctx, grad, tmp, nb1, nb2, nb3, offset))
    if n1:
        bw.add_or_set(s1, ggml_reshape(ctx, ggml_cont(ctx, view), s1))


def _cpy(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:  # the copy's target gets no gradient (its old values are overwritten)
        bw.add_or_set(s0, ggml_reshape(ctx, grad, s0))


def _cont(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        fn = "ggml_compute_backward"
        g0 = bw.grad_of(s0)
        ggml_assert(g0 is None or ggml_is_contiguous(g0),
                    "!cgraph->grads[isrc0] || ggml_is_contiguous(cgraph->grads[isrc0])", fn)
        ggml_assert(ggml_is_contiguous(grad), "ggml_is_contiguous(grad)", fn)
        ggml_assert(ggml_nelements(t) == ggml_nelements(s0),
                    "ggml_nelements(tensor) == ggml_nelements(src0)", fn)
        bw.add_or_set(s0, grad if ggml_are_same_shape(t, s0) else ggml_reshape(ctx, grad, s0))


def _reshape(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        cont = grad if ggml_is_contiguous(grad) else ggml_cont(ctx, grad)
        bw.add_or_set(s0, ggml_reshape(ctx, cont, s0))


def _view(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if not n0:
        return
    offset = int(t.op_params.view("<u8")[0])
    nb1, nb2, nb3 = int(t.nb[1]), int(t.nb[2]), int(t.nb[3])
    g0 = bw.grad_of(s0)
    if g0 is not None and s0.type != g0.type:  # the gradient is F32, src0 another type
        fn = "ggml_compute_backward"
        ng, n_0 = ggml_element_size(g0), ggml_element_size(s0)
        for v, c in ((offset, "offset"), (nb1, "nb1"), (nb2, "nb2"), (nb3, "nb3")):
            ggml_assert(v % n_0 == 0, f"{c} % n0 == 0", fn)
        offset, nb1, nb2, nb3 = ((v // n_0) * ng for v in (offset, nb1, nb2, nb3))
    bw.acc_or_set(s0, grad, nb1, nb2, nb3, offset)


def _permute(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        axes = [ggml_get_op_params_i32(t, i) & 3 for i in range(4)]
        back = [0, 0, 0, 0]
        for k, axis in enumerate(axes):
            back[axis] = k
        bw.add_or_set(s0, ggml_permute(ctx, grad, *back))


def _transpose(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_transpose(ctx, grad))


def _get_rows(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:  # the row indices get no gradient
        bw.add_or_set(s0, ggml_get_rows_back(ctx, grad, s1, s0))


def _diag_mask(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_diag_mask_zero(ctx, grad, ggml_get_op_params_i32(t, 0)))


def _soft_max(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        scale, max_bias = (float(x) for x in t.op_params.view("<f4")[:2])
        bw.add_or_set(s0, ggml_soft_max_ext_back(ctx, grad, t, scale, max_bias))
    ggml_assert(s1 is None or not n1, "(!src1 || !src1_needs_grads) && \"backward pass for "
                "softmax mask not implemented\"", "ggml_compute_backward")


def _rope(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        p = t.op_params
        n_dims, mode, n_ctx_orig = (int(p[i]) for i in (1, 2, 4))
        f = p.view("<f4")
        freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow = \
            (float(f[i]) for i in range(5, 11))
        if int(grad.ne[2]) == int(s1.ne[0]):
            back = ggml_rope_ext_back(ctx, grad, s1, s2, n_dims, mode, n_ctx_orig, freq_base,
                                      freq_scale, ext_factor, attn_factor, beta_fast, beta_slow)
        else:
            sections = [int(p[i]) for i in range(11, 15)]
            back = ggml_rope_multi_back(ctx, grad, s1, s2, n_dims, sections, mode, n_ctx_orig,
                                        freq_base, freq_scale, ext_factor, attn_factor,
                                        beta_fast, beta_slow)
        bw.add_or_set(s0, back)
    ggml_assert(s2 is None or not bw.needs(s2), "(!src2 || !src2_needs_grads) && \"gradients "
                "for freq factors not implemented\"", "ggml_compute_backward")


def _im2col(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n1:
        s_0, s_1, p0, p1, d0, d1, is_2d = (ggml_get_op_params_i32(t, i) for i in range(7))
        bw.add_or_set(s1, ggml_im2col_back(ctx, grad, s0, [int(x) for x in s1.ne], s_0, s_1,
                                           p0, p1, d0, d1, is_2d == 1))


def _pool_2d(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        op, k0, k1, st0, st1, p0, p1 = (ggml_get_op_params_i32(t, i) for i in range(7))
        bw.add_or_set(s0, ggml_pool_2d_back(ctx, grad, s0, op, k0, k1, st0, st1, p0, p1))


def _unary(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    uop = int(t.op_params[0])
    if uop in (U.SGN, U.STEP):
        return  # piecewise constant
    if uop == U.NEG:
        if n0:
            bw.sub_or_set(s0, grad)
        return
    rules = {
        U.ABS: lambda: ggml_mul(ctx, ggml_sgn(ctx, s0), grad),
        U.RELU: lambda: ggml_mul(ctx, ggml_step(ctx, s0), grad),
        U.SILU: lambda: ggml_silu_back(ctx, grad, s0),
        U.EXP: lambda: ggml_mul(ctx, t, grad),
        U.EXPM1: lambda: ggml_mul(ctx, grad, ggml_exp(ctx, s0)),
        U.SOFTPLUS: lambda: ggml_mul(ctx, grad, ggml_sigmoid(ctx, s0)),
    }
    ggml_assert(uop in rules, "false", "ggml_compute_backward",
                f"unsupported unary op for backward pass: {U(uop).name.lower()}")
    if n0:
        bw.add_or_set(s0, rules[uop]())


def _glu(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    gop = int(t.op_params[0])
    ggml_assert(gop == GGMLGluOp.SWIGLU, "false", "ggml_compute_backward",
                f"unsupported glu op for backward pass: {GGMLGluOp(gop).name.lower()}")
    if n0:
        ggml_assert(s1 is not None, "src1 && \"backward pass only implemented for split swiglu\"",
                    "ggml_compute_backward")
        bw.add_or_set(s0, ggml_silu_back(ctx, ggml_mul(ctx, grad, s1), s0))
    if n1:
        bw.add_or_set(s1, ggml_mul(ctx, ggml_silu(ctx, s0), grad))


def _cross_entropy_loss(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    if n0:
        bw.add_or_set(s0, ggml_cross_entropy_loss_back(ctx, grad, s0, s1))
    ggml_assert(not n1, "!src1_needs_grads && \"backward pass for labels not implemented\"",
                "ggml_compute_backward")


def _none(bw, ctx, t, grad, s0, s1, s2, n0, n1):
    pass


_RULES: dict[int, Callable[..., None]] = {  # by a node's op (its number)
    O.DUP: _dup, O.ADD: _add, O.ADD1: _add1, O.ACC: _acc_rule, O.SUB: _sub, O.MUL: _mul,
    O.DIV: _div, O.SQR: _sqr, O.SQRT: _sqrt, O.LOG: _log, O.SIN: _sin, O.COS: _cos, O.SUM: _sum,
    O.SUM_ROWS: _sum_rows, O.MEAN: _mean, O.REPEAT: _repeat, O.REPEAT_BACK: _repeat_back,
    O.RMS_NORM: _rms_norm, O.MUL_MAT: _mul_mat, O.SCALE: _scale_rule, O.SET: _set_rule,
    O.CPY: _cpy, O.CONT: _cont, O.RESHAPE: _reshape, O.VIEW: _view, O.PERMUTE: _permute,
    O.TRANSPOSE: _transpose, O.GET_ROWS: _get_rows, O.DIAG_MASK_INF: _diag_mask,
    O.DIAG_MASK_ZERO: _diag_mask, O.SOFT_MAX: _soft_max, O.ROPE: _rope, O.IM2COL: _im2col,
    O.POOL_2D: _pool_2d, O.UNARY: _unary, O.WIN_PART: _unary, O.WIN_UNPART: _unary,
    O.CROSS_ENTROPY_LOSS: _cross_entropy_loss, O.GLU: _glu, O.NONE: _none,
}
