"""The pools of a trace: finding the bytes a step changed, and the pools a rebuilt state reads.

A step's patches are the runs of bytes its call changed (`changed_runs`, found from the edges
of the changed runs, so a model's hundreds of megabytes loaded at once never become an index per
byte); a rebuilt state's pools are fresh arrays (`fresh_pool`) or, where no later patch touches
them, a checkpoint's read-only copy (`frozen`), shared by every state rebuilt from it.
"""

from __future__ import annotations

import numpy as np


def frozen(a: np.ndarray) -> np.ndarray:
    """A read-only copy: a checkpoint's pools are shared by the states rebuilt from it."""
    c = a.copy()
    c.setflags(write=False)
    return c


def fresh_pool(size: int, like: np.ndarray | None) -> np.ndarray:
    """A pool for a rebuilt state: zeros, or a copy of a checkpoint. Its pages are touched in
    order first (calloc hands out pages on first write, and a page fault per scattered patch
    costs more than the copying itself)."""
    pool = np.zeros(size, dtype=np.uint8)
    if size >= 1 << 20:
        pool[::4096] = 0
    if like is not None:
        np.copyto(pool, like)
    return pool


def changed_runs(cur: np.ndarray, old: np.ndarray, gap: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """[start, end) of each run of bytes where cur differs from old, runs whose changed bytes are
    at most `gap` apart merged. Found from the edges of the changed runs (a loaded model's
    hundreds of MB never become an index per byte)."""
    changed = np.empty(cur.size + 2, dtype=np.int8)
    changed[0] = changed[-1] = 0
    np.not_equal(cur, old, out=changed[1:-1].view(bool))
    edges = np.flatnonzero(np.diff(changed))  # alternately a run's start and its end
    if edges.size == 0:
        return edges, edges
    starts, ends = edges[0::2], edges[1::2]
    keep = np.concatenate([[True], starts[1:] - ends[:-1] + 1 > gap])
    return starts[keep], np.concatenate([ends[:-1][keep[1:]], ends[-1:]])
