"""What a worker sends back: plain data in a documented format, read by the server with a hard
limit on every count and size before it builds anything. Never a pickle: the worker may have run
any code, so its output is an attacker's bytes.

The format (all integers little-endian):

    MAGIC                        b"GGML-LENS-RESULT/2\\n"
    u32 head_size                at most HEAD_LIMIT
    head                         msgpack: a Head (below), decoded by msgspec into typed records
    u64 data_size                the sum of the sizes of the PatchRefs that name no file
    data                         those patches' bytes, in the order of Head.patches

A Head says whether the run gave a trace (`ok`) or why not (`message`), and holds the trace: the
steps as the engine's own records (engine/trace/steps.py), their patches' places (`patches[k]` for
step k: the context or buffer id, the offset in it, the number of bytes), and the program's
outputs as numbers, strings and arrays (dtype, shape, bytes). Decoding checks the types of every
field, and that each note names one of the engine's templates and fills exactly its placeholders
(`Note.__post_init__`); then `trace_from_head` checks the trace's shape: step indices in order,
every patch and tensor reference inside a pool the steps made, the pools' total size under
Limits.pools. The trace's records are counted as they are decoded: at most DECODED_PER_BYTE bytes
of Python objects per byte of the head (`Trace.records_bytes`, which the server's caches weigh).

A patch whose bytes are a model file's pages (weights loaded mapped, as llama.cpp loads them) is
not sent: its PatchRef names the file by its digest (`file`, the server's own name for it: the
upload store's sha256, a models-folder file's identity) and where in it the bytes lie (`at`),
never by a path (a worker may see the file elsewhere: the sandbox binds the bundled model under
/data). The encoder names only the files its `names` knows (path -> digest); the decoder asks its
`files` (digest -> path) for the file, and only a file the server trusts is ever opened: a digest
it does not know is UnknownFile, bytes outside the file MalformedResult. The decoded patch is a
read-only view of the server's mapping of that file (engine/trace/pools.py's `mapped_file`), so
a decoded trace of a mapped model holds no copy of its weights either. A weights buffer's
mirror (CPU_REPACK's repacked weights: a nameless file no server could open) is marked `mirror`;
where its patches of a step are, byte for byte, the repack of one tensor of a named file (the
encoder packs the tensor again to check: engine/trace/repacked.py), they refer to that tensor
(`at`, `whole`, the layout's name, the row size, and where they start in the packed bytes,
`skip`), and the decoder packs it again with the engine's own pack, after checking that every
range lies inside the file, the tensor and its pool, and that the decoder packs no more than
Limits.pools bytes in all; else their bytes are sent. Either way the decoder keeps them in a
mirror of its own (`Mirror`), on disk as the worker did, and the patches view its pages.
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec
import numpy as np

from app.sandbox.boundary import Limits
from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.compute.shares import share_ranges
from engine.gguf import GGUFError
from engine.trace.pools import Mirror, file_pages, mapped_file, shared_pages
from engine.trace.repacked import RepackedSources, repacked_bytes
from engine.trace.steps import Patch, Step, ThreadShare
from engine.trace import Trace

FORMAT = b"GGML-LENS-RESULT/"  # the magic of every version
MAGIC = FORMAT + b"2\n"
HEAD_LIMIT = 8 << 20  # bytes of the head (a 5,000-step trace's is ~3 MB)
# bytes of Python objects one byte of a head may decode to, at most: a negative fixint in a list is
# one byte and an int (32) with its pointer (8); an interval [0, 0] in a thread's ranges three
# bytes and its record (56) with a pointer; a patch's place ~20 bytes and its Patch, bytes and
# index entry
DECODED_PER_BYTE = 48
OUTPUT_DTYPES = ("float64", "float32", "int64", "int32", "bool")
MAX_OUTPUT_ELEMENTS = 1 << 20
# counts msgspec checks as it reads each container's header, before it makes the container
MAX_STEPS, MAX_PATCHES, MAX_OUTPUTS, MAX_ITEMS = 100_000, 1 << 16, 64, 1 << 16
MAX_FILES, MAX_FILE_TEXT = 64, 1 << 20  # a walkthrough's other files, and the text of each
MAX_REPACKED = 1 << 30  # bytes of one tensor a decoder packs (an MoE layer's experts: ~0.5 GB)
MAX_LAYOUT = 32  # characters of a repacked layout's name ("q4_K_8x8")
MAX_NAME = 64  # characters of a file's name in a PatchRef (a sha256 digest, in hex)
DIGEST_RE = re.compile(r"[0-9a-f]{64}")  # how a PatchRef names a file (app.store.HASH_RE's form)

Names = Callable[[str], str | None]  # the encoder's: a mapped file's path -> its digest, or None
Files = Callable[[str], Path | None]  # the decoder's: a digest -> the trusted file, or None


class MalformedResult(Exception):
    """The worker's output is not a result this server can read (names the broken rule)."""


