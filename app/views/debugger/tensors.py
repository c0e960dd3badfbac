"""The tensors panel: every tensor of every context, in creation order."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _
from app.views.debugger.where import Where, ref_key
from engine.core.optable import GGMLOp
from engine.core.tensor import Tensor
from engine.trace import State
from engine.core.types import TYPE_TRAITS


@dataclass(frozen=True, slots=True)
class TensorRow:
    name: str
    type: str
    ne: str
    op: str
    url: str
    selected: bool
    is_view: bool


def tensor_list(state: State, where: Where, selected: Tensor | None) -> list[TensorRow]:
    rows = []
    for ctx in state.contexts.values():
        for t in state.tensor_infos(ctx.id):
            key = ref_key(ctx.id, t.offs)
            rows.append(TensorRow(t.name or _("(unnamed)"), TYPE_TRAITS[t.type].type_name,
                                  "[" + ", ".join(str(x) for x in t.ne) + "]", GGMLOp(t.op).name,
                                  where.url(tensor=key), selected is not None
                                  and (ctx.id, t.offs) == (selected.ctx.id, selected.offs),
                                  t.is_view))
    return rows
