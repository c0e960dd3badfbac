"""The Recorder's view of ggml-opt calls: what an optimization context or a dataset holds.

A ggml_opt_* call works on contexts, graphs and a scheduler the program never named: the
optimization context's static, CPU and copy contexts, the graph it computes, the dataset's
context. `opt_parts` lists them so the recorder tracks those contexts, diffs those tensor
structs and plans that graph, as it does for the same things passed directly (for the calls
declared `@writes(Writes.OPT)`). A training loop (ggml_opt_epoch, ggml_opt_fit: `Writes.LOOP`) is
one step: the nodes it computes, batch after batch, are not steps of their own (its result is what
it shows); ggml_opt_eval's nodes are.
"""

from __future__ import annotations

from typing import Any

from engine.opt.context import OptContext
from engine.opt.dataset import Dataset


def opt_parts(args: tuple) -> list[Any]:
    """The contexts, scheduler and allocated graph inside the optimization contexts and
    datasets among args."""
    out: list[Any] = []
    for a in args:
        if isinstance(a, OptContext):
            out += [c for c in (a.ctx_compute, a.ctx_static, a.ctx_cpu, a.ctx_copy) if c is not None and not c.freed]
            if a.backend_sched is not None:
                out.append(a.backend_sched)
            if a.allocated_graph_copy is not None:
                out.append(a.allocated_graph_copy)
        elif isinstance(a, Dataset) and not a.ctx.freed:
            out.append(a.ctx)
    return out
