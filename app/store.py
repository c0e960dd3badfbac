"""Uploaded GGUF files kept by content hash, in a directory every uvicorn worker shares.

Not part of ggml: this is the web app's storage. An upload streams to a temporary file while it
is hashed (sha256) and counted; past `upload_limit` bytes it is refused on the spot and the
partial file deleted. A file the reader accepts becomes `<sha256>.gguf`; when the directory holds
more than `store_limit` bytes the oldest files go first. The shared fixtures are served under
their hash too (hashed once per process, on first use). A hash from a URL must match `HASH_RE`
before it comes near the file system. Parsed files are kept in a small per-process LRU cache.

A models folder (`ggml-lens serve --models DIR`) is served in place: its GGUF files are memory-
mapped where they are, never copied or hashed whole (a 40 GB file would take a minute); each is
named by the sha256 of its resolved path, size and modification time, so its links change when
the file does. Only regular files whose resolved path lies inside DIR are ever opened.

With a shared object store (`--store`, app/objects.py) an upload is put there too, and a file
another process took is fetched from there on first use. (A header-only upload, app/heads.py,
stays with the process that took it.)

A header-only upload holds only a few of its bytes: it counts the disk it uses and is evicted like
any other file, and `whole()` is false for it, so every route that reads tensor data refuses it
(`HeaderOnly`) rather than read its holes as zeros.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from cachetools import LRUCache, cachedmethod

from app.i18n import N_, _
from app.objects import SharedStore, TooLarge
from app.settings import Settings
from engine.gguf import GGUFReader

HASH_RE = re.compile(r"[0-9a-f]{64}")  # a lowercase sha256 digest, nothing else
SUFFIX = ".gguf"
PART_SUFFIX = ".part"
HAVE_SUFFIX = ".have"  # beside a header-only file: the byte ranges it holds (app/heads.py)
STALE_PART_SECONDS = 3600  # a temporary file this old belongs to an upload that died
READER_CACHE = 8  # parsed files kept per process
MAX_MODELS = 1000  # files listed from a models folder


class HeaderOnly(ValueError):
    """A route that reads a file's tensor data was given a header-only upload (app/heads.py)."""

    def __init__(self, upload_limit: int) -> None:
        super().__init__(_("Only the first bytes of this file were sent (a header-only upload), so its tensor data "
                           "is not here: upload the whole file (at most {limit} bytes) or open it from a models "
                           "folder (ggml-lens serve --models DIR).").format(limit=f"{upload_limit:,}"))


