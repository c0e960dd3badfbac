"""Recorded traces as files, named by the digest of their recipe (app/traces.py), for every
process of a deployment: a worker writes a trace once, any web process reads it.

Not part of ggml: this is the web app's storage. A file holds a trace in the sandbox's result
format (app/sandbox/wire.py) and is decoded by the reader with every count and size capped: a
file here is no more trusted than a worker's output. The files live in the data directory's
traces/ (shared by the processes of one machine, or by a shared filesystem) and, with --store,
in the shared object store too (app/objects.py); past `limit` bytes the least recently read go
first (app/store.py's evict_oldest, as uploads do).

A trace of a model loaded mapped does not hold the model's weights: its patches that are the
pages of a file the server trusts (`TrustedFiles`: an upload, a fixture, a models-folder file,
the bundled model) are written as references to that file by its digest, and read back as views
of its pages; a trace whose file is gone (an upload evicted, a models-folder file changed) is as
good as absent, and is recorded again, as is one written in another version of the format.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from app.objects import SharedStore
from app.sandbox.boundary import Limits
from app.sandbox.wire import FORMAT, MAGIC, MalformedResult, UnknownFile, decode, encode_trace
from app.store import HASH_RE, PART_SUFFIX, UploadStore, content_digest, evict_oldest
from engine.trace import Trace

SUFFIX = ".trace"
# a trace read back: its steps and bytes bounded before anything it sizes is allocated (a gemma3
# walkthrough's is ~3,000 steps and 14 MB, its pools ~0.6 GB; an 8B model walkthrough's ~10,000
# steps and 67 MB, its pools ~9 GB: the file's pages and their repack, mapped, not allocated)
READ_LIMITS = Limits(steps=99_000, trace=2 << 30, pools=64 << 30)


class TrustedFiles:
    """The files a stored trace may refer to, by the digests the app names them by: the upload
    store's (uploads and fixtures by their sha256, models-folder files by their identity) and
    the bundled model (by its sha256, hashed once per process: a trace a worker wrote on
    another machine finds that machine's copy of it; a models-folder file's identity holds on
    one machine, or where every machine has the folder at the same place, as the links do)."""

    def __init__(self, uploads: UploadStore | None = None, model: Path | None = None) -> None:
        self.uploads, self.model = uploads, model

    def digest_of(self, path: str) -> str | None:
        """The digest of the file at `path`, or None if it is none of these (its bytes are
        written then)."""
        model = self.model
        if model is not None and model.is_file() and Path(path).resolve() == model.resolve():
            return content_digest(model)
        return self.uploads.digest_of(path) if self.uploads is not None else None

    def path(self, digest: str) -> Path | None:
        """The whole file named `digest`, or None."""
        model = self.model
        if model is not None and model.is_file() and content_digest(model) == digest:
            return model
        found = self.uploads.path(digest) if self.uploads is not None else None
        return found if found is not None and self.uploads is not None and self.uploads.whole(digest) else None


class TraceFiles:
    def __init__(self, root: Path, limit: int, shared: SharedStore | None = None,
                 files: TrustedFiles | None = None) -> None:
        self.root, self.limit, self.shared = root, limit, shared
        self.files = files  # what a trace's patches may refer to (None: every byte is written)
        root.mkdir(parents=True, exist_ok=True)

    def _path(self, digest: str) -> Path:
        if not HASH_RE.fullmatch(digest):
            raise ValueError(f"not a trace digest: {digest!r}")
        return self.root / f"{digest}{SUFFIX}"

    def put(self, digest: str, trace: Trace) -> None:
        """Write the trace (to a temporary file, then renamed), share it, then evict."""
        path = self._path(digest)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix="trace-", suffix=PART_SUFFIX)
        with os.fdopen(fd, "wb") as f:
            f.write(encode_trace(trace, self.files.digest_of if self.files is not None else None))
        os.replace(tmp, path)
        if self.shared is not None:
            self.shared.put_file(f"traces/{digest}{SUFFIX}", path)
        self.evict(keep=path)

    def has(self, digest: str) -> bool:
        path = self._path(digest)
        return path.is_file() or (self.shared is not None and self.shared.size(f"traces/{path.name}") is not None)

    def get(self, digest: str) -> Trace | None:
        """The trace written under `digest`, or None (also when a file it refers to is gone);
        MalformedResult if the file is not one."""
        path = self._path(digest)
        if not path.is_file() and (self.shared is None or
                                   not self.shared.fetch(f"traces/{path.name}", path, READ_LIMITS.trace)):
            return None
        if path.stat().st_size > READ_LIMITS.trace:
            raise MalformedResult(f"the trace file {path.name} is larger than {READ_LIMITS.trace:,} bytes")
        os.utime(path)  # read: kept longer
        data = path.read_bytes()
        try:
            if data.startswith(FORMAT) and not data.startswith(MAGIC):
                raise UnknownFile(f"the trace file {path.name} is in another version of the format")
            trace = decode(data, READ_LIMITS, self.files.path if self.files is not None else None)
        except UnknownFile:  # (its model is gone, or an older version wrote it: recorded again)
            path.unlink(missing_ok=True)
            return None
        if isinstance(trace, str):
            raise MalformedResult(f"the trace file {path.name} holds no trace")
        return trace

    def evict(self, keep: Path | None = None) -> None:
        """Delete the least recently used files until the rest fit `limit`."""
        evict_oldest(self.root, SUFFIX, self.limit, keep)
