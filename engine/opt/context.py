"""ggml-opt's optimization context: the forward graph's loss, the gradient and optimizer graphs
built from it, and each step's allocation (ggml_opt_alloc) and computation (ggml_opt_eval)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np

from engine import libm
from engine.backend.ctx_alloc import ggml_backend_alloc_ctx_tensors, ggml_backend_alloc_ctx_tensors_from_buft
from engine.backend.buffer import (
    Buffer,
    buffer_field,
    ggml_backend_buffer_free,
    ggml_backend_cpu_buffer_type,
    ggml_backend_tensor_get,
    ggml_backend_tensor_set,
    set_buffer_field,
)
from engine.backend.sched import Sched
from engine.backend.sched_api import (
    ggml_backend_sched_alloc_graph, ggml_backend_sched_get_backend,
    ggml_backend_sched_graph_compute, ggml_backend_sched_reset,
)
from engine.core.api import Writes, query, writes
from engine.core.context import Context, ggml_free, ggml_init, ggml_init_params, ggml_tensor_overhead
from engine.core.cxxrandom import Mt19937
from engine.core.errors import GGMLAbortError, ggml_assert, ggml_assert_not_null
from engine.ggml import (
    GGML_DEFAULT_GRAPH_SIZE,
    GGML_MAX_DIMS,
    GGML_TENSOR_FLAG_LOSS,
    GGML_TENSOR_FLAG_PARAM,
    GGMLType,
    ggml_argmax,
    ggml_build_backward_expand,
    ggml_build_forward_expand,
    ggml_count_equal,
    ggml_cross_entropy_loss,
    ggml_dup_tensor,
    ggml_format_name,
    ggml_graph_dup,
    ggml_graph_get_grad,
    ggml_graph_get_grad_acc,
    ggml_graph_overhead_custom,
    ggml_graph_reset,
    ggml_is_scalar,
    ggml_nbytes,
    ggml_nelements,
    ggml_new_graph_custom,
    ggml_new_tensor,
    ggml_new_tensor_1d,
    ggml_opt_step_adamw,
    ggml_opt_step_sgd,
    ggml_scale,
    ggml_set_input,
    ggml_set_loss,
    ggml_set_name,
    ggml_set_output,
    ggml_sqr,
    ggml_sub,
    ggml_sum,
)
from engine.core.graph import GGML_HASHSET_FULL, Graph
from engine.opt.params import (
    GGML_OPT_BUILD_TYPE_FORWARD,
    GGML_OPT_BUILD_TYPE_GRAD,
    GGML_OPT_BUILD_TYPE_OPT,
    GGML_OPT_LOSS_TYPE_CROSS_ENTROPY,
    GGML_OPT_LOSS_TYPE_MEAN,
    GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR,
    GGML_OPT_LOSS_TYPE_SUM,
    GGML_OPT_OPTIMIZER_TYPE_ADAMW,
    GGML_OPT_OPTIMIZER_TYPE_SGD,
    ggml_opt_optimizer_name,
    ggml_opt_params,
)
from engine.core.tensor import Tensor

if TYPE_CHECKING:
    from engine.opt.results import OptResult

F32 = np.float32

@dataclass(eq=False)
class OptContext:
    """struct ggml_opt_context. Its pointers are NULL (None) until ggml_opt_init,
    ggml_opt_prepare_alloc or ggml_opt_build set them; ggml reads them unchecked from then on."""
    backend_sched: Sched
    ctx_compute: Context | None
    loss_type: int
    build_type: int
    build_type_alloc: int
    inputs: Tensor | None
    outputs: Tensor | None
    opt_period: int
    get_opt_pars: Callable
    get_opt_pars_ud: object
    optimizer: int
    static_graphs: bool = False
    rng: Mt19937 = field(default_factory=Mt19937)
    allocated_graph: Graph | None = None
    allocated_graph_copy: Graph | None = None
    ctx_static: Context | None = None
    ctx_cpu: Context | None = None
    ctx_copy: Context | None = None
    buf_static: Buffer | None = None
    buf_cpu: Buffer | None = None
    labels: Tensor | None = None
    loss: Tensor | None = None
    pred: Tensor | None = None
    ncorrect: Tensor | None = None
    gf: Graph | None = None
    gb_grad: Graph | None = None
    gb_opt: Graph | None = None
    eval_ready: bool = False
    grad_accs: list[Tensor | None] = field(default_factory=list)
    grad_m: list[Tensor | None] = field(default_factory=list)
    grad_v: list[Tensor | None] = field(default_factory=list)
    iter: int = 1
    opt_i: int = 0
    loss_per_datapoint: bool = False
    opt_step_params: Tensor | None = None


def _map_tensor(tensor_map: dict, ctx: Context, t: Tensor) -> Tensor:
    """A copy of t in ctx sharing its data and buffer, its sources and view_src copied too."""
    if t in tensor_map:
        return tensor_map[t]
    new = ggml_dup_tensor(ctx, t)
    tensor_map[t] = new
    new.op = t.op
    new.nb[:] = t.nb
    new.flags = t.flags
    new.op_params[:] = t.op_params
    ggml_set_name(new, t.name_bytes)
    new.data = t.data
    set_buffer_field(new, buffer_field(t))
    new.view_offs = t.view_offs
    view_src = t.view_src
    new.view_src = None if view_src is None else _map_tensor(tensor_map, ctx, view_src)
    for i, s in enumerate(t.src):
        new.src[i] = None if s is None else _map_tensor(tensor_map, ctx, s)
    return new


def dup_graph(ctx: Context, src: Graph) -> Graph:
    """ggml-opt's dup_graph: every leaf and node copied into ctx (in the same order), and each
    node's gradient and accumulator pointers carried over."""
    fn = "dup_graph"
    tensor_map: dict = {}
    dst = ggml_new_graph_custom(ctx, src.size, True)
    for leaf in src.leafs:
        ggml_build_forward_expand(dst, _map_tensor(tensor_map, ctx, leaf))
    ggml_assert(dst.n_leafs == src.n_leafs, "dst->n_leafs == src->n_leafs", fn)
    for node in src.nodes:
        ggml_build_forward_expand(dst, _map_tensor(tensor_map, ctx, node))
    ggml_assert(dst.n_nodes == src.n_nodes, "dst->n_nodes == src->n_nodes", fn)
    src_tables, dst_tables = src.grad_tables, dst.grad_tables
    assert src_tables is not None and dst_tables is not None  # (ggml-opt's graphs have gradients)
    for s_node, d_node in zip(src.nodes, dst.nodes):
        i_src, i_dst = src.hash_find(s_node), dst.hash_find(d_node)
        ggml_assert(i_src != GGML_HASHSET_FULL and src.is_used(i_src),
                    "ggml_bitset_get(src->visited_hash_set.used, igrad_src)", fn)
        ggml_assert(i_dst != GGML_HASHSET_FULL and dst.is_used(i_dst),
                    "ggml_bitset_get(dst->visited_hash_set.used, igrad_dst)", fn)
        for s_table, d_table in zip(src_tables, dst_tables):  # grads, then grad_accs
            d_table[i_dst] = s_table[i_src]
    return dst


