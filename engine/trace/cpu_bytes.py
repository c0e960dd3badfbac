"""Which bytes of a trace hold values that depend on the CPU (a BLAS product's, or computed from
one): the recorder marks them as steps write them, and the trace's hash leaves them out."""

from __future__ import annotations

from engine.compute.kernels import same_bits_on_every_cpu
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor, ggml_nbytes
from engine.trace.steps import Step


def data_range(t: Tensor) -> tuple[int, int, int]:
    """(context id, start, end) of t's data (empty when it has none)."""
    if t.data is None:
        return (-1, 0, 0)
    ctx, off = t.ctx.space.resolve(t.data)
    return (ctx.id, off, off + ggml_nbytes(t))


def written_sources(node: Tensor) -> list[Tensor]:
    """The sources an optimizer step overwrites in place: the parameter, and AdamW's moments."""
    if node.op == GGMLOp.OPT_STEP_ADAMW:
        return [node.source(0), node.source(2), node.source(3)]
    if node.op == GGMLOp.OPT_STEP_SGD:
        return [node.source(0)]
    return []


class CpuBytes:
    """The byte ranges, per context or buffer id, that now hold CPU-dependent values."""

    def __init__(self) -> None:
        self.ranges: dict[int, list[tuple[int, int]]] = {}  # sorted, disjoint

    def depends_on_cpu(self, t: Tensor) -> bool:
        cid, a, b = data_range(t)
        return any(s < b and a < e for s, e in self.ranges.get(cid, ()))

    def mark(self, cid: int, a: int, b: int, add: bool) -> None:
        """Mark [a, b) of context cid as holding CPU-dependent values (add) or not."""
        if a >= b:
            return
        kept = []
        for s, e in self.ranges.get(cid, ()):
            kept += [(x, y) for x, y in ((s, min(e, a)), (max(s, b), e)) if x < y]
        if add:
            kept.append((a, b))
        self.ranges[cid] = sorted(kept)

    def after_step(self, step: Step) -> None:
        """What a step wrote depends on the CPU if the step does; otherwise it no longer does."""
        for p in step.patches:
            self.mark(p.ctx, p.offset, p.end, add=not step.same_on_every_cpu)

    def node(self, node: Tensor) -> bool:
        """Does node's result have the same bits on every CPU? If not, all of its bytes (even
        those that happened not to change) are marked as depending on the CPU."""
        same = same_bits_on_every_cpu(node) and not any(
            self.depends_on_cpu(s) for s in node.src if s is not None)
        if not same:
            for t in (node, *written_sources(node)):
                self.mark(*data_range(t), add=True)
        return same
