"""Header-only uploads: a GGUF file too large to send is inspected from its first bytes.

The browser sends the file's beginning (`HEAD_FIRST` bytes, more if the key-value pairs and
tensor infos run longer) and its size; the store keeps it as a sparse file of the full size, so
the reader parses it unchanged and every byte not sent reads as a hole. A side file
`<digest>.have` lists the byte ranges that were sent. A tensor's page that needs bytes not sent
asks the browser for exactly those (`add_bytes`), checked against the file's first bytes so they
come from the same file.

The digest names the metadata, not the whole file: sha256 over a tag, the file's size and every
byte up to the data section. Not part of ggml: this is the web app's storage.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from app.i18n import _
from app.store import HAVE_SUFFIX, PART_SUFFIX, SUFFIX, UploadStore
from engine.gguf import GGUFError, GGUFReader

HEAD_FIRST = 16 << 20  # bytes the browser sends first
HEAD_MAX = 256 << 20  # the most it sends before the tensor infos must have ended
PROBE = 4096  # the file's first bytes, sent with later bytes to show they are from this file


class NeedMore(Exception):
    """The metadata runs past the bytes sent: send `need` bytes from the start."""

    def __init__(self, need: int) -> None:
        self.need = need
        super().__init__(_("send the first {n} bytes").format(n=f"{need:,}"))


def _have_path(store: UploadStore, digest: str) -> Path:
    return store.root / f"{digest}{HAVE_SUFFIX}"


def have(store: UploadStore, digest: str) -> list[tuple[int, int]] | None:
    """The byte ranges a header-only file holds; None for a whole file."""
    p = _have_path(store, digest)
    if store.path(digest) is None or not p.is_file():
        return None
    return [tuple(r) for r in json.loads(p.read_text())]


def has_bytes(store: UploadStore, digest: str, start: int, end: int) -> bool:
    ranges = have(store, digest)
    return ranges is None or any(a <= start and end <= b for a, b in ranges)


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(ranges):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def store_head(store: UploadStore, head: bytes, size: int) -> str:
    """Keep a file's first bytes as a sparse file of `size` bytes; its digest.

    Raises NeedMore when the metadata does not end within `head`, GGUFError when the bytes sent
    break a rule, ValueError for a size that cannot be."""
    if not 0 < len(head) <= size or len(head) > HEAD_MAX:
        raise ValueError(_("{n} bytes sent of a file of {size} bytes").format(n=f"{len(head):,}", size=f"{size:,}"))
    fd, name = tempfile.mkstemp(dir=store.root, prefix="head-", suffix=PART_SUFFIX)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(head)
            f.truncate(size)  # the rest is a hole: no disk used
        try:
            reader = GGUFReader(tmp)
        except GGUFError as e:  # an error in bytes not sent is no error yet
            if e.offset >= len(head) or (e.offset < 0 and len(head) < size):
                if len(head) >= min(HEAD_MAX, size):
                    raise
                raise NeedMore(min(HEAD_MAX, size, 2 * len(head))) from None
            raise
        data_offset = reader.data_offset
        reader.close()
        if data_offset > len(head):
            if data_offset > HEAD_MAX:
                raise GGUFError("tensor infos", len(head), _("the metadata ends at byte {end}, past the {most} "
                                                            "bytes a header-only upload may send").format(
                    end=f"{data_offset:,}", most=f"{HEAD_MAX:,}"))
            raise NeedMore(data_offset)
        digest = hashlib.sha256(b"gguf-head\0" + str(size).encode() + b"\0" +
                                head[:data_offset]).hexdigest()
        if store.path(digest) is None:
            _have_path(store, digest).write_text(json.dumps([[0, len(head)]]))
            os.replace(tmp, store.root / f"{digest}{SUFFIX}")
        return digest
    finally:
        tmp.unlink(missing_ok=True)


def add_bytes(store: UploadStore, digest: str, probe: bytes,
              pieces: list[tuple[int, bytes]]) -> None:
    """Write bytes the browser sent for a header-only file, each piece at its start (ValueError
    if they do not belong: another file, outside it, or a whole file)."""
    path, ranges = store.path(digest), have(store, digest)
    if path is None or ranges is None:
        raise ValueError(_("this file was uploaded whole: it needs no bytes"))
    size = path.stat().st_size
    for start, data in pieces:
        if not 0 <= start <= start + len(data) <= size:
            raise ValueError(_("bytes {start} to {end} are outside the file ({size} bytes)").format(
                start=f"{start:,}", end=f"{start + len(data):,}", size=f"{size:,}"))
    with open(path, "r+b") as f:
        if len(probe) < min(PROBE, size) or f.read(len(probe)) != probe:
            raise ValueError(_("these bytes come from another file: its first bytes differ"))
        for start, data in pieces:
            f.seek(start)
            f.write(data)
    ranges += [(start, start + len(data)) for start, data in pieces]
    _have_path(store, digest).write_text(json.dumps(_merge(ranges)))