class UnknownFile(MalformedResult):
    """A patch refers to a file this server does not hold (by a digest it does not know)."""


class Scalar(msgspec.Struct, tag="scalar", frozen=True):
    value: int | float | str | bool | None


class Array(msgspec.Struct, tag="array", frozen=True):
    dtype: str
    shape: tuple[int, ...]
    data: bytes


Plain = int | float | str | bool | None


class Items(msgspec.Struct, tag="items", frozen=True):
    """A list (or tuple) of numbers and strings, or of tuples of them (a model's top tokens)."""
    values: Annotated[list[Plain | tuple[Plain, ...]], msgspec.Meta(max_length=MAX_ITEMS)]
    is_tuple: bool = False


Output = Scalar | Array | Items


class PatchRef(msgspec.Struct, frozen=True, omit_defaults=True):
    ctx: int  # the context's or buffer's id
    offset: int  # where in it
    size: int  # how many bytes (of the data section, or of the file)
    # the file the bytes are the pages of, by its digest ("": they are in the data section)
    file: Annotated[str, msgspec.Meta(max_length=MAX_NAME)] = ""
    at: int = 0  # where in that file
    mirror: bool = False  # a weights buffer's mirror's (repacked weights): kept in a mirror
    # the bytes are [skip, skip + size) of the file's `whole` bytes from `at`, in rows of `row`
    # bytes, packed in this layout (engine/trace/repacked.py); "": the file's bytes themselves
    layout: Annotated[str, msgspec.Meta(max_length=MAX_LAYOUT)] = ""
    row: int = 0
    whole: int = 0
    skip: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class Head:
    ok: bool
    message: str = ""  # why there is no trace (ok False)
    program: str = ""
    source: str = ""
    n_threads: int = 1
    error: str | None = None
    printed: str = ""
    # a walkthrough's other files (Trace.also): (path, text)
    also: Annotated[list[tuple[str, str]], msgspec.Meta(max_length=MAX_FILES)] = \
        dataclasses.field(default_factory=list)
    outputs: Annotated[dict[str, Output], msgspec.Meta(max_length=MAX_OUTPUTS)] = \
        dataclasses.field(default_factory=dict)
    steps: Annotated[list[Step], msgspec.Meta(max_length=MAX_STEPS)] = \
        dataclasses.field(default_factory=list)  # their patches empty
    patches: Annotated[list[Annotated[list[PatchRef], msgspec.Meta(max_length=MAX_PATCHES)]],
                       msgspec.Meta(max_length=MAX_STEPS)] = dataclasses.field(default_factory=list)  # per step


_HEAD = msgspec.msgpack.Decoder(Head)


# --- the worker's side ------------------------------------------------------------------------

def encode_failure(message: str) -> bytes:
    return _frame(Head(ok=False, message=message), [])


def encode_trace(trace: Trace, names: Names | Mapping[str, str] | None = None) -> bytes:
    """The trace as a result (TypeError names an output that is not a number, string or array).
    A patch that is the pages of a file `names` knows (path -> digest), or the repack of one of
    its tensors, is sent as a reference to that file; every other patch's bytes are sent."""
    head = _head(trace, _Sources(trace, names))
    return _frame(head, [p.data for s, refs in zip(trace.steps, head.patches)
                         for p, ref in zip(s.patches, refs) if not ref.file])


