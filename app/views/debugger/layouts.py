"""What the panels share between steps: a context's layout (its object headers and tensor structs,
not its data), named by engine.core.infos.layout_digest and read once per rebuilt state. Steps
that compute a graph's nodes all have the same layouts, so what a panel makes from a layout alone
(the pool's bars, the tensor list, the mem_size accounts) is made once and kept under its key."""

from __future__ import annotations

from dataclasses import dataclass
from threading import Lock
from weakref import WeakKeyDictionary

from cachetools import LRUCache, cached

from engine.core.context import GGML_OBJECT_TYPE_TENSOR
from engine.core.infos import layout_digest, object_rows
from engine.trace import State


@dataclass(frozen=True, slots=True)
class ContextLayout:
    """Context cid's layout in a state."""

    key: tuple  # (cid, mem_size, digest of its headers and structs)
    objects: list[tuple[int, int, int, int, int]]  # ctx.headers()
    rows: list[bytes]  # each object's header, with its tensor struct (engine.core.infos.object_rows)


_LAYOUTS: WeakKeyDictionary[State, dict[int, ContextLayout]] = WeakKeyDictionary()  # a state's pools never change
_LOCK = Lock()


def layout(state: State, cid: int) -> ContextLayout:
    """Context cid's layout in this state, read once."""
    with _LOCK:
        found = _LAYOUTS.setdefault(state, {}).get(cid)
    if found is None:
        ctx = state.contexts[cid]
        objects = state.headers(cid)
        rows = object_rows(ctx, objects)
        found = ContextLayout((cid, ctx.mem_size, layout_digest(ctx, rows)), objects, rows)
        with _LOCK:
            _LAYOUTS[state][cid] = found
    return found


def layout_key(state: State, cid: int) -> tuple:
    """Context cid's layout in this state: (cid, mem_size, digest of its headers and structs)."""
    return layout(state, cid).key


@cached(LRUCache(64), key=layout_key, lock=Lock())
def tensor_offsets(state: State, cid: int) -> frozenset[int]:
    """The offsets of context cid's tensor structs."""
    return frozenset(offs for _, offs, _, type_, _ in layout(state, cid).objects if type_ == GGML_OBJECT_TYPE_TENSOR)
