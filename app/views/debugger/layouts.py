"""What the panels share between steps: a context's layout (its object headers and tensor structs,
not its data), named by engine.core.infos.layout_digest and read once per rebuilt state. Steps
that compute a graph's nodes all have the same layouts, so what a panel makes from a layout alone
(the pool's bars, the tensor list, the mem_size accounts) is made once and kept under its key."""

from __future__ import annotations

from threading import Lock
from weakref import WeakKeyDictionary

from cachetools import LRUCache, cached

from app import i18n
from engine.core.context import GGML_OBJECT_TYPE_TENSOR
from engine.core.infos import layout_digest
from engine.trace import State

_KEYS: WeakKeyDictionary[State, dict[int, tuple]] = WeakKeyDictionary()  # a state's pools never change


def layout_key(state: State, cid: int) -> tuple:
    """Context cid's layout in this state: (cid, mem_size, digest of its headers and structs)."""
    keys = _KEYS.setdefault(state, {})
    if cid not in keys:
        ctx = state.contexts[cid]
        keys[cid] = (cid, ctx.mem_size, layout_digest(ctx))
    return keys[cid]


@cached(LRUCache(64), key=layout_key, lock=Lock())
def tensor_offsets(state: State, cid: int) -> frozenset[int]:
    """The offsets of context cid's tensor structs."""
    return frozenset(o.offs for o in state.contexts[cid].objects() if o.type == GGML_OBJECT_TYPE_TENSOR)
