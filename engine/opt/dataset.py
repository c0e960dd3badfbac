"""ggml-opt's datasets: every datapoint and label in two tensors of one CPU buffer, read in
batches of shards in the order of a permutation that ggml_opt_dataset_shuffle shuffles."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.backend.ctx_alloc import ggml_backend_alloc_ctx_tensors_from_buft
from engine.backend.buffer import (
    Buffer,
    ggml_backend_buffer_free,
    ggml_backend_cpu_buffer_type,
    ggml_backend_tensor_get,
    ggml_backend_tensor_set,
)
from engine.core.api import Writes, query, writes
from engine.core.context import Context, ggml_free, ggml_init, ggml_init_params, ggml_tensor_overhead
from engine.core.errors import ggml_assert
from engine.core.tensor import Tensor, ggml_is_contiguous, ggml_nbytes, ggml_new_tensor_2d

if TYPE_CHECKING:
    from engine.opt.context import OptContext

@dataclass(eq=False)
class Dataset:
    """struct ggml_opt_dataset: data [ne_datapoint, ndata] and labels [ne_label, ndata] in one
    CPU buffer; `permutation` orders the shards of ndata_shard datapoints each."""
    ctx: Context
    buf: Buffer
    data: Tensor
    labels: Tensor | None
    ndata: int
    ndata_shard: int
    nbs_data: int  # bytes of one shard of data
    nbs_labels: int  # bytes of one shard of labels
    permutation: list[int]


@writes(Writes.PLACES, Writes.OPT)
def ggml_opt_dataset_init(type_data: int, type_label: int, ne_datapoint: int, ne_label: int,
                          ndata: int, ndata_shard: int) -> Dataset:
    fn = "ggml_opt_dataset_init"
    ggml_assert(ne_datapoint > 0, "ne_datapoint >  0", fn)
    ggml_assert(ne_label >= 0, "ne_label     >= 0", fn)
    ggml_assert(ndata > 0, "ndata        >  0", fn)
    ggml_assert(ndata_shard > 0, "ndata_shard  >  0", fn)
    ctx = ggml_init(ggml_init_params(2 * ggml_tensor_overhead(), None, True))
    data = ggml_new_tensor_2d(ctx, type_data, ne_datapoint, ndata)
    labels = ggml_new_tensor_2d(ctx, type_label, ne_label, ndata) if ne_label > 0 else None
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type())
    return Dataset(ctx, buf, data, labels, ndata, ndata_shard,
                   ggml_nbytes(data) * ndata_shard // ndata,
                   ggml_nbytes(labels) * ndata_shard // ndata if labels is not None else 0,
                   list(range(ndata // ndata_shard)))


@writes(Writes.OPT)
def ggml_opt_dataset_free(dataset: Dataset) -> None:
    ggml_backend_buffer_free(dataset.buf)
    ggml_free(dataset.ctx)


@query
def ggml_opt_dataset_ndata(dataset: Dataset) -> int:
    return dataset.ndata


@query
def ggml_opt_dataset_data(dataset: Dataset) -> Tensor:
    return dataset.data


@query
def ggml_opt_dataset_labels(dataset: Dataset) -> Tensor | None:
    return dataset.labels


@writes(Writes.OPT)
def ggml_opt_dataset_shuffle(opt_ctx: OptContext, dataset: Dataset, idata: int) -> None:
    """Shuffle all shards (idata < 0) or the shards of the first idata datapoints."""
    fn = "ggml_opt_dataset_shuffle"
    ggml_assert(idata <= dataset.ndata, "idata <= dataset->ndata", fn)
    if idata < 0:
        opt_ctx.rng.shuffle(dataset.permutation)
        return
    ggml_assert(idata % dataset.ndata_shard == 0, "idata % dataset->ndata_shard == 0", fn)
    opt_ctx.rng.shuffle(dataset.permutation, idata // dataset.ndata_shard)


def _shards_per_batch(dataset: Dataset, nb_data_batch: int, ibatch: int, fn: str) -> int:
    ggml_assert(nb_data_batch % dataset.nbs_data == 0, "nb_data_batch % dataset->nbs_data == 0", fn)
    n = nb_data_batch // dataset.nbs_data
    ggml_assert((ibatch + 1) * n <= len(dataset.permutation),
                "(ibatch + 1)*shards_per_batch <= int64_t(dataset->permutation.size())", fn)
    return n


def _shards(dataset: Dataset, n: int, ibatch: int):
    """(position in the batch, the shard's data bytes, its labels bytes or None) of batch ibatch."""
    for k in range(n):
        ishard = dataset.permutation[ibatch * n + k]
        data = ggml_backend_tensor_get(dataset.data, ishard * dataset.nbs_data, dataset.nbs_data)
        labels = None if dataset.labels is None else ggml_backend_tensor_get(
            dataset.labels, ishard * dataset.nbs_labels, dataset.nbs_labels)
        yield k, data, labels


@writes(Writes.OPT)
def ggml_opt_dataset_get_batch(dataset: Dataset, data_batch: Tensor, labels_batch: Tensor | None,
                               ibatch: int) -> None:
    """Copy batch ibatch (shards in permutation order) into the tensors data_batch, labels_batch."""
    fn = "ggml_opt_dataset_get_batch"
    ggml_assert(data_batch is not None and ggml_is_contiguous(data_batch),
                "data_batch && ggml_is_contiguous(data_batch)", fn)
    ggml_assert(labels_batch is None or ggml_is_contiguous(labels_batch),
                "!labels_batch || ggml_is_contiguous(labels_batch)", fn)
    ggml_assert((labels_batch is None) == (dataset.labels is None),
                "(labels_batch == nullptr) == (dataset->labels == nullptr)", fn)
    ggml_assert(data_batch.type == dataset.data.type, "data_batch->type == dataset->data->type", fn)
    ggml_assert(labels_batch is None or dataset.labels is None or labels_batch.type == dataset.labels.type,
                "!labels_batch || labels_batch->type == dataset->labels->type", fn)
    nb_data_batch = ggml_nbytes(data_batch)
    ggml_assert(nb_data_batch % dataset.nbs_data == 0, "nb_data_batch % dataset->nbs_data == 0", fn)
    n = nb_data_batch // dataset.nbs_data
    if labels_batch is not None:
        ggml_assert(ggml_nbytes(labels_batch) == n * dataset.nbs_labels,
                    "nb_labels_batch == shards_per_batch*dataset->nbs_labels", fn)
    _shards_per_batch(dataset, nb_data_batch, ibatch, fn)
    for k, data, labels in _shards(dataset, n, ibatch):
        ggml_backend_tensor_set(data_batch, data, k * dataset.nbs_data, dataset.nbs_data)
        if labels_batch is not None:
            ggml_backend_tensor_set(labels_batch, labels, k * dataset.nbs_labels, dataset.nbs_labels)


@query
def ggml_opt_dataset_get_batch_host(dataset: Dataset, data_batch, nb_data_batch: int, labels_batch,
                                    ibatch: int) -> None:
    """Copy batch ibatch into host memory: writable buffers (bytearray, numpy array) as C's pointers."""
    fn = "ggml_opt_dataset_get_batch_host"
    ggml_assert((labels_batch is None) == (dataset.labels is None),
                "(labels_batch == nullptr) == (dataset->labels == nullptr)", fn)
    n = _shards_per_batch(dataset, nb_data_batch, ibatch, fn)
    out_data = memoryview(data_batch).cast("B")
    out_labels = None if labels_batch is None else memoryview(labels_batch).cast("B")
    for k, data, labels in _shards(dataset, n, ibatch):
        out_data[k * dataset.nbs_data:(k + 1) * dataset.nbs_data] = data
        if out_labels is not None:
            out_labels[k * dataset.nbs_labels:(k + 1) * dataset.nbs_labels] = labels
