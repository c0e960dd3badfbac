"""Header-only uploads: a GGUF file too large to send is inspected from its first bytes.

The browser sends the file's beginning (`HEAD_FIRST` bytes, more if the key-value pairs and
tensor infos run longer) and its size; the store keeps it as a sparse file of the full size, so
the reader parses it unchanged and every byte not sent reads as a hole. A side file
`<digest>.have` lists the byte ranges that were sent. A tensor's page that needs bytes not sent
asks the browser for exactly those (`add_bytes`), checked against the file's first bytes so they
come from the same file.

What such a file may cost is capped before anything is written: the size it declares
(`SIZE_MAX`), the bytes one request sends (`SEND_MAX`), and the bytes and ranges it holds in all
(`HELD_MAX`, `RANGES_MAX`); the disk it uses counts in the store's limit and it is evicted like
any upload. It never passes for a whole file (`UploadStore.whole`): only the tensor page reads its
data, and only the bytes it holds (`missing`).

The digest names the metadata, not the whole file: sha256 over a tag, the file's size and every
byte up to the data section. Not part of ggml: this is the web app's storage.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import tempfile
from bisect import bisect_right
from pathlib import Path

from app.i18n import _
from app.store import HAVE_SUFFIX, PART_SUFFIX, SUFFIX, UploadStore
from engine.gguf import GGUFError, GGUFReader

HEAD_FIRST = 16 << 20  # bytes the browser sends first
HEAD_MAX = 256 << 20  # the most it sends before the tensor infos must have ended
PROBE = 4096  # the file's first bytes, sent with later bytes to show they are from this file
SIZE_MAX = 1 << 40  # the largest file one may declare (a 405B model in F16 is 0.8 TB)
SEND_MAX = 16 << 20  # bytes one request sends for a page (a tensor page reads ~1 MB and a row)
HELD_MAX = 512 << 20  # bytes a header-only file holds in all: its head and what pages asked for
RANGES_MAX = 1 << 16  # separate byte ranges it holds (its side file lists them)


class NeedMore(Exception):
    """The metadata runs past the bytes sent: send `need` bytes from the start."""

    def __init__(self, need: int) -> None:
        self.need = need
        super().__init__(_("send the first {n} bytes").format(n=f"{need:,}"))


class OverLimit(ValueError):
    """Bytes refused because a header-only file would pass one of its caps (HTTP 413)."""


def _have_path(store: UploadStore, digest: str) -> Path:
    return store.root / f"{digest}{HAVE_SUFFIX}"


def have(store: UploadStore, digest: str) -> list[tuple[int, int]] | None:
    """The byte ranges [start, end) a header-only file holds, sorted and merged; None for a
    whole file."""
    if store.whole(digest):
        return None
    try:
        return [(a, b) for a, b in json.loads(_have_path(store, digest).read_text())]
    except FileNotFoundError:  # evicted meanwhile: it holds nothing
        return []


def missing(store: UploadStore, digest: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The spans of `spans` that the file stored under `digest` does not hold whole (none for a
    whole file): what a page must not read, since a hole reads as zeros."""
    ranges = have(store, digest)
    if ranges is None:
        return []
    starts = [a for a, _b in ranges]
    out = []
    for start, n in spans:
        k = bisect_right(starts, start) - 1  # the last range starting at or before `start`
        if n > 0 and not (k >= 0 and start + n <= ranges[k][1]):
            out.append((start, n))
    return out


