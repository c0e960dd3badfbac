"""ggml-opt's constants and parameters: loss, build and optimizer types, the optimizer's
hyperparameters (AdamW, SGD) and the parameters of an optimization context."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

from engine.core.api import query
from engine.core.tensor import Tensor

if TYPE_CHECKING:
    from engine.backend.sched import Sched
    from engine.core.context import Context

GGML_OPT_LOSS_TYPE_MEAN = 0
GGML_OPT_LOSS_TYPE_SUM = 1
GGML_OPT_LOSS_TYPE_CROSS_ENTROPY = 2
GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR = 3

GGML_OPT_BUILD_TYPE_FORWARD = 10
GGML_OPT_BUILD_TYPE_GRAD = 20
GGML_OPT_BUILD_TYPE_OPT = 30

GGML_OPT_OPTIMIZER_TYPE_ADAMW = 0
GGML_OPT_OPTIMIZER_TYPE_SGD = 1
GGML_OPT_OPTIMIZER_TYPE_COUNT = 2


@dataclass
class ggml_opt_optimizer_params_adamw:
    alpha: float = 0.001  # learning rate
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8  # epsilon for numerical stability
    wd: float = 0.0  # weight decay (0: off)


@dataclass
class ggml_opt_optimizer_params_sgd:
    alpha: float = 1e-3  # learning rate
    wd: float = 0.0  # weight decay


@dataclass
class ggml_opt_optimizer_params:
    adamw: ggml_opt_optimizer_params_adamw = field(default_factory=ggml_opt_optimizer_params_adamw)
    sgd: ggml_opt_optimizer_params_sgd = field(default_factory=ggml_opt_optimizer_params_sgd)


@query
def ggml_opt_get_default_optimizer_params(userdata=None) -> ggml_opt_optimizer_params:
    return ggml_opt_optimizer_params()


@query
def ggml_opt_get_constant_optimizer_params(userdata: ggml_opt_optimizer_params) -> ggml_opt_optimizer_params:
    """The parameters userdata points to (ggml_opt_params.get_opt_pars_ud)."""
    return userdata


@dataclass
class ggml_opt_params:
    backend_sched: Sched
    ctx_compute: Context | None = None  # given: static graphs built from inputs to outputs at init
    inputs: Tensor | None = None
    outputs: Tensor | None = None
    loss_type: int = GGML_OPT_LOSS_TYPE_SUM
    build_type: int = GGML_OPT_BUILD_TYPE_OPT
    opt_period: int = 1  # physical batches per optimizer step
    get_opt_pars: Callable = ggml_opt_get_default_optimizer_params
    get_opt_pars_ud: object = None
    optimizer: int = GGML_OPT_OPTIMIZER_TYPE_ADAMW


@query
def ggml_opt_default_params(backend_sched: Sched, loss_type: int) -> ggml_opt_params:
    return ggml_opt_params(backend_sched, loss_type=loss_type)


@query
def ggml_opt_optimizer_name(o: int) -> str:
    return {GGML_OPT_OPTIMIZER_TYPE_ADAMW: "adamw", GGML_OPT_OPTIMIZER_TYPE_SGD: "sgd"}.get(o, "undefined")
