"""What one thread did for one node, as records: how its kernel split the node (ShareKind) and
which part the thread took (Interval, Chunk, Tile or single indices).

ggml's threads split a node and tell nobody; these are the debugger's words for the splits ggml's
kernels make, recorded by each kernel (`params.took(ShareKind.ROWS, Interval(ir0, ir1))`), shown
to the compute observer as a ThreadShare, kept in the trace (engine.trace.steps.Step.threads) and
labelled by the app.

The ranges are NamedTuples, records that are also tuples: read by name (`r.rows.start`), they
equal, print to JSON and cross the worker's wire as the plain tuples the trace always held.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Callable, NamedTuple

from engine.core.notes import Note


class ShareKind(StrEnum):
    """How a kernel split a node among the threads, and so what a thread's ranges hold."""

    ROWS = "rows"  # Intervals of rows (of dst, or the rows its kernel walks: heads, patches...)
    BLOCKS = "blocks"  # Intervals of quant blocks
    KV = "kv"  # an Interval of KV positions (flash attention's split-KV path)
    INTERLEAVED = "interleaved"  # indices: every nth row (channel, plane...) from the ith
    CHUNKS = "chunks"  # Chunks or Tiles, taken from a counter the threads share
    ALL = "all"  # no ranges: the thread computed the whole node (or called a custom op's function)
    IDLE = "idle"  # no ranges: another thread computed the node


class Interval(NamedTuple):
    """[start, end): rows, blocks or KV positions."""

    start: int
    end: int


class Chunk(NamedTuple):
    """A chunk of rows taken from the shared counter (flash attention, gated delta net)."""

    chunk: int
    rows: Interval


class Tile(NamedTuple):
    """A mul_mat chunk: rows of src0 by rows of src1, a tile of dst."""

    chunk: int | str  # its number (mul_mat_id: "e{expert}.{chunk}")
    rows: Interval  # src0's rows: dst's ne[0] direction
    cols: Interval  # src1's rows: dst's ne[1] direction


ShareRange = int | Interval | Chunk | Tile


@dataclass(frozen=True, slots=True)
class ThreadShare:
    """What one thread did for one node: what the compute observer is shown and the trace keeps."""

    ith: int
    kind: ShareKind  # how the kernel split the node
    # what the thread took: records of its kind (ShareRange), annotated as the plain arrays they
    # equal, which is how they cross the worker's wire (app/sandbox/wire.py reads them back into
    # records with share_ranges)
    ranges: tuple[int | tuple[int | str | tuple[int, ...], ...], ...]
    seconds: float
    notes: tuple[Note, ...]  # how the kernel split the node, when its kind does not say all


def _index(x: Any) -> int:
    if type(x) is not int:
        raise ValueError(f"{reprlib.repr(x)} is not an index")
    return x


def _interval(x: Any) -> Interval:
    if type(x) is Interval:
        return x
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(f"{reprlib.repr(x)} is not an interval [start, end)")
    return Interval(_index(x[0]), _index(x[1]))


def _chunk_id(x: Any) -> int | str:
    return x if type(x) is str else _index(x)


def _chunk(x: Any) -> Chunk:
    if type(x) is Chunk:
        return x
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise ValueError(f"{reprlib.repr(x)} is not a chunk (number, rows)")
    return Chunk(_index(x[0]), _interval(x[1]))


def _tile(x: Any) -> Tile:
    if type(x) is Tile:
        return x
    if not isinstance(x, (tuple, list)) or len(x) != 3:
        raise ValueError(f"{reprlib.repr(x)} is not a tile (chunk, rows, cols)")
    return Tile(_chunk_id(x[0]), _interval(x[1]), _interval(x[2]))


def _chunk_or_tile(x: Any) -> Chunk | Tile:
    return _tile(x) if isinstance(x, (tuple, list)) and len(x) == 3 else _chunk(x)


# each kind's range as a record, from a record or its plain form (None: the kind has no ranges)
_READ: dict[ShareKind, Callable[[Any], ShareRange] | None] = {
    ShareKind.ROWS: _interval, ShareKind.BLOCKS: _interval, ShareKind.KV: _interval,
    ShareKind.INTERLEAVED: _index, ShareKind.CHUNKS: _chunk_or_tile,
    ShareKind.ALL: None, ShareKind.IDLE: None,
}
assert set(_READ) == set(ShareKind)


def share_ranges(kind: ShareKind, items: tuple | list) -> tuple[ShareRange, ...]:
    """A share's ranges as the records its kind holds, from records or from the plain arrays they
    cross the wire as (ValueError names the range that does not fit the kind)."""
    read = _READ[kind]
    if read is None:
        if items:
            raise ValueError(f"a share of kind {kind.value!r} has no ranges, not {len(items):,}")
        return ()
    try:
        return tuple(read(x) for x in items)
    except ValueError as e:
        raise ValueError(f"a share of kind {kind.value!r}: {e}") from None


def plain(r: ShareRange | str | tuple) -> int | str | tuple:
    """A range as the plain nested tuple it equals (what a trace's hash reads: its text is the
    one the tuples had before they were records)."""
    return tuple(map(plain, r)) if isinstance(r, tuple) else r
