"""A context's tensors, walked and found: ggml_get_first_tensor, ggml_get_next_tensor (the object
list in creation order), ggml_get_tensor (by name) and ggml_get_max_tensor_size.

Mirrors ggml.c's walks over ctx->objects_begin; each reads the object headers straight from the
pool and makes a Tensor handle only for what it returns.
"""

from __future__ import annotations

from engine.core.api import query
from engine.core.context import GGML_OBJECT_TYPE_TENSOR, Context
from engine.core.tensor import Tensor, ggml_nbytes, name_in


@query
def ggml_get_first_tensor(ctx: Context) -> Tensor | None:
    """ggml_get_first_tensor."""
    return next(_tensors(ctx), None)


@query
def ggml_get_next_tensor(ctx: Context, t: Tensor) -> Tensor | None:
    """ggml_get_next_tensor: follow the object list from t's header. (The headers are read as
    tuples: only the tensor returned is made a Tensor, so a walk over a model's weights is not
    quadratic in handles.)"""
    found = False
    for _, offs, _, type_, _ in ctx.headers():
        if type_ != GGML_OBJECT_TYPE_TENSOR:
            continue
        if found:
            return Tensor(ctx, offs)
        found = offs == t.offs
    return None


@query
def ggml_get_tensor(ctx: Context, name: str) -> Tensor | None:
    """ggml_get_tensor: the first tensor (in creation order) with this name. (The names are read
    straight from the pool: a model's hundreds of tensors are not each made a Tensor.)"""
    for _, offs, _, type_, _ in ctx.headers():
        if type_ == GGML_OBJECT_TYPE_TENSOR and name_in(ctx.pool, offs).decode("utf-8", errors="replace") == name:
            return Tensor(ctx, offs)
    return None


def _tensors(ctx: Context):
    return (Tensor(ctx, o.offs) for o in ctx.objects() if o.type == GGML_OBJECT_TYPE_TENSOR)


@query
def ggml_get_max_tensor_size(ctx: Context) -> int:
    """ggml_get_max_tensor_size: the largest ggml_nbytes of the context's tensors."""
    return max((ggml_nbytes(t) for t in _tensors(ctx)), default=0)