def _merge(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[0] < r[1]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _write_have(store: UploadStore, digest: str, ranges: list[tuple[int, int]]) -> None:
    """Replace the side file at once (a page reading it never sees half of it)."""
    fd, name = tempfile.mkstemp(dir=store.root, prefix="have-", suffix=PART_SUFFIX)
    with os.fdopen(fd, "w") as f:
        json.dump(ranges, f)
    os.replace(name, _have_path(store, digest))


def check_size(size: int) -> None:
    """ValueError unless a header-only upload may declare a file of `size` bytes."""
    if not 0 < size <= SIZE_MAX:
        raise ValueError(_("a header-only upload declares a file of 1 to {most} bytes, not {size}").format(
            most=f"{SIZE_MAX:,}", size=f"{size:,}"))


def store_head(store: UploadStore, head: bytes, size: int) -> str:
    """Keep a file's first bytes as a sparse file of `size` bytes; its digest.

    Raises NeedMore when the metadata does not end within `head`, GGUFError when the bytes sent
    break a rule, ValueError for a size that cannot be or is past SIZE_MAX (checked first)."""
    check_size(size)
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
            final = store.root / f"{digest}{SUFFIX}"
            _write_have(store, digest, [(0, len(head))])  # first: the file is never taken for whole
            os.replace(tmp, final)
            store.evict(keep=final)
        else:
            store.touch(digest)
        return digest
    finally:
        tmp.unlink(missing_ok=True)


def _grown(size: int, ranges: list[tuple[int, int]], spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges a header-only file of `size` bytes holds once `spans` are added: ValueError for
    a span outside it, OverLimit past SEND_MAX bytes at once or HELD_MAX bytes or RANGES_MAX
    ranges in all."""
    for start, n in spans:
        if not 0 <= start <= start + n <= size:
            raise ValueError(_("bytes {start} to {end} are outside the file ({size} bytes)").format(
                start=f"{start:,}", end=f"{start + n:,}", size=f"{size:,}"))
    sent = sum(n for _start, n in spans)
    if sent > SEND_MAX:
        raise OverLimit(_("{n} bytes asked to be sent at once; one request sends at most {most}").format(
            n=f"{sent:,}", most=f"{SEND_MAX:,}"))
    grown = _merge(ranges + [(start, start + n) for start, n in spans])
    held = sum(b - a for a, b in grown)
    if held > HELD_MAX or len(grown) > RANGES_MAX:
        raise OverLimit(_("a header-only file holds at most {most} bytes in {ranges} ranges; with these it would "
                          "hold {held} in {k}. Upload the whole file, or open it from a models folder "
                          "(ggml-lens serve --models DIR).").format(
            most=f"{HELD_MAX:,}", ranges=f"{RANGES_MAX:,}", held=f"{held:,}", k=f"{len(grown):,}"))
    return grown


def check_bytes(store: UploadStore, digest: str, spans: list[tuple[int, int]]) -> None:
    """Refuse `spans` for the file `digest` as `add_bytes` would (ValueError, OverLimit), before
    a byte of the request's body is read (add_bytes checks again, under the file's lock)."""
    path, ranges = store.path(digest), have(store, digest)
    if path is None or ranges is None:
        raise ValueError(_("this file was uploaded whole: it needs no bytes"))
    _grown(path.stat().st_size, ranges, spans)


def add_bytes(store: UploadStore, digest: str, probe: bytes,
              pieces: list[tuple[int, bytes]]) -> None:
    """Write bytes the browser sent for a header-only file, each piece at its start (ValueError
    if they do not belong: another file, outside it, or a whole file; OverLimit past a cap), then
    let the store evict. One writer at a time per file, in any process (a lock on the file)."""
    path = store.path(digest)
    if path is None or store.whole(digest):
        raise ValueError(_("this file was uploaded whole: it needs no bytes"))
    with open(path, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)  # (released when f closes)
        ranges = have(store, digest)  # read under the lock: another request may have added some
        if not ranges:  # (its head is always held)
            raise ValueError(_("this file was evicted meanwhile: upload it again"))
        size = os.fstat(f.fileno()).st_size
        grown = _grown(size, ranges, [(start, len(data)) for start, data in pieces])
        if len(probe) < min(PROBE, size) or f.read(len(probe)) != probe:
            raise ValueError(_("these bytes come from another file: its first bytes differ"))
        for start, data in pieces:
            f.seek(start)
            f.write(data)
        _write_have(store, digest, grown)
    store.evict(keep=path)
