"""ggml-opt's training loops: ggml_opt_epoch (a step per batch), its progress bar, ggml_opt_fit."""

from __future__ import annotations

import ctypes
import math
import sys
from typing import Callable

import numpy as np

from engine.core.api import Writes, writes
from engine.core.errors import ggml_assert
from engine.ggml import ggml_time_init, ggml_time_us
from engine.opt.context import (
    OptContext,
    ggml_opt_alloc,
    ggml_opt_eval,
    ggml_opt_free,
    ggml_opt_init,
    ggml_opt_inputs,
    ggml_opt_labels,
    ggml_opt_static_graphs,
)
from engine.opt.dataset import Dataset, ggml_opt_dataset_data, ggml_opt_dataset_get_batch, ggml_opt_dataset_shuffle
from engine.opt.params import ggml_opt_default_params
from engine.opt.results import OptResult, ggml_opt_result_accuracy, ggml_opt_result_init, ggml_opt_result_loss, \
    ggml_opt_result_reset
from engine.core.tensor import Tensor

F32 = np.float32

EpochCallback = Callable[[bool, OptContext, Dataset, OptResult | None, int, int, int], None]


@writes(Writes.PLACES, Writes.OPT, Writes.LOOP)
def ggml_opt_epoch(opt_ctx: OptContext, dataset: Dataset, result_train: OptResult | None,
                   result_eval: OptResult | None, idata_split: int,
                   callback_train: EpochCallback | None, callback_eval: EpochCallback | None) -> None:
    """One pass over the dataset: a training step per batch before idata_split, an evaluation after."""
    fn = "ggml_opt_epoch"
    ggml_assert(ggml_opt_static_graphs(opt_ctx), "ggml_opt_static_graphs(opt_ctx) && \"ggml_opt_epoch requires "
                "static graphs\"", fn)
    inputs, labels, data = ggml_opt_inputs(opt_ctx), ggml_opt_labels(opt_ctx), ggml_opt_dataset_data(dataset)
    assert inputs is not None  # (static graphs: ggml_opt_init was given them)
    ggml_assert(data.ne[0] == inputs.ne[0], "data->ne[0] == inputs->ne[0]", fn)
    ndata, ndata_batch = int(data.ne[1]), int(inputs.ne[1])
    ggml_assert(ndata % ndata_batch == 0, "data->ne[1] % inputs->ne[1] == 0", fn)
    nbatches = ndata // ndata_batch
    idata_split = ndata if idata_split < 0 else idata_split
    ggml_assert(idata_split % ndata_batch == 0, "idata_split % ndata_batch == 0", fn)
    ibatch_split = idata_split // ndata_batch

    t_loop_start = ggml_time_us()
    for ibatch in range(ibatch_split):
        ggml_opt_alloc(opt_ctx, True)
        ggml_opt_dataset_get_batch(dataset, inputs, labels, ibatch)
        ggml_opt_eval(opt_ctx, result_train)
        if callback_train is not None:
            callback_train(True, opt_ctx, dataset, result_train, ibatch + 1, ibatch_split, t_loop_start)
    t_loop_start = ggml_time_us()
    for ibatch in range(ibatch_split, nbatches):
        ggml_opt_alloc(opt_ctx, False)
        ggml_opt_dataset_get_batch(dataset, inputs, labels, ibatch)
        ggml_opt_eval(opt_ctx, result_eval)
        if callback_eval is not None:
            callback_eval(False, opt_ctx, dataset, result_eval, ibatch + 1 - ibatch_split, nbatches - ibatch_split,
                          t_loop_start)


BLOCKS = " \u258f\u258e\u258d\u258c\u258b\u258a\u2589\u2588"  # 0/8 .. 8/8 of a block filled


