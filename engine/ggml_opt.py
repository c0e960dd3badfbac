"""ggml-opt.h: training with ggml — `from engine.ggml_opt import *` as a C program includes the header.

Mirrors ggml-opt.cpp. A *dataset* holds every datapoint and label in two tensors of a CPU buffer
and a permutation of its shards (the unit of shuffling). An *optimization context* takes a forward
graph from `inputs` to `outputs` and builds three graphs from it, each a copy of the one before:

* `gf`, the forward pass plus the loss (cross entropy against a `labels` input, mean, sum or mean
  squared error), and for cross entropy the predictions (`pred`, argmax) and `ncorrect`;
* `gb_grad`, gf plus ggml_build_backward_expand: the gradient of the loss for every parameter,
  accumulated in `grad_accs` when a logical batch spans several physical ones (`opt_period`);
* `gb_opt`, gb_grad plus one OPT_STEP_ADAMW (with its moments m and v) or OPT_STEP_SGD per
  parameter, reading a small tensor of optimizer parameters set before each step.

With static graphs (a compute context given to ggml_opt_init) the three are built once; each
ggml_opt_alloc copies the chosen one into a fresh context (`dup_graph`) and has the scheduler
place it; ggml_opt_eval computes it and adds the loss, predictions and correct count to a result.
ggml_opt_epoch and ggml_opt_fit are the training loops, with the shuffles of ggml's std::mt19937.

Where C fills pointers, these return values: ggml_opt_result_ndata -> int, ggml_opt_result_loss
and ggml_opt_result_accuracy -> (value, uncertainty), ggml_opt_result_pred -> list of int.
get_opt_pars is a Python function of get_opt_pars_ud; ggml_opt_fit passes it the epoch as a
ctypes.c_int64, as C passes &epoch.
"""


from engine.opt.params import (
    GGML_OPT_BUILD_TYPE_FORWARD,
    GGML_OPT_BUILD_TYPE_GRAD,
    GGML_OPT_BUILD_TYPE_OPT,
    GGML_OPT_LOSS_TYPE_CROSS_ENTROPY,
    GGML_OPT_LOSS_TYPE_MEAN,
    GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR,
    GGML_OPT_LOSS_TYPE_SUM,
    GGML_OPT_OPTIMIZER_TYPE_ADAMW,
    GGML_OPT_OPTIMIZER_TYPE_COUNT,
    GGML_OPT_OPTIMIZER_TYPE_SGD,
    ggml_opt_default_params,
    ggml_opt_get_constant_optimizer_params,
    ggml_opt_get_default_optimizer_params,
    ggml_opt_optimizer_name,
    ggml_opt_optimizer_params,
    ggml_opt_optimizer_params_adamw,
    ggml_opt_optimizer_params_sgd,
    ggml_opt_params,
)
from engine.opt.dataset import (
    Dataset,
    ggml_opt_dataset_data,
    ggml_opt_dataset_free,
    ggml_opt_dataset_get_batch,
    ggml_opt_dataset_get_batch_host,
    ggml_opt_dataset_init,
    ggml_opt_dataset_labels,
    ggml_opt_dataset_ndata,
    ggml_opt_dataset_shuffle,
)
from engine.opt.context import (
    OptContext,
    ggml_opt_alloc,
    ggml_opt_context_optimizer_type,
    ggml_opt_eval,
    ggml_opt_free,
    ggml_opt_grad_acc,
    ggml_opt_init,
    ggml_opt_inputs,
    ggml_opt_labels,
    ggml_opt_loss,
    ggml_opt_ncorrect,
    ggml_opt_outputs,
    ggml_opt_pred,
    ggml_opt_prepare_alloc,
    ggml_opt_reset,
    ggml_opt_static_graphs,
)
from engine.opt.results import (
    OptResult,
    ggml_opt_result_accuracy,
    ggml_opt_result_free,
    ggml_opt_result_init,
    ggml_opt_result_loss,
    ggml_opt_result_ndata,
    ggml_opt_result_pred,
    ggml_opt_result_reset,
)
from engine.opt.loops import (
    ggml_opt_epoch,
    ggml_opt_epoch_callback_progress_bar,
    ggml_opt_fit,
)

__all__ = [
    "GGML_OPT_BUILD_TYPE_FORWARD", "GGML_OPT_BUILD_TYPE_GRAD", "GGML_OPT_BUILD_TYPE_OPT",
    "GGML_OPT_LOSS_TYPE_CROSS_ENTROPY", "GGML_OPT_LOSS_TYPE_MEAN", "GGML_OPT_LOSS_TYPE_MEAN_SQUARED_ERROR",
    "GGML_OPT_LOSS_TYPE_SUM", "GGML_OPT_OPTIMIZER_TYPE_ADAMW", "GGML_OPT_OPTIMIZER_TYPE_COUNT",
    "GGML_OPT_OPTIMIZER_TYPE_SGD", "Dataset", "OptContext", "OptResult", "ggml_opt_alloc",
    "ggml_opt_context_optimizer_type", "ggml_opt_dataset_data", "ggml_opt_dataset_free",
    "ggml_opt_dataset_get_batch", "ggml_opt_dataset_get_batch_host", "ggml_opt_dataset_init",
    "ggml_opt_dataset_labels", "ggml_opt_dataset_ndata", "ggml_opt_dataset_shuffle",
    "ggml_opt_default_params", "ggml_opt_epoch", "ggml_opt_epoch_callback_progress_bar", "ggml_opt_eval",
    "ggml_opt_fit", "ggml_opt_free", "ggml_opt_get_constant_optimizer_params",
    "ggml_opt_get_default_optimizer_params", "ggml_opt_grad_acc", "ggml_opt_init", "ggml_opt_inputs",
    "ggml_opt_labels", "ggml_opt_loss", "ggml_opt_ncorrect", "ggml_opt_optimizer_name",
    "ggml_opt_optimizer_params", "ggml_opt_optimizer_params_adamw", "ggml_opt_optimizer_params_sgd",
    "ggml_opt_outputs", "ggml_opt_params", "ggml_opt_pred", "ggml_opt_prepare_alloc", "ggml_opt_reset",
    "ggml_opt_result_accuracy", "ggml_opt_result_free", "ggml_opt_result_init", "ggml_opt_result_loss",
    "ggml_opt_result_ndata", "ggml_opt_result_pred", "ggml_opt_result_reset", "ggml_opt_static_graphs",
]