def _head(trace: Trace, sources: "_Sources") -> Head:
    refs = [sources.refs(s.patches) for s in trace.steps]
    return Head(ok=True, program=trace.program, source=trace.source, n_threads=trace.n_threads,
                error=trace.error, printed=trace.printed, also=[(name, text) for name, text in trace.also],
                outputs={str(k): _output(k, v) for k, v in trace.outputs.items()},
                steps=[dataclasses.replace(s, patches=()) for s in trace.steps], patches=refs)


class _Sources:
    """The files a trace's patches may refer to: the mapped files `names` knows, and the tensors
    of those that CPU_REPACK repacks (a weights buffer's mirror holds their packed rows)."""

    def __init__(self, trace: Trace, names: Names | Mapping[str, str] | None) -> None:
        self.names = names.get if isinstance(names, Mapping) else names
        self.repacks: list[tuple[str, RepackedSources]] = []  # (digest, the file's tensors)
        files = {id(src[0]): src[0] for s in trace.steps for p in s.patches if (src := file_pages(p.data))}
        if self.names is None or not any(f.held for f in files.values()):
            return
        for f in files.values():
            digest = None if f.held else self.names(f.path)
            try:
                if digest is not None:
                    self.repacks.append((digest, RepackedSources(f.path, shared_pages(f, 0, len(f)))))
            except (GGUFError, OSError):  # (a file, but no GGUF file: no tensor of it is repacked)
                pass

    def refs(self, patches: tuple[Patch, ...]) -> list[PatchRef]:
        """Where a step's patches' bytes go: a reference to the file whose pages they are, if
        `names` names it; to the tensor of such a file whose repack they are (a mirror's patches
        of one step: the runs one set_tensor changed); else into the data section (marked if they
        are a mirror's pages)."""
        out = [self.ref(p) for p in patches]
        mirrored = [i for i, r in enumerate(out) if r.mirror]
        for ctx in {out[i].ctx for i in mirrored}:
            at = [i for i in mirrored if out[i].ctx == ctx]
            for name, tensors in self.repacks:
                found = tensors.find([(patches[i].offset, patches[i].data) for i in at])
                if found is not None:
                    for i, f in zip(at, found):
                        out[i] = PatchRef(ctx, out[i].offset, out[i].size, name, f.at, True, f.layout,
                                          f.row_bytes, f.whole, f.skip)
                    break
        return out

    def ref(self, p: Patch) -> PatchRef:
        """One patch's place: a reference to the file whose pages it is, if `names` names it."""
        src = file_pages(p.data)
        if src is None:
            return PatchRef(p.ctx, p.offset, len(p.data))
        pages, at = src
        digest = self.names(pages.path) if self.names is not None and not pages.held else None
        if digest is None:
            return PatchRef(p.ctx, p.offset, len(p.data), mirror=pages.held)
        return PatchRef(p.ctx, p.offset, len(p.data), digest, at)


class _Bound(_Sources):
    """Every file's pages a reference, and every mirror's a repack (the most a head holds)."""

    def __init__(self) -> None:
        self.names, self.repacks = None, []

    def refs(self, patches: tuple[Patch, ...]) -> list[PatchRef]:
        return [PatchRef(p.ctx, p.offset, len(p.data)) if (src := file_pages(p.data)) is None else
                PatchRef(p.ctx, p.offset, len(p.data), "0" * MAX_NAME, 1 << 40, src[0].held,
                         "x" * MAX_LAYOUT, 1 << 20, 1 << 32, 1 << 32) for p in patches]


def records_bound(trace: Trace) -> int:
    """An upper bound of the memory a trace's records take besides its patches' bytes (what
    Trace.records_bytes holds): DECODED_PER_BYTE times the size of the head it would cross the
    wire in, with every file's pages a reference. (A trace decoded here was counted from the
    head it came in.)"""
    try:
        head = _head(trace, _Bound())
    except TypeError:  # an output the format does not take: the rest is counted
        head = _head(dataclasses.replace(trace, outputs={}), _Bound())
    return DECODED_PER_BYTE * len(msgspec.msgpack.encode(head))


