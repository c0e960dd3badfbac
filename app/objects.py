"""The object store a classroom's processes share (`ggml-lens serve --store URL`): uploads,
programs and recorded traces by content hash, for web processes and workers on several machines.

Not part of ggml: this is the web app's storage. Each process keeps its own directory under the
data directory as the working copy (files are memory-mapped and read from there) and mirrors it
here: a file written is put here, a file missing is fetched from here (at most `limit` bytes,
checked from the object's size before a byte is read). Without --store the data directory itself
is what the processes share (a shared filesystem works).

The client is obstore: `s3://bucket/prefix` (configured by the AWS_* variables, e.g.
AWS_ENDPOINT_URL for an S3-compatible server), `gs://`, `az://`, `file:///` or `memory://`.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import obstore
from obstore.store import from_url

CHUNK = 8 << 20  # bytes read from the store at a time


class TooLarge(Exception):
    """A shared object is larger than the caller allows."""


class SharedStore:
    def __init__(self, url: str) -> None:
        self.url = url
        self._store = from_url(url)

    def put_file(self, name: str, path: Path) -> None:
        with open(path, "rb") as f:
            obstore.put(self._store, name, f)

    def put_bytes(self, name: str, data: bytes) -> None:
        obstore.put(self._store, name, data)

    def size(self, name: str) -> int | None:
        """The object's size in bytes, or None if there is none."""
        try:
            return int(obstore.head(self._store, name)["size"])
        except FileNotFoundError:
            return None

    def fetch(self, name: str, dest: Path, limit: int) -> bool:
        """Copy the object to `dest` (atomically: a reader never sees half a file); False if
        there is none, TooLarge if it holds more than `limit` bytes."""
        size = self.size(name)
        if size is None:
            return False
        if size > limit:
            raise TooLarge(f"the shared object {name} holds {size:,} bytes, more than {limit:,}")
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix="fetch-", suffix=".part")
        try:
            with os.fdopen(fd, "wb") as f:
                got = 0
                for chunk in obstore.get(self._store, name).stream(min_chunk_size=CHUNK):
                    got += len(chunk)
                    if got > limit:  # (it grew since its head was read)
                        raise TooLarge(f"the shared object {name} holds more than {limit:,} bytes")
                    f.write(chunk)
            os.replace(tmp, dest)
        except FileNotFoundError:  # deleted meanwhile
            return False
        finally:
            Path(tmp).unlink(missing_ok=True)
        return True