def _loss(opt_ctx: OptContext, ctx: Context, out: Tensor) -> Tensor:
    """The loss (and labels) of opt_ctx's loss type on its outputs `out`, named as ggml names
    them."""
    period = opt_ctx.opt_period
    kind = opt_ctx.loss_type
    if kind in (GGML_OPT_LOSS_TYPE_CROSS_ENTROPY, GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR):
        labels = opt_ctx.labels = ggml_dup_tensor(ctx, out)
        ggml_set_input(labels)
        ggml_set_name(labels, "labels")
    steps: list[tuple[Callable, str]]
    if kind == GGML_OPT_LOSS_TYPE_MEAN:
        scale = F32(1.0) / F32(period * ggml_nelements(out))
        steps = [(lambda t: ggml_sum(ctx, t), "loss_sum"), (lambda t: ggml_scale(ctx, t, scale), "loss_mean")]
    elif kind == GGML_OPT_LOSS_TYPE_SUM:
        steps = [(lambda t: ggml_sum(ctx, t), "loss_sum")]
    elif kind == GGML_OPT_LOSS_TYPE_CROSS_ENTROPY:
        steps = [(lambda t: ggml_cross_entropy_loss(ctx, t, labels), "loss_cross_entropy")]
        if period > 1:
            steps.append((lambda t: ggml_scale(ctx, t, F32(1.0) / F32(period)), "loss_cross_entropy_scaled"))
    elif kind == GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR:
        scale = F32(1.0) / F32(period * ggml_nelements(out))
        steps = [(lambda t: ggml_sub(ctx, t, labels), "loss_error"),
                 (lambda t: ggml_sqr(ctx, t), "loss_squared_error"),
                 (lambda t: ggml_sum(ctx, t), "loss_sum_squared_error"),
                 (lambda t: ggml_scale(ctx, t, scale), "loss_mean_squared_error")]
    else:
        raise GGMLAbortError(f"unknown loss type {kind}", "ggml_opt_build")
    loss = out
    for make, name in steps:
        loss = make(loss)
        ggml_set_name(loss, name)
    opt_ctx.loss = loss
    opt_ctx.loss_per_datapoint = kind != GGML_OPT_LOSS_TYPE_SUM
    return loss