def _hms(us: int) -> str:
    s = us // 1_000_000
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def progress_bar_line(train: bool, opt_ctx: OptContext, result: OptResult, ibatch: int, ibatch_max: int,
                      t_elapsed_us: int) -> str:
    """The line ggml_opt_epoch_callback_progress_bar writes (8 blocks of 8 fill levels each)."""
    bar = []
    for j in range(8):
        filled = next((k for k in range(8, 0, -1) if ibatch_max * (8 * j + k) // 8 < 8 * ibatch), 0)
        bar.append(BLOCKS[filled])
    inputs = ggml_opt_inputs(opt_ctx)
    assert inputs is not None  # (ggml_opt_fit's static graphs)
    batch_size = int(inputs.ne[1])
    loss, loss_unc = ggml_opt_result_loss(result)
    accuracy, accuracy_unc = ggml_opt_result_accuracy(result)
    t_eta_us = t_elapsed_us * (ibatch_max - ibatch) // ibatch
    line = (f"{'train: ' if train else 'val:   '}[{''.join(bar)}] data={ibatch * batch_size:07d}/"
            f"{ibatch_max * batch_size:07d} loss={_c_float(loss, 5)}±{_c_float(loss_unc, 5)} "
            f"acc={_c_float(100.0 * accuracy, 2)}±{_c_float(100.0 * accuracy_unc, 2)}% "
            f"t={_hms(t_elapsed_us)} ETA={_hms(t_eta_us)} \r")
    return line + ("\n" if ibatch == ibatch_max else "")


def _c_float(x: float, digits: int) -> str:
    """printf's %.Nlf (nan and inf as C prints them)."""
    if math.isnan(x):
        return "-nan" if math.copysign(1.0, x) < 0 else "nan"
    return f"{x:.{digits}f}"


@writes(Writes.OPT)
def ggml_opt_epoch_callback_progress_bar(train: bool, opt_ctx: OptContext, dataset: Dataset,
                                         result: OptResult | None, ibatch: int, ibatch_max: int,
                                         t_start_us: int) -> None:
    """ggml's epoch callback: a progress bar with loss, accuracy, time and ETA on stderr."""
    assert result is not None  # (C reads it unchecked: ggml_opt_fit gives its results)
    sys.stderr.write(progress_bar_line(train, opt_ctx, result, ibatch, ibatch_max, ggml_time_us() - t_start_us))
    sys.stderr.flush()


@writes(Writes.PLACES, Writes.OPT, Writes.LOOP)
def ggml_opt_fit(backend_sched, ctx_compute, inputs: Tensor, outputs: Tensor, dataset: Dataset, loss_type: int,
                 optimizer: int, get_opt_pars: Callable, nepoch: int, nbatch_logical: int, val_split: float,
                 silent: bool) -> None:
    """Train for nepoch epochs on the first (1 - val_split) of the dataset, validating on the rest,
    the data shuffled first and the training part again before each epoch."""
    fn = "ggml_opt_fit"
    ggml_time_init()
    t_start_us = ggml_time_us()
    ndata = int(ggml_opt_dataset_data(dataset).ne[1])
    nbatch_physical = int(inputs.ne[1])
    ggml_assert(ndata % nbatch_logical == 0, "ndata          % nbatch_logical  == 0", fn)
    ggml_assert(nbatch_logical % nbatch_physical == 0, "nbatch_logical % nbatch_physical == 0", fn)
    opt_period = nbatch_logical // nbatch_physical
    nbatches_logical = ndata // nbatch_logical
    ggml_assert(val_split >= 0.0, "val_split >= 0.0f", fn)
    ggml_assert(val_split < 1.0, "val_split <  1.0f", fn)
    # the train/validation split, in physical batches: (1 - val_split) * nbatches_logical in float
    ibatch_split = int((F32(1.0) - F32(val_split)) * F32(nbatches_logical)) * opt_period
    idata_split = ibatch_split * nbatch_physical

    epoch = ctypes.c_int64(1)
    params = ggml_opt_default_params(backend_sched, loss_type)
    params.ctx_compute, params.inputs, params.outputs = ctx_compute, inputs, outputs
    params.opt_period, params.get_opt_pars, params.get_opt_pars_ud = opt_period, get_opt_pars, epoch
    params.optimizer = optimizer
    opt_ctx = ggml_opt_init(params)
    if nbatch_logical < ndata:  # shuffling only matters when one batch is not all the data
        ggml_opt_dataset_shuffle(opt_ctx, dataset, -1)
    result_train, result_val = ggml_opt_result_init(), ggml_opt_result_init()
    callback = None if silent else ggml_opt_epoch_callback_progress_bar
    while epoch.value <= nepoch:
        if nbatch_logical < idata_split:
            ggml_opt_dataset_shuffle(opt_ctx, dataset, idata_split)
        ggml_opt_result_reset(result_train)
        ggml_opt_result_reset(result_val)
        if not silent:
            sys.stderr.write(f"{fn}: epoch {epoch.value:04d}/{nepoch:04d}:\n")
        ggml_opt_epoch(opt_ctx, dataset, result_train, result_val, idata_split, callback, callback)
        if not silent:
            sys.stderr.write("\n")
        epoch.value += 1
    if not silent:
        sys.stderr.write(f"{fn}: training took {_hms(ggml_time_us() - t_start_us)}\n")
    ggml_opt_free(opt_ctx)
