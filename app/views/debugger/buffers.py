"""The backend buffers panel: each ggml-backend buffer (weights, compute, a device's own memory)
as a bar of the tensors whose data it holds, what the step changed outlined."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _
from app.views.debugger.pool import bar_weight
from app.views.debugger.where import Where, ref_key
from engine.backend.buffer import (GGML_BACKEND_BUFFER_USAGE_ANY, GGML_BACKEND_BUFFER_USAGE_COMPUTE,
                                   GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
from engine.backend.repack import CPU_REPACK_BUFT
from engine.core.types import TYPE_TRAITS
from engine.trace import State, Step

USAGE = {GGML_BACKEND_BUFFER_USAGE_ANY: "any", GGML_BACKEND_BUFFER_USAGE_WEIGHTS: "weights",
         GGML_BACKEND_BUFFER_USAGE_COMPUTE: "compute"}


@dataclass
class Segment:
    kind: str  # header, struct, graph, data, padding, work, free
    start: int
    size: int
    width: float  # percent of the bar
    label: str
    changed: bool
    tensor: str | None = None  # key of the tensor this segment belongs to
    url: str | None = None


@dataclass(frozen=True, slots=True)
class BufferView:
    id: int
    name: str  # the buffer type's: CPU, GPU0, ...
    usage: str
    host: bool  # host memory: the CPU reads it directly
    repacked: bool  # CPU_REPACK: the CPU computes on it, but its bytes are not the tensors' plain blocks
    base: int
    size: int
    used: int  # bytes of tensor data in it
    n_tensors: int
    segments: list[Segment]


def buffers(state: State, step: Step, where: Where) -> list[BufferView]:
    changed = [(p.offset, p.end) for p in step.patches if p.ctx in state.buffers]
    owners = {p.ctx for p in step.patches}
    placed: dict[int, list] = {bid: [] for bid in state.buffers}
    if state.buffers:
        for cid in state.contexts:
            for t in state.tensor_infos(cid):
                if not t.data or t.is_view:
                    continue
                for bid, buf in state.buffers.items():
                    if buf.base <= t.data < buf.base + buf.size:
                        placed[bid].append((t.data - buf.base, t.nbytes, ref_key(cid, t.offs), t.name,
                                            TYPE_TRAITS[t.type].type_name))
                        break
    views = []
    for bid, buf in state.buffers.items():
        segs: list[Segment] = []
        mine = changed if bid in owners else []
        end = 0
        for off, n, key, name, type_name in sorted(placed[bid], key=lambda x: (x[0], -x[1])):
            if off < end:  # bytes shared over time (the plan reuses them): drawn once, first tensor
                continue
            if off > end:
                segs.append(Segment("free", end, off - end, 0, _("not used by a tensor now"), False))
            hit = any(a < off + n and b > off for a, b in mine)
            # (with its type: a KV cache's is -ctk's or -ctv's, a weight's the file's)
            label = _("data of '{name}' ({type})").format(name=name, type=type_name)
            segs.append(Segment("data", off, n, 0, label, hit, key,
                                where.url(tensor=key, hex="data")))
            end = off + n
        if buf.size > end:
            segs.append(Segment("free", end, buf.size - end, 0, _("not used by a tensor now"), False))
        total = sum(bar_weight(s.size) for s in segs) or 1
        for s in segs:
            s.width = 100 * bar_weight(s.size) / total
        used = sum(p[1] for p in placed[bid])
        views.append(BufferView(bid, buf.name, USAGE.get(buf.usage, str(buf.usage)), buf.is_host,
                                buf.name == CPU_REPACK_BUFT.name, buf.base, buf.size, used, len(placed[bid]),
                                segs))
    return views
