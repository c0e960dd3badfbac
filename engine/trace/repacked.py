"""Where a weights buffer's repacked bytes come from, so that a trace crossing a process boundary
can name them instead of carrying them. Not part of ggml.

A CPU_REPACK buffer's set_tensor (engine/backend/repack.py) writes a model file's tensor in its
interleaved layout (engine/quants/repack.py): its bytes are `layout.pack` of the file's rows, a
function of bytes the file holds. `RepackedSources` finds, for a patch of such bytes, the
tensor of a GGUF file whose packed rows they are, checked byte for byte (`Repacked`: the
tensor's offset in the file, the layout, the row size); `repacked_bytes` packs them again on the
other side, with the engine's own pack, after checking that the description fits the layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.core.types import TYPE_TRAITS
from engine.gguf import GGUFReader
from engine.quants.repack import LAYOUTS, RepackLayout, optimal_layout


SLACK = 256  # bytes of zeros a tensor's repacked bytes may start or end with outside its patches


@dataclass(frozen=True, slots=True)
class Repacked:
    """Bytes [skip, skip + size) of `layout`'s pack of the file's `whole` bytes from `at`, in
    rows of `row_bytes` (a patch holds only the bytes a step changed: a tensor's packed bytes
    that start or end with zeros are a patch of fewer)."""

    at: int  # where the tensor's plain rows lie in the file
    whole: int  # the tensor's bytes
    layout: str  # the layout's name (RepackLayout.name: "q4_K_8x8")
    row_bytes: int  # one plain row's bytes (the tensor's nb[1])
    skip: int  # where the patch's bytes start in the packed tensor


class RepackedSources:
    """The tensors of one GGUF file that CPU_REPACK would repack, by size: where the patches of
    a weights buffer's mirror may come from."""

    def __init__(self, path: str, file: np.ndarray) -> None:
        """`file`: the file's bytes (a read-only view of its pages)."""
        self.file = file
        self.by_size: dict[int, list[tuple[int, RepackLayout, int]]] = {}
        for t in GGUFReader(path).tensors:
            layout = optimal_layout(t.type, t.ne)
            if layout is not None:
                self.by_size.setdefault(t.nbytes, []).append((t.data_offset, layout, t.nb[1]))

    def find(self, pieces: list[tuple[int, object]]) -> list[Repacked] | None:
        """Where the pieces one step wrote (offset in the buffer, bytes) come from, byte for byte:
        one tensor's packed bytes, of which they are the changed runs; None if no tensor's are.
        (Candidates are the tensors a little larger than the pieces' span, at each place the
        span may start in them; the first piece's first bytes sort them out, the whole decides.)"""
        start = pieces[0][0]
        got = [(o - start, np.frombuffer(d, np.uint8)) for o, d in pieces]  # type: ignore[call-overload]
        span = got[-1][0] + got[-1][1].size
        for size in range(span, span + SLACK + 1):
            for at, layout, row in self.by_size.get(size, ()):
                rows = self.file[at:at + size].reshape(-1, row)
                group = np.asarray(layout.pack(rows[:layout.rows])).reshape(-1)
                lead = [d for d in range(size - span + 1)  # (the first piece's place in the tensor)
                        if d >= group.size or _equal(group[d:], got[0][1])]
                if not lead:
                    continue
                packed = np.asarray(layout.pack(rows)).reshape(-1)
                for d in lead:
                    if all(np.array_equal(packed[d + o:d + o + g.size], g) for o, g in got):
                        return [Repacked(at, size, layout.name, row, d + o) for o, _ in got]
        return None


def _equal(head: np.ndarray, piece: np.ndarray) -> bool:
    """Whether the piece starts with `head`'s bytes (as far as both go)."""
    n = min(head.size, piece.size)
    return bool(np.array_equal(head[:n], piece[:n]))


def repacked_bytes(rows: np.ndarray, layout: str, row_bytes: int) -> np.ndarray:
    """`layout`'s pack of `rows` (a file's bytes, row_bytes a row): what a CPU_REPACK buffer held
    for them. ValueError names what does not fit: a layout the engine has not, rows that are
    not whole blocks, a count of rows that is not whole groups."""
    found = next((x for x in LAYOUTS.values() if x.name == layout), None)
    if found is None:
        raise ValueError(f"there is no repacked layout {layout[:40]!r}")
    block = TYPE_TRAITS[found.type].type_size
    if row_bytes <= 0 or row_bytes % block or rows.size % (row_bytes * found.rows):
        raise ValueError(f"{rows.size:,} bytes in rows of {row_bytes:,} are not whole groups of "
                         f"{found.rows} rows of {block}-byte blocks ({found.name})")
    return np.asarray(found.pack(rows.reshape(-1, row_bytes)), np.uint8).reshape(-1)