def _alloc_static(opt_ctx: OptContext, ctx_static: Context) -> None:
    backend = ggml_backend_sched_get_backend(opt_ctx.backend_sched, 0)
    opt_ctx.buf_static = ggml_backend_alloc_ctx_tensors(ctx_static, backend)


def ggml_opt_build(opt_ctx: OptContext) -> None:
    """Build gf's loss, then gb_grad and gb_opt as far as build_type_alloc asks (static
    tensors allocated once, the first time)."""
    fn = "ggml_opt_build"
    ctx_compute = ggml_assert_not_null(opt_ctx.ctx_compute, "opt_ctx->ctx_compute && \"no compute context set, "
                                       "either use static graphs or set one with ggml_opt_prepare_alloc\"", fn)
    inputs, outputs, gf = opt_ctx.inputs, opt_ctx.outputs, opt_ctx.gf
    assert inputs is not None and outputs is not None and gf is not None  # (ggml_opt_init or _prepare_alloc)
    ggml_assert(not opt_ctx.static_graphs or inputs.data is not None,
                "(!opt_ctx->static_graphs || opt_ctx->inputs->data) && \"when using static graphs the inputs must "
                "be allocated statically\"", fn)
    accumulate = opt_ctx.build_type_alloc >= GGML_OPT_BUILD_TYPE_GRAD and not (
        opt_ctx.static_graphs and opt_ctx.build_type_alloc == GGML_OPT_BUILD_TYPE_OPT and opt_ctx.opt_period == 1)
    need_momenta = opt_ctx.build_type_alloc == GGML_OPT_BUILD_TYPE_OPT and \
        opt_ctx.optimizer == GGML_OPT_OPTIMIZER_TYPE_ADAMW
    ggml_set_input(inputs)
    ggml_set_output(outputs)

    forward = gf.nodes
    n_param = sum(1 for node in forward if node.flags & GGML_TENSOR_FLAG_PARAM)
    for node in forward:
        ggml_assert(not node.flags & GGML_TENSOR_FLAG_LOSS,
                    "!(node->flags & GGML_TENSOR_FLAG_LOSS) && \"support for extra loss terms not implemented\"", fn)
    if opt_ctx.ctx_static is None:
        # gradients accumulators and momenta per parameter, the loss's accumulator, and with
        # static graphs up to 9 more (labels, the loss's tensors, pred, ncorrect)
        per_param = (1 if accumulate else 0) + (2 if need_momenta else 0)
        n_const = 9 if opt_ctx.static_graphs else 0
        size = (1 + per_param * n_param + n_const) * ggml_tensor_overhead()
        opt_ctx.ctx_static = ggml_init(ggml_init_params(size, None, True))
    ctx_static = opt_ctx.ctx_static
    ggml_assert(opt_ctx.build_type <= opt_ctx.build_type_alloc, "opt_ctx->build_type <= opt_ctx->build_type_alloc", fn)

    ggml_free(opt_ctx.ctx_cpu)  # the optimizer parameters' context, made anew
    ctx_cpu = opt_ctx.ctx_cpu = ggml_init(ggml_init_params(ggml_tensor_overhead(), None, True))
    ggml_backend_buffer_free(opt_ctx.buf_cpu)
    opt_ctx.buf_cpu = None

    ctx_results = ctx_static if opt_ctx.static_graphs else ctx_compute
    loss = _loss(opt_ctx, ctx_results, outputs)
    ggml_set_output(loss)
    ggml_set_loss(loss)
    ggml_build_forward_expand(gf, loss)
    if opt_ctx.loss_type == GGML_OPT_LOSS_TYPE_CROSS_ENTROPY:
        labels = opt_ctx.labels
        assert labels is not None  # (_loss made the cross-entropy's)
        pred = opt_ctx.pred = ggml_argmax(ctx_results, outputs)
        ggml_set_name(pred, "pred")
        ggml_set_output(pred)
        ggml_build_forward_expand(gf, pred)
        ncorrect = opt_ctx.ncorrect = ggml_count_equal(ctx_results, pred, ggml_argmax(ctx_results, labels))
        ggml_set_name(ncorrect, "ncorrect")
        ggml_set_output(ncorrect)
        ggml_build_forward_expand(gf, ncorrect)

    if opt_ctx.buf_static is not None:
        if opt_ctx.build_type == GGML_OPT_BUILD_TYPE_FORWARD:
            return
    elif opt_ctx.build_type_alloc == GGML_OPT_BUILD_TYPE_FORWARD:
        _alloc_static(opt_ctx, ctx_static)
        return

    forward = gf.nodes
    if not opt_ctx.grad_accs:
        ggml_assert(opt_ctx.build_type_alloc >= GGML_OPT_BUILD_TYPE_GRAD,
                    "opt_ctx->build_type_alloc >= GGML_OPT_BUILD_TYPE_GRAD", fn)
        opt_ctx.grad_accs = [
            ggml_new_tensor(ctx_static, GGMLType.F32, GGML_MAX_DIMS, node.ne)
            if (accumulate and node.flags & GGML_TENSOR_FLAG_PARAM) or node.flags & GGML_TENSOR_FLAG_LOSS
            else None for node in forward]
        if need_momenta and opt_ctx.build_type_alloc >= GGML_OPT_BUILD_TYPE_OPT:
            opt_ctx.grad_m, opt_ctx.grad_v = [], []
            for node in forward:
                is_param = bool(node.flags & GGML_TENSOR_FLAG_PARAM)
                for moments in (opt_ctx.grad_m, opt_ctx.grad_v):
                    moments.append(ggml_new_tensor(ctx_static, GGMLType.F32, GGML_MAX_DIMS, node.ne)
                                   if is_param else None)

    # gb_grad: the forward pass, then the backward pass computing the gradients
    gb_grad = opt_ctx.gb_grad = ggml_graph_dup(ctx_compute, gf, True)
    ggml_build_backward_expand(ctx_compute, gb_grad, opt_ctx.grad_accs)

    if opt_ctx.buf_static is not None:
        if opt_ctx.build_type == GGML_OPT_BUILD_TYPE_GRAD:
            return
    elif opt_ctx.build_type_alloc == GGML_OPT_BUILD_TYPE_GRAD:
        _alloc_static(opt_ctx, ctx_static)
        ggml_graph_reset(gb_grad)
    ggml_assert(opt_ctx.build_type_alloc == GGML_OPT_BUILD_TYPE_OPT,
                "opt_ctx->build_type_alloc == GGML_OPT_BUILD_TYPE_OPT", fn)

    # gb_opt: gb_grad, then one optimizer step per parameter, last parameter first
    gb_opt = opt_ctx.gb_opt = ggml_graph_dup(ctx_compute, gb_grad, True)
    params = opt_ctx.opt_step_params = ggml_new_tensor_1d(ctx_cpu, GGMLType.F32, 7 if need_momenta else 2)
    ggml_set_input(params)
    name = ggml_opt_optimizer_name(opt_ctx.optimizer)
    ggml_format_name(params, "%s_params", name)
    gb_nodes = gb_opt.nodes
    for i in range(len(forward) - 1, -1, -1):
        node = gb_nodes[i]
        grad = ggml_graph_get_grad(gb_opt, node)
        if grad is None or not node.flags & GGML_TENSOR_FLAG_PARAM:
            continue
        if opt_ctx.optimizer == GGML_OPT_OPTIMIZER_TYPE_ADAMW:
            m, v = opt_ctx.grad_m[i], opt_ctx.grad_v[i]
            assert m is not None and v is not None  # (made above for every parameter)
            ggml_format_name(m, "AdamW m for %s", node.name_bytes)
            ggml_format_name(v, "AdamW v for %s", node.name_bytes)
            step = ggml_opt_step_adamw(ctx_compute, node, grad, m, v, params)
        elif opt_ctx.optimizer == GGML_OPT_OPTIMIZER_TYPE_SGD:
            step = ggml_opt_step_sgd(ctx_compute, node, grad, params)
        else:
            raise GGMLAbortError("fatal error", fn)
        ggml_format_name(step, "%s step for %s", name, node.name_bytes)
        ggml_build_forward_expand(gb_opt, step)

    if opt_ctx.buf_static is None:
        _alloc_static(opt_ctx, ctx_static)
        ggml_graph_reset(gb_opt)
    opt_ctx.buf_cpu = ggml_backend_alloc_ctx_tensors_from_buft(ctx_cpu, ggml_backend_cpu_buffer_type())


