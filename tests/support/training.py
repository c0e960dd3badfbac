"""ggml's MNIST example's fully connected model, trained with ggml-opt on the engine or on real ggml.

Both sides build the same program from the same initial weights and data: a static context with
the weights and the images batch in a CPU backend buffer, a compute context for the graphs, a
scheduler over the CPU backend, a dataset, an optimization context. `train` runs epochs with
ggml_opt_epoch and records, after every batch, what the epoch callback sees (the loss and
accuracy so far with their uncertainties), and the names and ops of the nodes the scheduler
computed in the first training step.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import ggml as real
import numpy as np

from engine import ggml as eng
from engine import ggml_backend as eb
from engine import ggml_opt as eo
from engine.backend import sched_api as esched
from engine.ggml_alloc import ggml_backend_alloc_ctx_tensors

F32 = 0
N_IN, N_CLASSES = 64, 10


@dataclass
class Case:
    hidden: int = 16
    nbatch_physical: int = 10
    opt_period: int = 1
    loss_type: int = eo.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY
    optimizer: int = eo.GGML_OPT_OPTIMIZER_TYPE_ADAMW
    alpha: float = 0.001
    wd: float = 0.0
    ndata: int = 60
    ndata_shard: int = 1
    val_batches: int = 1  # physical batches evaluated after the training ones
    epochs: int = 1
    threads: int = 2

    @property
    def ne_label(self) -> int:
        """MEAN and SUM losses read no labels: their datasets have none."""
        return 0 if self.loss_type in (eo.GGML_OPT_LOSS_TYPE_MEAN, eo.GGML_OPT_LOSS_TYPE_SUM) else N_CLASSES


def case_data(case: Case, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    shapes = {"fc1.weight": (case.hidden, N_IN), "fc1.bias": (case.hidden,),
              "fc2.weight": (N_CLASSES, case.hidden), "fc2.bias": (N_CLASSES,)}
    weights = {k: rng.normal(0, 0.1, s).astype(np.float32) for k, s in shapes.items()}
    images = rng.random((case.ndata, N_IN), dtype=np.float32)
    labels = np.zeros((case.ndata, N_CLASSES), np.float32)
    labels[np.arange(case.ndata), rng.integers(0, N_CLASSES, case.ndata)] = 1.0
    return {"weights": weights, "images": images, "labels": labels}


@dataclass
class Run:
    steps: list  # (train?, ibatch, loss, loss_unc, accuracy, accuracy_unc) after every batch
    computed: list  # (name, op) of each node the first training step computed
    weights: dict  # name -> bytes after training
    pred: list  # the last training epoch's predictions


def _cb_values(train, ibatch, loss, accuracy) -> tuple:
    return (bool(train), int(ibatch), *[float(x) for x in loss], *[float(x) for x in accuracy])


class EngineSide:
    api = eng

    def __init__(self, case: Case) -> None:
        self.case = case
        self.backend = eb.ggml_backend_cpu_init()
        eb.ggml_backend_cpu_set_n_threads(self.backend, case.threads)
        self.sched = esched.ggml_backend_sched_new([self.backend], None, 1, eng.GGML_DEFAULT_GRAPH_SIZE, False, True)

    def ctx(self, size: int):
        return eng.ggml_init(eng.ggml_init_params(size, None, True))

    def alloc(self, ctx):
        return ggml_backend_alloc_ctx_tensors(ctx, self.backend)

    def set(self, t, values: np.ndarray) -> None:
        eb.ggml_backend_tensor_set(t, np.ascontiguousarray(values), 0, eng.ggml_nbytes(t))

    def get(self, t) -> bytes:
        return bytes(eb.ggml_backend_tensor_get(t, 0, eng.ggml_nbytes(t)))

    def dataset(self, ndata: int, shard: int, ne_label: int = N_CLASSES):
        return eo.ggml_opt_dataset_init(F32, F32, N_IN, ne_label, ndata, shard)

    def ds_data(self, ds):
        return eo.ggml_opt_dataset_data(ds), eo.ggml_opt_dataset_labels(ds)

    def opt_init(self, ctx_compute, images, logits):
        c = self.case
        params = eo.ggml_opt_default_params(self.sched, c.loss_type)
        params.ctx_compute, params.inputs, params.outputs, params.opt_period = ctx_compute, images, logits, c.opt_period
        pars = eo.ggml_opt_optimizer_params()
        pars.adamw.alpha = pars.sgd.alpha = c.alpha
        pars.adamw.wd = pars.sgd.wd = c.wd
        params.get_opt_pars, params.get_opt_pars_ud = eo.ggml_opt_get_constant_optimizer_params, pars
        params.optimizer = c.optimizer
        return eo.ggml_opt_init(params)

    def shuffle(self, opt_ctx, ds, idata: int) -> None:
        eo.ggml_opt_dataset_shuffle(opt_ctx, ds, idata)

    def epoch(self, opt_ctx, ds, idata_split: int, log: list):
        train, val = eo.ggml_opt_result_init(), eo.ggml_opt_result_init()

        def cb(is_train, ctx, dataset, result, ibatch, ibatch_max, t_start):
            log.append(_cb_values(is_train, ibatch, eo.ggml_opt_result_loss(result),
                                  eo.ggml_opt_result_accuracy(result)))
        eo.ggml_opt_epoch(opt_ctx, ds, train, val, idata_split, cb, cb)
        return eo.ggml_opt_result_pred(train)

    def watch(self, log: list) -> None:
        def cb(t, ask):
            if ask:
                log.append((t.name, eng.ggml_op_name(t.op)))
            return True
        esched.ggml_backend_sched_set_eval_callback(self.sched, cb, None)

    def unwatch(self) -> None:
        esched.ggml_backend_sched_set_eval_callback(self.sched, None, None)


class RealSide:
    api = real

    def __init__(self, case: Case) -> None:
        self.case = case
        self.keep: list = []
        self.backend = real.ggml_backend_cpu_init()
        real.ggml_backend_cpu_set_n_threads(self.backend, case.threads)
        arr = (real.ggml_backend_t_ctypes * 1)(self.backend)
        self.keep.append(arr)
        self.sched = real.ggml_backend_sched_new(arr, None, 1, real.GGML_DEFAULT_GRAPH_SIZE, False, True)

    def ctx(self, size: int):
        return real.ggml_init(real.ggml_init_params(mem_size=size, mem_buffer=None, no_alloc=True))

    def alloc(self, ctx):
        return real.ggml_backend_alloc_ctx_tensors(ctx, self.backend)

    def set(self, t, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values)
        real.ggml_backend_tensor_set(t, v.ctypes.data_as(ctypes.c_void_p), 0, real.ggml_nbytes(t))

    def get(self, t) -> bytes:
        out = ctypes.create_string_buffer(real.ggml_nbytes(t))
        real.ggml_backend_tensor_get(t, out, 0, real.ggml_nbytes(t))
        return out.raw

    def dataset(self, ndata: int, shard: int, ne_label: int = N_CLASSES):
        return real.ggml_opt_dataset_init(F32, F32, N_IN, ne_label, ndata, shard)

    def ds_data(self, ds):
        return real.ggml_opt_dataset_data(ds), real.ggml_opt_dataset_labels(ds)

    def opt_init(self, ctx_compute, images, logits):
        c = self.case
        params = real.ggml_opt_default_params(self.sched, c.loss_type)
        params.ctx_compute, params.inputs, params.outputs, params.opt_period = ctx_compute, images, logits, c.opt_period
        pars = real.ggml_opt_optimizer_params()
        adamw = pars.adamw
        adamw.alpha, adamw.beta1, adamw.beta2, adamw.eps, adamw.wd = c.alpha, 0.9, 0.999, 1e-8, c.wd
        pars.sgd.alpha, pars.sgd.wd = c.alpha, c.wd
        self.keep.append(pars)
        params.get_opt_pars = ctypes.cast(real.lib.ggml_opt_get_constant_optimizer_params, ctypes.c_void_p)
        params.get_opt_pars_ud = ctypes.cast(ctypes.pointer(pars), ctypes.c_void_p)
        params.optimizer = c.optimizer
        return real.ggml_opt_init(params)

    def shuffle(self, opt_ctx, ds, idata: int) -> None:
        real.ggml_opt_dataset_shuffle(opt_ctx, ds, idata)

    def epoch(self, opt_ctx, ds, idata_split: int, log: list):
        train, val = real.ggml_opt_result_init(), real.ggml_opt_result_init()

        @real.ggml_opt_epoch_callback
        def cb(is_train, ctx, dataset, result, ibatch, ibatch_max, t_start):
            loss, loss_unc, acc, acc_unc = (ctypes.c_double() for _ in range(4))
            real.ggml_opt_result_loss(result, ctypes.byref(loss), ctypes.byref(loss_unc))
            real.ggml_opt_result_accuracy(result, ctypes.byref(acc), ctypes.byref(acc_unc))
            log.append(_cb_values(is_train, ibatch, (loss.value, loss_unc.value), (acc.value, acc_unc.value)))
        self.keep.append(cb)
        real.ggml_opt_epoch(opt_ctx, ds, train, val, idata_split, cb, cb)
        if self.case.loss_type != eo.GGML_OPT_LOSS_TYPE_CROSS_ENTROPY:
            return []  # no pred tensor: ggml_opt_result_pred copies nothing
        ndata = ctypes.c_int64()
        real.ggml_opt_result_ndata(train, ctypes.byref(ndata))
        pred = (ctypes.c_int32 * max(ndata.value, 1))()
        real.ggml_opt_result_pred(train, pred)
        return list(pred)[:ndata.value]

    def watch(self, log: list) -> None:
        @real.ggml_backend_sched_eval_callback
        def cb(t, ask, user_data):
            if ask:
                log.append((t.contents.name.decode(), real.ggml_op_name(t.contents.op).decode()))
            return True
        self.keep.append(cb)
        real.ggml_backend_sched_set_eval_callback(self.sched, cb, None)

    def unwatch(self) -> None:
        none = ctypes.cast(None, real.ggml_backend_sched_eval_callback)
        real.ggml_backend_sched_set_eval_callback(self.sched, none, None)


def new_weights(side, ctx_static, data: dict) -> dict:
    """The case's weight tensors (f32, named as in data["weights"]) in ctx_static, no data yet."""
    api = side.api
    weights = {}
    for name, values in data["weights"].items():
        ne = list(reversed(values.shape))
        t = api.ggml_new_tensor_1d(ctx_static, F32, ne[0]) if len(ne) == 1 else \
            api.ggml_new_tensor_2d(ctx_static, F32, ne[0], ne[1])
        api.ggml_set_name(t, name.encode() if api is real else name)
        weights[name] = t
    return weights


