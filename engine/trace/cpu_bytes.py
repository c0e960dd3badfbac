"""Which bytes of a trace hold values that depend on the CPU (a BLAS product's, or computed from
one): the recorder marks them as steps write them, and the trace's hash leaves them out."""

from __future__ import annotations

from engine.trace.steps import Step
from engine.core.tensor import Tensor, ggml_nbytes


class CpuDependence:
    """The Recorder's CPU-dependence bookkeeping (a mixin: it uses `self.cpu_dependent`, a dict of
    sorted byte ranges per context or buffer id)."""

    @staticmethod
    def data_range(t: Tensor) -> tuple[int, int, int]:
        """(context id, start, end) of t's data (empty when it has none)."""
        if t.data is None:
            return (-1, 0, 0)
        ctx, off = t.ctx.space.resolve(t.data)
        return (ctx.id, off, off + ggml_nbytes(t))

    def depends_on_cpu(self, t: Tensor) -> bool:
        cid, a, b = self.data_range(t)
        return any(s < b and a < e for s, e in self.cpu_dependent.get(cid, ()))

    def cpu_dependent_ranges(self, cid: int, a: int, b: int, add: bool) -> None:
        """Mark [a, b) of context cid as holding CPU-dependent values (add) or not."""
        if a >= b:
            return
        kept = []
        for s, e in self.cpu_dependent.get(cid, ()):
            kept += [(x, y) for x, y in ((s, min(e, a)), (max(s, b), e)) if x < y]
        if add:
            kept.append((a, b))
        self.cpu_dependent[cid] = sorted(kept)

    def mark_cpu_dependent(self, step: Step) -> None:
        """What a step wrote depends on the CPU if the step does; otherwise it no longer does."""
        for p in step.patches:
            self.cpu_dependent_ranges(p.ctx, p.offset, p.end, add=not step.same_on_every_cpu)