@writes(Writes.PLACES, Writes.OPT)
def ggml_opt_init(params: ggml_opt_params) -> OptContext:
    """An optimization context; with params.ctx_compute, its static graphs are built now."""
    fn = "ggml_opt_init"
    opt_ctx = OptContext(params.backend_sched, params.ctx_compute, params.loss_type, params.build_type,
                         params.build_type, params.inputs, params.outputs, params.opt_period,
                         params.get_opt_pars, params.get_opt_pars_ud, params.optimizer)
    ggml_assert(opt_ctx.opt_period >= 1, "result->opt_period >= 1", fn)
    ctx_compute = opt_ctx.ctx_compute
    opt_ctx.static_graphs = ctx_compute is not None
    if ctx_compute is None:
        ggml_assert(opt_ctx.inputs is None, "!result->inputs", fn)
        ggml_assert(opt_ctx.outputs is None, "!result->outputs", fn)
        return opt_ctx
    ggml_assert(opt_ctx.inputs is not None, "result->inputs", fn)
    outputs = ggml_assert_not_null(opt_ctx.outputs, "result->outputs", fn)
    gf = opt_ctx.gf = ggml_new_graph_custom(ctx_compute, GGML_DEFAULT_GRAPH_SIZE, True)  # the forward pass
    ggml_build_forward_expand(gf, outputs)
    ggml_opt_build(opt_ctx)
    return opt_ctx


