"""The mem_size accountant panel: for each context, what the program asked for against what it
used, split the way ggml's formulas count it, and what a smaller pool would have failed on.

Every number comes from engine.core.accountant, which reads the pool rebuilt at this step.
"""

from __future__ import annotations

from dataclasses import dataclass

from threading import Lock

from cachetools import LRUCache, cached

from app import i18n
from app.i18n import _
from app.views.debugger.layouts import layout_key
from engine.core.accountant import MemAccount, ObjectCost, account
from engine.core.context import ggml_tensor_overhead
from engine.core.errors import GGMLPoolError
from engine.core.graph import ggml_graph_overhead
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.trace import State


@dataclass(frozen=True, slots=True)
class Part:
    label: str  # what the bytes hold
    nbytes: int
    how: str  # the formula ggml counts them with
    kind: str  # the pool panel's segment colour


@dataclass(frozen=True, slots=True)
class AccountView:
    ctx: int
    acc: MemAccount
    parts: list[Part]
    formula: int  # n_tensors * ggml_tensor_overhead() + n_graphs * ggml_graph_overhead() + data
    formula_text: str
    beyond: int  # used - formula: data padding and work buffers, which no formula names
    beyond_text: str  # what those bytes are
    failing: ObjectCost | None  # what ggml_new_object would fail on in a smaller pool
    failing_message: str


# ggml_init rounds an owned pool's mem_size up to a multiple of GGML_MEM_ALIGN: the next smaller
# pool a program can ask for is 16 bytes smaller
SMALLER = 16


def _message(acc: MemAccount, obj: ObjectCost) -> str:
    """ggml's abort message for `obj` in a pool SMALLER bytes under the smallest."""
    return str(GGMLPoolError(obj.end, acc.used - SMALLER))


def accounts(state: State) -> list[AccountView]:
    return [_account_view(state, cid) for cid in state.contexts]


@cached(LRUCache(64), key=lambda state, cid: (layout_key(state, cid), i18n.current()), lock=Lock())
def _account_view(state: State, cid: int) -> AccountView:
    """A context's accounts: made once per layout (they count objects and structs, never data)."""
    ctx = state.contexts[cid]
    acc = account(ctx, state.tensor_infos(cid))
    n_tensors = sum(o.kind == "TENSOR" for o in acc.objects)
    graphs = [o for o in acc.objects if o.kind == "GRAPH"]
    parts = [Part(_("object headers"), acc.headers,
                  f"{len(acc.objects)} × GGML_OBJECT_SIZE ({GGML_OBJECT_SIZE})", "header"),
             Part(_("tensor structs"), acc.structs,
                  f"{n_tensors} × sizeof(struct ggml_tensor) ({GGML_TENSOR_SIZE})", "struct"),
             Part(_("graphs"), acc.graphs, "ggml_graph_nbytes(size, grads)", "graph"),
             Part(_("tensor data"), acc.data, _("Σ ggml_nbytes of tensors that own data"), "data"),
             Part(_("work buffers"), acc.work,
                  _("{n} × ggml_graph_plan's work_size").format(n=len(acc.work_buffers)), "work"),
             Part(_("data padding"), acc.data_padding, "GGML_PAD(ggml_nbytes, GGML_MEM_ALIGN = 16)",
                  "padding"),
             Part(_("graph padding"), acc.graph_padding, _("inside ggml_graph_overhead()"), "padding"),
             Part(_("unused (slack)"), acc.slack, "mem_size − ggml_used_mem(ctx)", "free")]
    # the formulas a program sizes its context with, applied to what this pool holds
    graph_overheads = sum(o.end - o.header for o in graphs)
    formula = n_tensors * ggml_tensor_overhead() + graph_overheads + acc.data
    text = f"{n_tensors} × ggml_tensor_overhead() ({ggml_tensor_overhead()})"
    if graphs:
        default = ggml_graph_overhead()
        each = {o.end - o.header for o in graphs}
        text += f" + {len(graphs)} × " + (f"ggml_graph_overhead() ({default})"
                                         if each == {default} else "ggml_graph_overhead_custom(…)")
    text += " + " + _("{n} bytes of data").format(n=acc.data)
    # what no formula names, in the table's own numbers (its data padding and work buffers rows)
    works = acc.work_buffers
    said = [_("{n} bytes of data padding").format(n=acc.data_padding)] if acc.data_padding else []
    if works:
        sizes = ", ".join(f"{GGML_OBJECT_SIZE} + {o.data}" for o in works)  # header + work bytes
        said.append(i18n.ngettext("{n} work buffer of {sizes} bytes", "{n} work buffers of {sizes} bytes",
                                  len(works)).format(n=len(works), sizes=sizes))
    failing = acc.first_to_fail(acc.used - SMALLER) if acc.objects else None
    return AccountView(cid, acc, parts, formula, text, acc.used - formula, _(" and ").join(said), failing,
                       _message(acc, failing) if failing else "")