def train(side, case: Case, data: dict, shuffle: bool = True) -> Run:
    """Build the model on `side`, train case.epochs epochs, return what was seen."""
    api = side.api
    ctx_static = side.ctx(1024 * api.ggml_tensor_overhead())
    weights = new_weights(side, ctx_static, data)
    images = api.ggml_new_tensor_2d(ctx_static, F32, N_IN, case.nbatch_physical)
    api.ggml_set_name(images, b"images" if api is real else "images")
    api.ggml_set_input(images)
    side.keep_buf = side.alloc(ctx_static)
    for name, t in weights.items():
        side.set(t, data["weights"][name])

    ctx_compute = side.ctx(api.GGML_DEFAULT_GRAPH_SIZE * api.ggml_tensor_overhead() + 3 * api.ggml_graph_overhead())
    for t in weights.values():
        api.ggml_set_param(t)
    fc1 = api.ggml_relu(ctx_compute, api.ggml_add(
        ctx_compute, api.ggml_mul_mat(ctx_compute, weights["fc1.weight"], images), weights["fc1.bias"]))
    logits = api.ggml_add(ctx_compute, api.ggml_mul_mat(ctx_compute, weights["fc2.weight"], fc1), weights["fc2.bias"])

    ds = side.dataset(case.ndata, case.ndata_shard, case.ne_label)
    ds_data, ds_labels = side.ds_data(ds)
    side.set(ds_data, data["images"])
    if case.ne_label:
        side.set(ds_labels, data["labels"])

    opt_ctx = side.opt_init(ctx_compute, images, logits)
    if shuffle:
        side.shuffle(opt_ctx, ds, -1)
    idata_split = case.ndata - case.val_batches * case.nbatch_physical
    steps: list = []
    computed: list = []
    pred: list = []
    for epoch in range(case.epochs):
        if epoch == 0:
            side.watch(computed)
        if shuffle and epoch > 0:
            side.shuffle(opt_ctx, ds, idata_split)
        pred = side.epoch(opt_ctx, ds, idata_split, steps)
        side.unwatch()
    n_first = next((i for i, (name, _) in enumerate(computed) if i and name == computed[0][0]), len(computed))
    return Run(steps, computed[:n_first], {k: side.get(t) for k, t in weights.items()}, pred)