@writes(Writes.OPT)
def ggml_opt_free(opt_ctx: OptContext | None) -> None:
    if opt_ctx is None:
        return
    ggml_backend_buffer_free(opt_ctx.buf_static)
    ggml_backend_buffer_free(opt_ctx.buf_cpu)
    for ctx in (opt_ctx.ctx_static, opt_ctx.ctx_cpu, opt_ctx.ctx_copy):
        ggml_free(ctx)


@writes(Writes.OPT)
def ggml_opt_reset(opt_ctx: OptContext, optimizer: bool) -> None:
    """Zero the gradients (and with optimizer, the moments and the iteration count too)."""
    if optimizer:
        ggml_graph_reset(opt_ctx.gb_opt)
        opt_ctx.iter = 1
    else:
        ggml_graph_reset(opt_ctx.gb_grad)


@query
def ggml_opt_static_graphs(opt_ctx: OptContext) -> bool:
    return opt_ctx.static_graphs


@query
def ggml_opt_inputs(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.inputs


@query
def ggml_opt_outputs(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.outputs


@query
def ggml_opt_labels(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.labels


@query
def ggml_opt_loss(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.loss


@query
def ggml_opt_pred(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.pred


@query
def ggml_opt_ncorrect(opt_ctx: OptContext) -> Tensor | None:
    return opt_ctx.ncorrect


@query
def ggml_opt_grad_acc(opt_ctx: OptContext, node: Tensor) -> Tensor | None:
    gb_opt = opt_ctx.gb_opt
    assert gb_opt is not None  # (built by ggml_opt_build: C reads it unchecked)
    return ggml_graph_get_grad_acc(gb_opt, node)


@query
def ggml_opt_context_optimizer_type(opt_ctx: OptContext) -> int:
    return opt_ctx.optimizer


# --- computing ------------------------------------------------------------------------------

@writes(Writes.OPT)
def ggml_opt_prepare_alloc(opt_ctx: OptContext, ctx_compute, gf: Graph, inputs: Tensor, outputs: Tensor) -> None:
    """Without static graphs: the compute context and forward graph the next ggml_opt_alloc builds on."""
    ggml_assert(not opt_ctx.static_graphs, "!opt_ctx->static_graphs", "ggml_opt_prepare_alloc")
    opt_ctx.ctx_compute, opt_ctx.gf, opt_ctx.inputs, opt_ctx.outputs = ctx_compute, gf, inputs, outputs


@writes(Writes.PLACES, Writes.OPT)
def ggml_opt_alloc(opt_ctx: OptContext, backward: bool) -> None:
    """Choose the graph the next ggml_opt_eval computes (forward; gradients; gradients and an
    optimizer step when this physical batch ends a logical one) and have the scheduler place it."""
    fn = "ggml_opt_alloc"
    ggml_assert(not opt_ctx.eval_ready, "!opt_ctx->eval_ready", fn)
    if opt_ctx.build_type == GGML_OPT_BUILD_TYPE_OPT and opt_ctx.opt_period > 1 and opt_ctx.opt_i == 0:
        ggml_graph_reset(opt_ctx.gb_grad)
    if backward:
        opt_i_next = (opt_ctx.opt_i + 1) % opt_ctx.opt_period
        opt_ctx.build_type = GGML_OPT_BUILD_TYPE_OPT if opt_i_next == 0 else GGML_OPT_BUILD_TYPE_GRAD
    else:
        opt_ctx.build_type = GGML_OPT_BUILD_TYPE_FORWARD
    if not opt_ctx.static_graphs:
        ggml_opt_build(opt_ctx)
    graph = {GGML_OPT_BUILD_TYPE_FORWARD: opt_ctx.gf, GGML_OPT_BUILD_TYPE_GRAD: opt_ctx.gb_grad,
             GGML_OPT_BUILD_TYPE_OPT: opt_ctx.gb_opt}[opt_ctx.build_type]
    graph = ggml_assert_not_null(graph, "graph", fn)
    if opt_ctx.allocated_graph is graph:
        opt_ctx.eval_ready = True
        return
    ggml_backend_sched_reset(opt_ctx.backend_sched)  # clear the previous graph's allocation
    if opt_ctx.static_graphs:
        size = graph.size * ggml_tensor_overhead() + ggml_graph_overhead_custom(graph.size, True)
        ggml_free(opt_ctx.ctx_copy)
        ctx_copy = opt_ctx.ctx_copy = ggml_init(ggml_init_params(size, None, True))
        graph_copy = opt_ctx.allocated_graph_copy = dup_graph(ctx_copy, graph)
    else:
        graph_copy = opt_ctx.allocated_graph_copy = graph
    ggml_backend_sched_alloc_graph(opt_ctx.backend_sched, graph_copy)
    opt_ctx.allocated_graph = graph
    opt_ctx.eval_ready = True


def _write_optimizer_params(opt_ctx: OptContext) -> None:
    fn = "ggml_opt_eval"
    pars = opt_ctx.get_opt_pars(opt_ctx.get_opt_pars_ud)
    if opt_ctx.optimizer == GGML_OPT_OPTIMIZER_TYPE_ADAMW:
        a = pars.adamw
        alpha, beta1, beta2, eps, wd = (F32(x) for x in (a.alpha, a.beta1, a.beta2, a.eps, a.wd))
        ggml_assert(alpha > 0, "opt_pars.adamw.alpha > 0.0f", fn)
        ggml_assert(0 <= beta1 <= 1, "opt_pars.adamw.beta1 >= 0.0f && opt_pars.adamw.beta1 <= 1.0f", fn)
        ggml_assert(0 <= beta2 <= 1, "opt_pars.adamw.beta2 >= 0.0f && opt_pars.adamw.beta2 <= 1.0f", fn)
        ggml_assert(eps >= 0, "opt_pars.adamw.eps >= 0.0f", fn)
        ggml_assert(0 <= wd <= 1, "opt_pars.adamw.wd >= 0.0f && opt_pars.adamw.wd <= 1.0f", fn)
        it = F32(opt_ctx.iter)
        one = F32(1.0)
        # the bias corrections of AdamW's warm-up: 1 / (1 - beta^iter)
        beta1h = one / (one - libm.scalar(libm.powf, beta1, it))
        beta2h = one / (one - libm.scalar(libm.powf, beta2, it))
        values = [alpha, beta1, beta2, eps, wd, beta1h, beta2h]
    elif opt_ctx.optimizer == GGML_OPT_OPTIMIZER_TYPE_SGD:
        alpha, wd = F32(pars.sgd.alpha), F32(pars.sgd.wd)
        ggml_assert(alpha > 0, "opt_pars.sgd.alpha > 0.0f", fn)
        ggml_assert(0 <= wd <= 1, "opt_pars.sgd.wd >= 0.0f && opt_pars.sgd.wd <= 1.0f", fn)
        values = [alpha, wd]
    else:
        raise GGMLAbortError("fatal error", fn)
    params = opt_ctx.opt_step_params
    assert params is not None  # (gb_opt is built, and its optimizer's parameters with it)
    ggml_backend_tensor_set(params, np.array(values, dtype=F32), 0, 4 * len(values))


@writes(Writes.PLACES, Writes.OPT)
def ggml_opt_eval(opt_ctx: OptContext, result: OptResult | None) -> None:
    """Compute the allocated graph; add its loss, predictions and correct count to result."""
    fn = "ggml_opt_eval"
    ggml_assert(opt_ctx.eval_ready, "opt_ctx->eval_ready", fn)
    graph_copy, outputs, loss = opt_ctx.allocated_graph_copy, opt_ctx.outputs, opt_ctx.loss
    assert graph_copy is not None and outputs is not None and loss is not None  # (eval_ready: all built)
    if opt_ctx.allocated_graph is opt_ctx.gb_opt:
        _write_optimizer_params(opt_ctx)
    ggml_backend_sched_graph_compute(opt_ctx.backend_sched, graph_copy)
    opt_ctx.iter += opt_ctx.allocated_graph is opt_ctx.gb_opt
    opt_ctx.opt_i = (opt_ctx.opt_i + 1) % opt_ctx.opt_period
    if not opt_ctx.static_graphs:
        opt_ctx.gf = opt_ctx.gb_grad = opt_ctx.gb_opt = None
        opt_ctx.allocated_graph = opt_ctx.allocated_graph_copy = None
    opt_ctx.eval_ready = False
    if result is None:
        return
    if result.ndata == 0:
        result.loss_per_datapoint = opt_ctx.loss_per_datapoint
        result.opt_period = opt_ctx.opt_period
    else:
        ggml_assert(result.loss_per_datapoint == opt_ctx.loss_per_datapoint,
                    "result->loss_per_datapoint == opt_ctx->loss_per_datapoint", fn)
        ggml_assert(result.opt_period == opt_ctx.opt_period, "result->opt_period == opt_ctx->opt_period", fn)
    ndata = int(outputs.ne[1])
    ggml_assert(result.ndata == ndata * len(result.loss),
                "result->ndata == ndata*int64_t(result->loss.size()) && \"varying batch size not supported\"", fn)
    result.ndata += ndata
    ggml_assert(ggml_is_scalar(loss), "ggml_is_scalar(opt_ctx->loss)", fn)
    ggml_assert(loss.type == GGMLType.F32, "opt_ctx->loss->type == GGML_TYPE_F32", fn)
    result.loss.append(F32(np.frombuffer(ggml_backend_tensor_get(loss, 0, 4), dtype="<f4")[0]))
    if opt_ctx.pred is not None:
        ggml_assert(opt_ctx.pred.type == GGMLType.I32, "opt_ctx->pred->type == GGML_TYPE_I32", fn)
        pred = np.frombuffer(ggml_backend_tensor_get(opt_ctx.pred, 0, ggml_nbytes(opt_ctx.pred)), dtype="<i4")
        result.pred.extend(int(p) for p in pred)
    if opt_ctx.ncorrect is None or result.ncorrect < 0:
        result.ncorrect = -1
        return
    ggml_assert(ggml_is_scalar(opt_ctx.ncorrect), "ggml_is_scalar(opt_ctx->ncorrect)", fn)
    ggml_assert(opt_ctx.ncorrect.type == GGMLType.I64, "opt_ctx->ncorrect->type == GGML_TYPE_I64", fn)
    result.ncorrect += int(np.frombuffer(ggml_backend_tensor_get(opt_ctx.ncorrect, 0, 8), dtype="<i8")[0])
