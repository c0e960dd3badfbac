"""ggml-opt's results: the loss, predictions and correct count of the batches evaluated."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from engine.core.api import query

F32 = np.float32

@dataclass(eq=False)
class OptResult:
    """struct ggml_opt_result: what the evaluated batches gave, batch by batch."""
    ndata: int = 0
    loss: list = field(default_factory=list)  # float32, one per physical batch
    pred: list = field(default_factory=list)
    ncorrect: int = 0  # -1: not known (no ncorrect tensor)
    opt_period: int = -1
    loss_per_datapoint: bool = False


@query
def ggml_opt_result_init() -> OptResult:
    return OptResult()


@query
def ggml_opt_result_free(result: OptResult) -> None:
    """Nothing to release: the result is garbage collected."""


@query
def ggml_opt_result_reset(result: OptResult) -> None:
    result.ndata = 0
    result.loss.clear()
    result.pred.clear()
    result.ncorrect = 0


@query
def ggml_opt_result_ndata(result: OptResult) -> int:
    return result.ndata


@query
def ggml_opt_result_loss(result: OptResult) -> tuple[float, float]:
    """(the loss: the mean per batch, or the sum for a SUM loss; its uncertainty)."""
    nbatches = len(result.loss)
    if nbatches == 0:
        return 0.0, math.nan
    total = total_sq = 0.0
    for loss in result.loss:
        # a per-datapoint loss was scaled by 1/opt_period in each physical batch
        scaled = F32(loss) * F32(result.opt_period) if result.loss_per_datapoint else F32(loss)
        total += float(scaled)
        total_sq += float(F32(scaled * scaled))
    mean = total / nbatches
    loss = mean if result.loss_per_datapoint else total
    if nbatches < 2:
        return loss, math.nan
    var_sum = total_sq / nbatches - mean * mean  # without Bessel's correction
    unc = _sqrt(var_sum / (nbatches - 1)) if result.loss_per_datapoint \
        else _sqrt(var_sum * nbatches / (nbatches - 1))
    return loss, unc


@query
def ggml_opt_result_pred(result: OptResult) -> list[int]:
    return list(result.pred)


@query
def ggml_opt_result_accuracy(result: OptResult) -> tuple[float, float]:
    """(correct / evaluated, its binomial uncertainty); NaN when no ncorrect was computed."""
    accuracy = result.ncorrect / result.ndata if result.ncorrect >= 0 and result.ndata else math.nan
    unc = _sqrt(accuracy * (1.0 - accuracy) / (result.ndata - 1)) \
        if result.ncorrect >= 0 and result.ndata >= 2 else math.nan
    return accuracy, unc


def _sqrt(x: float) -> float:
    """C's sqrt: of a negative (a variance rounded below 0) the x86 default NaN, sign bit set."""
    return math.sqrt(x) if x >= 0 else -math.nan