def _output(name: Any, v: Any) -> Output:
    if v is None or isinstance(v, (bool, int, float, str)):
        return Scalar(v)
    if isinstance(v, (np.generic,)):
        return Scalar(v.item())
    try:
        a = np.asarray(v)
    except ValueError:
        a = None
    if a is not None and a.dtype.name in OUTPUT_DTYPES:
        return Array(a.dtype.name, tuple(a.shape), a.tobytes())
    if isinstance(v, (list, tuple)) and all(_is_plain(x) or isinstance(x, tuple) and all(map(_is_plain, x)) for x in v):
        return Items(list(v), isinstance(v, tuple))
    raise TypeError(f"the output {name!r} is a {type(v).__name__}: a program's outputs are tensors, "
                    f"arrays, numbers, strings and lists of them")


def _is_plain(x: Any) -> bool:
    return x is None or isinstance(x, (bool, int, float, str))


def _frame(head: Head, blobs: list[bytes]) -> bytes:
    h = msgspec.msgpack.encode(head)
    size = sum(len(b) for b in blobs)
    return b"".join([MAGIC, struct.pack("<I", len(h)), h, struct.pack("<Q", size), *blobs])


# --- the server's side ------------------------------------------------------------------------

def decode(data: bytes, limits: Limits, files: Files | None = None) -> Trace | str:
    """The trace the worker sent, or the message it sent instead of one; MalformedResult for
    anything else, before anything sized by the worker is allocated. `files` finds the trusted
    file a patch refers to by its digest (None: no patch may refer to one)."""
    if not data.startswith(MAGIC):
        raise MalformedResult("the worker's output does not start with the result format's magic")
    at = len(MAGIC)
    if len(data) < at + 4:
        raise MalformedResult("the worker's output ends inside the head's size")
    (head_size,) = struct.unpack_from("<I", data, at)
    at += 4
    if head_size > HEAD_LIMIT:
        raise MalformedResult(f"the head is {head_size:,} bytes, more than {HEAD_LIMIT:,}")
    if len(data) < at + head_size + 8:
        raise MalformedResult("the worker's output ends inside the head")
    try:
        head = _HEAD.decode(memoryview(data)[at:at + head_size])
    except (msgspec.DecodeError, RecursionError, ValueError) as e:
        raise MalformedResult(f"the head is not a result: {e}") from None
    at += head_size
    (data_size,) = struct.unpack_from("<Q", data, at)
    at += 8
    if data_size != len(data) - at:
        raise MalformedResult(f"the data section says {data_size:,} bytes and holds {len(data) - at:,}")
    if not head.ok:
        return head.message[:4096] or "the worker gave no reason"
    trace = trace_from_head(head, memoryview(data)[at:], limits, files)
    trace.records_bytes = DECODED_PER_BYTE * head_size  # (what its steps and outputs hold, at most)
    return trace