class UploadTooLarge(Exception):
    """The upload passed the size limit while it was streaming in."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(_("the upload is larger than the limit of {n} bytes").format(n=f"{limit:,}"))


@dataclass(frozen=True, slots=True)
class Fixture:
    """A GGUF file shipped with the project, served like an upload."""

    name: str  # file name, e.g. "minilm-q8_0.gguf"
    path: Path
    size: int  # bytes
    digest: str  # sha256, hex


class PendingUpload:
    """An upload being written: a temporary file in the store, hashed as the bytes arrive."""

    def __init__(self, store: UploadStore) -> None:
        self.store = store
        fd, name = tempfile.mkstemp(dir=store.root, prefix="upload-", suffix=PART_SUFFIX)
        self.path = Path(name)
        self._file = os.fdopen(fd, "wb")
        self._hash = hashlib.sha256()
        self.size = 0  # bytes received so far
        self.digest: str | None = None

    def write(self, chunk: bytes) -> None:
        """Append a chunk; past the upload limit, delete the partial file and refuse."""
        self.size += len(chunk)
        if self.size > self.store.upload_limit:
            self.abort()
            raise UploadTooLarge(self.store.upload_limit)
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> str:
        """Close the file; its sha256 digest."""
        self._file.close()
        self.digest = self._hash.hexdigest()
        return self.digest

    def commit(self) -> Path:
        """Keep the file under its hash (atomically: readers never see half a file)."""
        assert self.digest is not None, "finish() first"
        final = self.store.root / f"{self.digest}{SUFFIX}"
        os.replace(self.path, final)
        os.utime(final)  # a re-upload counts as new for eviction
        if self.store.shared is not None:
            self.store.shared.put_file(f"uploads/{final.name}", final)
        self.store.evict(keep=final)
        return final

    def abort(self) -> None:
        """Drop the temporary file."""
        if not self._file.closed:
            self._file.close()
        self.path.unlink(missing_ok=True)


class UploadStore:
    """Content-addressed GGUF files: uploads under `root`, plus the project's fixtures."""

    def __init__(self, root: Path, upload_limit: int, store_limit: int,
                 fixtures_dir: Path | None = None, models_dir: Path | None = None,
                 shared: SharedStore | None = None) -> None:
        self.root = root
        self.shared = shared
        self.models_dir = models_dir.resolve() if models_dir is not None else None
        self.upload_limit = upload_limit
        self.store_limit = store_limit
        self.fixtures_dir = fixtures_dir
        self.root.mkdir(parents=True, exist_ok=True)
        self._readers: LRUCache = LRUCache(READER_CACHE)  # a dropped file's mapping closes when unused
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings, shared: SharedStore | None = None) -> UploadStore:
        return cls(settings.uploads, settings.upload_limit, settings.store_limit,
                   settings.fixtures_dir, settings.models_dir, shared)

    # --- writing ----------------------------------------------------------------------------

    def begin(self) -> PendingUpload:
        return PendingUpload(self)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Delete the oldest files until the store fits `store_limit`; also stale temp files."""
        gone = evict_oldest(self.root, SUFFIX, self.store_limit, keep)
        for p in gone:
            p.with_suffix(HAVE_SUFFIX).unlink(missing_ok=True)
        return gone

    # --- finding ----------------------------------------------------------------------------

    def fixtures(self) -> list[Fixture]:
        """The shipped GGUF files that are present, by name (hashed lazily, once)."""
        if self.fixtures_dir is None or not self.fixtures_dir.is_dir():
            return []
        return [_fixture(p) for p in sorted(self.fixtures_dir.glob(f"*{SUFFIX}")) if p.is_file()]

    def models(self) -> list[Fixture]:
        """The GGUF files of the models folder (in subfolders too), by path; each named by its
        identity (resolved path, size, mtime), not its content."""
        root = self.models_dir
        if root is None or not root.is_dir():
            return []
        out = []
        for p in sorted(root.rglob(f"*{SUFFIX}")):
            real = p.resolve()
            if real.is_relative_to(root) and real.is_file():  # no symlink leads outside
                out.append(Fixture(str(p.relative_to(root)), real, real.stat().st_size, file_identity(real)))
                if len(out) >= MAX_MODELS:
                    break
        return out

    def path(self, digest: str) -> Path | None:
        """The file stored under `digest`, or None (also for anything that is not a hash)."""
        if not HASH_RE.fullmatch(digest):
            return None
        for f in self.fixtures() + self.models():
            if f.digest == digest:
                return f.path
        p = self.root / f"{digest}{SUFFIX}"
        if p.is_file():
            return p
        try:
            if self.shared is not None and self.shared.fetch(f"uploads/{p.name}", p, self.upload_limit):
                self.evict(keep=p)
                return p
        except TooLarge:  # another process took it under a larger limit: not for this one
            return None
        return None

    def digest_of(self, path: str | os.PathLike) -> str | None:
        """The digest `path()` finds the file at `path` under (a fixture, a models-folder file or
        an upload), or None for a file this store does not hold."""
        real = Path(path).resolve()
        found = next((f.digest for f in self.fixtures() + self.models() if f.path.resolve() == real), None)
        if found is None and real.parent == self.root.resolve() and real.suffix == SUFFIX \
                and HASH_RE.fullmatch(real.stem) and real.is_file():
            return real.stem
        return found

    def whole(self, digest: str) -> bool:
        """Whether the file stored under `digest` holds all its bytes: False for a header-only
        upload, whose side file lists the few it holds (written before the file is kept, deleted
        after it is evicted). What every route that reads tensor data asks first."""
        return not (HASH_RE.fullmatch(digest) and (self.root / f"{digest}{HAVE_SUFFIX}").is_file())

    def touch(self, digest: str) -> None:
        """Count an upload as new again (it was uploaded again), so eviction keeps it longer."""
        if HASH_RE.fullmatch(digest):
            try:
                os.utime(self.root / f"{digest}{SUFFIX}")
            except FileNotFoundError:  # a fixture, or evicted meanwhile
                pass

    def fixture_name(self, digest: str) -> str | None:
        """The name of a shipped file or a models-folder file (None for an upload)."""
        return next((f.name for f in self.fixtures() + self.models() if f.digest == digest), None)

    def origin(self, digest: str) -> str:
        """Where a file comes from, in words: "fixture NAME", "models folder: NAME", "upload" or
        "header-only upload"."""
        for kind, files in ((N_("fixture {name}"), self.fixtures), (N_("models folder: {name}"), self.models)):
            name = next((f.name for f in files() if f.digest == digest), None)
            if name is not None:
                return _(kind).format(name=name)
        return _("upload") if self.whole(digest) else \
            _("header-only upload (tensor bytes are sent when a page needs them)")

    def open(self, digest: str) -> GGUFReader | None:
        """The parsed file for `digest` (cached), or None if there is no such file.

        Raises GGUFError only if a stored file no longer parses (it was valid when stored).
        """
        path = self.path(digest)
        if path is None:
            return None
        return self._parsed(path, path.stat().st_mtime_ns)

    @cachedmethod(lambda self: self._readers, lock=lambda self: self._lock)
    def _parsed(self, path: Path, mtime_ns: int) -> GGUFReader:
        """The file parsed, kept by path and modification time (parsed outside the lock)."""
        return GGUFReader(path)


def evict_oldest(root: Path, suffix: str, limit: int, keep: Path | None = None) -> list[Path]:
    """Delete the least recently used `<sha256><suffix>` files of root (but `keep`) until the
    rest hold at most `limit` bytes, and the temporary files a writer that died left behind;
    the files deleted. A sparse file (a header-only upload) counts the disk it uses."""
    files, now = [], time.time()
    for p in root.iterdir():
        try:
            st = p.stat()
        except FileNotFoundError:  # another process deleted it meanwhile
            continue
        if p.name.endswith(PART_SUFFIX):
            if now - st.st_mtime > STALE_PART_SECONDS:
                p.unlink(missing_ok=True)
        elif p.suffix == suffix and HASH_RE.fullmatch(p.stem):
            files.append((st.st_mtime, min(st.st_size, st.st_blocks * 512), p))
    total = sum(size for _, size, _ in files)
    gone = []
    for _mtime, size, p in sorted(files):
        if total <= limit:
            break
        if p != keep:
            p.unlink(missing_ok=True)
            total -= size
            gone.append(p)
    return gone


def file_identity(path: Path) -> str:
    """A models-folder file's name: the sha256 of its resolved path, size and modification time
    (it changes when the file does; the file is never read whole)."""
    real = path.resolve()
    st = real.stat()
    return hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()


_fixture_hashes: dict[tuple[str, int, int], str] = {}
_fixture_lock = threading.Lock()


def content_digest(path: Path) -> str:
    """The sha256 of the file's bytes (a fixture's name, the bundled model's in trace files),
    hashed once per process while its path, size and modification time stay the same."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _fixture_lock:
        digest = _fixture_hashes.get(key)
        if digest is None:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            digest = _fixture_hashes[key] = h.hexdigest()
    return digest


def _fixture(path: Path) -> Fixture:
    return Fixture(path.name, path, path.stat().st_size, content_digest(path))