def trace_from_head(head: Head, data: memoryview, limits: Limits, files: Files | None = None) -> Trace:
    """The Trace the head and data describe, once every count, size and reference is checked
    (`files`: as decode's)."""
    def bad(rule: str, k: int | None = None):
        where = f"step {k}: " if k is not None else ""
        return MalformedResult(where + rule)

    if len(head.steps) != len(head.patches):
        raise bad(f"{len(head.steps)} steps but {len(head.patches)} lists of patches")
    if not 0 < len(head.steps) <= limits.steps + 2:
        raise bad(f"a trace has 1 to {limits.steps + 2:,} steps, not {len(head.steps):,}")
    if len(head.printed) > 4 * limits.output or not 1 <= head.n_threads <= 64:
        raise bad("the printed text or the thread count is out of range")
    if any(len(name) > 200 or len(text) > MAX_FILE_TEXT for name, text in head.also):
        raise bad(f"a source file's name or text is too long (at most 200 and {MAX_FILE_TEXT:,} characters)")
    if sum(p.size for refs in head.patches for p in refs if not p.file) != len(data):
        raise bad("the patches' sizes do not add up to the data section")
    opened = _Opened(files)
    sizes: dict[int, int] = {}  # every pool and buffer the steps made: id -> size
    steps, at = [], 0
    for k, (s, refs) in enumerate(zip(head.steps, head.patches)):
        if s.index != k or (s.parent is not None and not 0 <= s.parent < k):
            raise bad("its index or parent is out of order", k)
        if not 0 <= s.file <= len(head.also):
            raise bad(f"its line is in file {s.file}; the trace has {len(head.also) + 1}", k)
        for pid, size in [(c.id, c.mem_size) for c in s.contexts] + [(b.id, b.size) for b in s.buffers]:
            if size < 0 or sizes.setdefault(pid, size) != size:
                raise bad(f"pool {pid} changes its size or has a negative one", k)
        if sum(sizes.values()) > limits.pools:
            raise bad(f"its pools hold more than {limits.pools:,} bytes together", k)
        patches = []
        for p in refs:
            if p.ctx not in sizes or p.size <= 0 or p.offset < 0 or p.offset + p.size > sizes[p.ctx]:
                raise bad(f"a patch of {p.size:,} bytes at {p.offset:,} lies outside pool {p.ctx}", k)
            got: Any  # bytes, or a read-only view of a file's pages (read as bytes)
            if p.file and p.layout:  # (the repack of the file's rows)
                packed = opened.repacked(p, k, sizes[p.ctx], limits.pools)
                mirror = opened.mirror(p.ctx, sizes[p.ctx]) if p.mirror else None
                got = mirror.put(p.offset, packed) if mirror is not None else None
                got = got if got is not None else packed.tobytes()
            elif p.file:
                got = opened.pages(p, k)
            else:
                piece = data[at:at + p.size]
                at += p.size
                mirror = opened.mirror(p.ctx, sizes[p.ctx]) if p.mirror else None
                got = mirror.put(p.offset, np.frombuffer(piece, np.uint8)) if mirror is not None else None
                got = got if got is not None else bytes(piece)
            patches.append(Patch(p.ctx, p.offset, got))
        for ctx, offs, size in _references(s):
            if ctx not in sizes or offs < 0 or offs + size > sizes[ctx]:
                raise bad(f"it refers to bytes {offs:,}..{offs + size:,} of pool {ctx}, outside it", k)
        if s.threads:
            try:
                s = dataclasses.replace(s, threads=_shares(s.threads))
            except ValueError as e:
                raise bad(str(e), k) from None
        steps.append(dataclasses.replace(s, patches=tuple(patches)) if patches else s)
    trace = Trace(head.program[:200], head.source, head.n_threads, steps,
                  {k[:200]: _value(k, v) for k, v in head.outputs.items()}, head.error, head.printed,
                  tuple(head.also))
    return trace


class _Opened:
    """The trusted files a decoded trace's patches refer to, each mapped once (a pool whose
    patches are all one file's pages is that file, mapped, in the rebuilt states), and the
    mirrors the decoder keeps repacked weights in, one per buffer."""

    def __init__(self, files: Files | None) -> None:
        self.files = files
        self.maps: dict[str, Any] = {}  # digest -> the file's read-only mapping (pools._FileMap)
        self.mirrors: dict[int, Mirror] | None = {}  # pool id -> its mirror (None: none can be made)
        self.packed: tuple[tuple, np.ndarray] | None = None  # the tensor packed last, by its place
        self.packed_bytes = 0  # the bytes packed so far (each tensor once, in an honest trace)

    def repacked(self, p: PatchRef, k: int, pool: int, limit: int) -> np.ndarray:
        """p's bytes: [skip, skip + size) of the repack of the file's tensor it names, once the
        ranges (in the tensor, the tensor in its pool of `pool` bytes and in its file) and the
        layout are checked and the tensor packed (the last one is kept: a step's patches are
        pieces of one tensor); MalformedResult past `limit` bytes packed in all."""
        key = (p.file, p.at, p.whole, p.layout, p.row)
        if p.whole > MAX_REPACKED:
            raise MalformedResult(f"step {k}: a repacked patch's tensor of {p.whole:,} bytes is larger than "
                                  f"{MAX_REPACKED:,}")
        if p.skip < 0 or p.skip + p.size > p.whole or p.offset - p.skip + p.whole > pool or p.offset < p.skip:
            raise MalformedResult(f"step {k}: a repacked patch of {p.size:,} bytes at {p.skip:,} of its "
                                  f"tensor's {p.whole:,} lies outside the tensor or the tensor outside pool {p.ctx}")
        if self.packed is None or self.packed[0] != key:
            self.packed_bytes += p.whole
            if self.packed_bytes > limit:
                raise MalformedResult(f"step {k}: the repacked patches ask for more than {limit:,} bytes packed")
            rows = self.pages(msgspec.structs.replace(p, size=p.whole), k)
            try:
                self.packed = (key, repacked_bytes(np.frombuffer(rows, np.uint8), p.layout, p.row))
            except ValueError as e:
                raise MalformedResult(f"step {k}: a repacked patch's tensor does not fit its layout: {e}") \
                    from None
        return self.packed[1][p.skip:p.skip + p.size]

    def pages(self, p: PatchRef, k: int) -> memoryview:
        """p's bytes as a read-only view of the file it names, once the name and the range are
        checked: UnknownFile for a digest the server does not know, MalformedResult for a name
        that is not a digest or a range outside the file."""
        if not DIGEST_RE.fullmatch(p.file):
            raise MalformedResult(f"step {k}: a patch names its file {p.file[:MAX_NAME]!r}, not by a "
                                  f"sha256 digest")
        pages = self.maps.get(p.file)
        if pages is None:
            path = self.files(p.file) if self.files is not None else None
            if path is None:
                raise UnknownFile(f"step {k}: a patch refers to file {p.file}, which this server does not hold")
            try:
                pages = self.maps[p.file] = mapped_file(str(path))
            except (OSError, ValueError) as e:
                raise UnknownFile(f"step {k}: a patch refers to file {p.file}, which cannot be read here: "
                                  f"{e}") from None
        if p.at < 0 or p.at + p.size > len(pages):
            raise MalformedResult(f"step {k}: a patch of {p.size:,} bytes at {p.at:,} lies outside file "
                                  f"{p.file} ({len(pages):,} bytes)")
        return memoryview(pages)[p.at:p.at + p.size]

    def mirror(self, ctx: int, size: int) -> Mirror | None:
        """Pool ctx's mirror, or None where no file can be had (the patches are copies then)."""
        if self.mirrors is None:
            return None
        m = self.mirrors.get(ctx)
        if m is None:
            try:
                m = self.mirrors[ctx] = Mirror(size)
            except OSError:
                self.mirrors = None
        return m


def _shares(threads: tuple[ThreadShare, ...]) -> tuple[ThreadShare, ...]:
    """The threads' shares with their ranges as the records of their kinds (they cross the wire
    as plain arrays); ValueError names a range that does not fit its kind."""
    return tuple(dataclasses.replace(t, ranges=share_ranges(t.kind, t.ranges)) for t in threads)


def _references(s: Step):
    """(pool, offset, size) of every place in a pool the step names."""
    if s.tensor is not None:
        yield (*s.tensor, GGML_TENSOR_SIZE)
    for o in s.objects:
        yield o.ctx, o.header, GGML_OBJECT_SIZE
        yield o.ctx, o.offs, o.size
    for f in s.fields:
        yield f.ctx, f.struct, GGML_TENSOR_SIZE
    for p in s.placements:
        yield (*p.tensor, GGML_TENSOR_SIZE)
    if s.decision is not None:
        yield (*s.decision.tensor, GGML_TENSOR_SIZE)
        if s.decision.parent is not None:
            yield (*s.decision.parent, GGML_TENSOR_SIZE)
    if s.split is not None:
        for t in s.split.inputs:
            yield (*t, GGML_TENSOR_SIZE)


def _value(name: str, v: Output) -> Any:
    if isinstance(v, Scalar):
        return v.value
    if isinstance(v, Items):
        return tuple(v.values) if v.is_tuple else v.values
    if v.dtype not in OUTPUT_DTYPES or len(v.shape) > 8 or any(n < 0 for n in v.shape):
        raise MalformedResult(f"the output {name!r} has a dtype or shape no output has")
    n = math.prod(v.shape)
    if n > MAX_OUTPUT_ELEMENTS or n * np.dtype(v.dtype).itemsize != len(v.data):
        raise MalformedResult(f"the output {name!r}'s {len(v.data):,} bytes are not {v.shape} {v.dtype} "
                              f"of at most {MAX_OUTPUT_ELEMENTS:,} elements")
    return np.frombuffer(v.data, v.dtype).reshape(v.shape).tolist()
