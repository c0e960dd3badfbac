"""Traces that cross the wire format and the shared trace files refer to a mapped model's pages
instead of carrying them: a patch that is a trusted file's pages travels as (digest, offset,
size), and comes back as a read-only view of the server's own mapping of that file. A reference
the server cannot resolve, or that reaches outside its file, is refused before anything is read
or allocated by it; no path a worker wrote is ever opened."""

from __future__ import annotations

import hashlib
import os
import tracemalloc
from pathlib import Path

import pytest

from app.sandbox.boundary import Limits
from app.sandbox.run import run_program
from app.sandbox.wire import MAX_REPACKED, Head, MalformedResult, PatchRef, UnknownFile, _frame, decode, encode_trace
from app.store import UploadStore, file_identity
from app.tracefiles import TraceFiles, TrustedFiles
from engine.core.notes import Note
from engine.core.types import GGMLType
from engine.programs import PROGRAMS, trace_program
from engine.trace import record
from engine.trace.pools import file_pages
from engine.trace.steps import BufferMeta, Step, StepKind
from tests.conformance.test_models import write_tiny_llama
from tests.support.vocab import vocab_files

BIG = Limits(trace=1 << 31, steps=100_000, pools=4 << 30)
DIGEST = "ab" * 32


def pools_at(trace, k: int) -> dict[int, str]:
    """The sha1 of every pool and buffer of the state after step k."""
    state = trace.state_at(k)
    return {cid: hashlib.sha1(x.pool).hexdigest() for cid, x in {**state.contexts, **state.buffers}.items()}


def sampled(trace, n: int = 6) -> list[int]:
    """n steps spread over the trace, the first weights-loading steps among them."""
    last = len(trace.steps) - 1
    loads = [s.index for s in trace.steps if any(len(p.data) > 1 << 20 for p in s.patches)]
    return sorted({*loads[:2], *(last * i // (n - 1) for i in range(n))})


def file_patches(trace, held: bool) -> list:
    """The patches that are a file's pages: a model file's (held False) or a mirror's (True)."""
    return [p for s in trace.steps for p in s.patches
            if (src := file_pages(p.data)) is not None and src[0].held == held]


@pytest.fixture(scope="module")
def gemma_trace(gemma_path):
    trace = trace_program("gemma3", path=str(gemma_path))
    assert trace.error is None, trace.error
    return trace


def test_a_mapped_models_trace_crosses_the_wire_as_a_reference_to_its_file(gemma_path, gemma_trace):
    """The gemma3 walkthrough on the bundled model: its 246 MB of weights are one patch of the
    file's pages; with the file named, the result is a few MB, and the decoded trace's states
    are the original's byte for byte, its weights a view of the server's mapping of the file."""
    (weights,) = file_patches(gemma_trace, held=False)
    copied = encode_trace(gemma_trace)
    referred = encode_trace(gemma_trace, {str(gemma_path): DIGEST})
    assert len(copied) > len(weights.data) > 200 << 20
    assert len(referred) < len(copied) - len(weights.data) + 4096
    assert len(referred) < len(weights.data) // 10
    asked: list[str] = []

    def files(digest: str) -> Path | None:
        asked.append(digest)
        return gemma_path if digest == DIGEST else None

    back = decode(referred, BIG, files)
    assert asked == [DIGEST]  # (once: one mapping for every patch of the file)
    assert back.hash == gemma_trace.hash
    (view,) = file_patches(back, held=False)
    pages, at = file_pages(view.data)
    assert pages.path == str(gemma_path) and view.data.readonly
    assert at == file_pages(weights.data)[1] and (view.ctx, view.offset) == (weights.ctx, weights.offset)
    assert back.recorded_bytes == gemma_trace.recorded_bytes  # (the file's pages are not held)
    for k in sampled(gemma_trace):
        assert pools_at(back, k) == pools_at(gemma_trace, k), k


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q4_0, vocab=next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf"))
    return path


def model_trace(path: Path, no_repack: bool):
    prog = PROGRAMS["model"].load()
    trace = record(prog.run, prog.__file__, "model", 1, also=PROGRAMS["model"].also_files,
                   path=str(path), prompt="Hello", then=(5,), no_repack=no_repack)
    assert trace.error is None, trace.error
    return trace


@pytest.mark.parametrize("named", [True, False], ids=["named", "unnamed"])
@pytest.mark.parametrize("no_repack", [True, False], ids=["mapped", "repacked"])
def test_repacked_weights_cross_as_the_repack_of_the_files_tensors(tiny_llama, no_repack, named):
    """A tiny llama (Q4_0) through the `model` walkthrough: its mapped weights cross as a
    reference to the file; its repacked weights (a nameless mirror no server could open) as a
    reference to the file's tensor and the layout that packs it, which the decoder packs again
    with the engine's own pack into a mirror of its own, so its states map them as the
    recorder's do. With the file unnamed, every byte crosses, into the decoder's mirror too."""
    trace = model_trace(tiny_llama, no_repack)
    (weights,) = file_patches(trace, held=False)
    mirrored = file_patches(trace, held=True)
    assert bool(mirrored) == (not no_repack)
    data = encode_trace(trace, {str(tiny_llama): DIGEST} if named else None)
    everything = encode_trace(trace)
    saved = len(weights.data) + sum(len(p.data) for p in mirrored)
    assert len(data) < len(everything) - saved + 4096 if named else len(data) == len(everything)
    back = decode(data, BIG, {DIGEST: tiny_llama}.get)
    assert back.hash == trace.hash
    assert [(p.ctx, p.offset, bytes(p.data)) for p in file_patches(back, held=True)] == \
        [(p.ctx, p.offset, bytes(p.data)) for p in mirrored]
    # the pools that are a file's pages are mapped, not replayed (an unnamed file's are copies)
    assert back._index().mirrors.keys() == {cid for cid, m in trace._index().mirrors.items() if named or m.pages.held}
    for k in sampled(trace):
        assert pools_at(back, k) == pools_at(trace, k), k


def test_a_sandboxed_program_refers_to_the_bundled_model_it_was_given(gemma_path):
    """The playground's copy of the gemma3 walkthrough, run behind the kernel boundary: the
    worker sees the model bound under /data, names it by the digest the server gave it, and the
    server's decoded trace views its own file's pages."""
    source = Path(PROGRAMS["gemma3"].source_file).read_text(encoding="utf-8")
    trace = run_program(source, 1, Limits(), model=gemma_path)
    assert trace.error is None, trace.error
    (weights,) = file_patches(trace, held=False)
    assert file_pages(weights.data)[0].path == str(gemma_path) and len(weights.data) > 200 << 20


# --- hostile references -------------------------------------------------------------------------

SIZE = 1 << 16  # the one buffer of the forged traces


def forged(*refs: PatchRef, blobs: list[bytes] = ()) -> bytes:
    step = Step(0, StepKind.CALL, "x", 1, (Note.of("nothing", fn="x"),),
                buffers=(BufferMeta(1, 0x1000, SIZE, "CPU_Mapped", 1, True),))
    return _frame(Head(ok=True, program="forged", source="x = 1\n", steps=[step], patches=[list(refs)]),
                  list(blobs))


@pytest.fixture()
def small_file(tmp_path) -> Path:
    path = tmp_path / "model.gguf"
    path.write_bytes(bytes(range(256)) * 64)  # 16 KiB
    return path


HOSTILE = {  # what the worker wrote -> the rule the refusal names
    "an unknown digest": (PatchRef(1, 0, 16, "cd" * 32, 0), "does not hold"),
    "bytes past the file's end": (PatchRef(1, 0, 64, DIGEST, (16 << 10) - 32), "lies outside file"),
    "a range starting past the end": (PatchRef(1, 0, 16, DIGEST, 1 << 40), "lies outside file"),
    "a negative offset in the file": (PatchRef(1, 0, 16, DIGEST, -16), "lies outside file"),
    "a negative size": (PatchRef(1, 0, -16, DIGEST, 0), "outside pool 1"),
    "a huge size": (PatchRef(1, 0, 1 << 62, DIGEST, 0), "outside pool 1"),
    "a size past the pool": (PatchRef(1, SIZE - 8, 16, DIGEST, 0), "outside pool 1"),
    "a path": (PatchRef(1, 0, 16, "/etc/passwd", 0), "not by a sha256 digest"),
    "a relative path": (PatchRef(1, 0, 16, "../../../etc/shadow", 0), "not by a sha256 digest"),
    "a digest in capitals": (PatchRef(1, 0, 16, DIGEST.upper(), 0), "not by a sha256 digest"),
    "a name too long": (PatchRef(1, 0, 16, "a" * 65, 0), "the head is not a result"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_reference_is_refused_naming_the_rule_before_anything_is_allocated(name, small_file):
    ref, rule = HOSTILE[name]
    asked: list[str] = []

    def files(digest: str) -> Path | None:
        asked.append(digest)
        return small_file if digest == DIGEST else None

    data = forged(ref)
    tracemalloc.start()
    try:
        with pytest.raises(MalformedResult, match=rule):
            decode(data, Limits(), files)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak  # (nothing sized by the worker's numbers)
    assert set(asked) <= {ref.file} and all(a == DIGEST or a == "cd" * 32 for a in asked)


def test_a_hostile_repack_reference_is_refused_naming_the_rule(tiny_llama):
    """The references a worker could forge to the repack of a tensor: a layout the engine has
    not, rows that are not whole blocks or groups, a piece outside its tensor, a tensor outside
    its pool or its file; and a trace that asks to pack more than its pools hold."""
    row = 2 * 18  # two Q4_0 blocks
    good = dict(file=DIGEST, at=4096, mirror=True, layout="q4_0_8x8", row=row, whole=8 * row, skip=0)
    cases = {
        "no such layout": (dict(layout="q9_9x9"), "no repacked layout"),
        "rows not whole blocks": (dict(row=row - 1, whole=8 * (row - 1)), "not whole groups"),
        "rows not whole groups": (dict(whole=7 * row), "not whole groups"),
        "a negative skip": (dict(skip=-1), "outside the tensor"),
        "a piece past the tensor": (dict(skip=8 * row - 8), "outside the tensor"),
        "a tensor past the pool": (dict(whole=SIZE * 2), "outside pool 1"),
        "a tensor past the cap": (dict(whole=MAX_REPACKED + 8 * row), "larger than"),
        "a tensor past the file": (dict(at=tiny_llama.stat().st_size - row), "lies outside file"),
    }
    files = {DIGEST: tiny_llama}.get
    back = decode(forged(PatchRef(1, 0, 16, **good)), Limits(), files)  # (the forms refused below, well made)
    assert len(back.steps[0].patches[0].data) == 16
    for name, (change, rule) in cases.items():
        with pytest.raises(MalformedResult, match=rule):
            decode(forged(PatchRef(1, 0, 16, **(good | change))), Limits(), files)
    # (tensors of 4,608 bytes, two in turn: 64 packs, more than the pools' 65,536 bytes)
    many = [PatchRef(1, 0, 16, **(good | dict(at=4096 + 18 * (i % 2), whole=128 * row))) for i in range(64)]
    with pytest.raises(MalformedResult, match=f"more than {SIZE:,} bytes packed"):
        decode(forged(*many), Limits(pools=SIZE), files)


def test_a_reference_is_refused_where_the_server_trusts_no_file():
    """A decoder given no files (a caller that expects every byte) resolves no reference."""
    with pytest.raises(UnknownFile, match="does not hold"):
        decode(forged(PatchRef(1, 0, 16, DIGEST, 0)), Limits())


def test_referred_bytes_do_not_count_in_the_data_section(small_file):
    """A reference's size is the file's, not the data section's: bytes sent beside it are refused."""
    with pytest.raises(MalformedResult, match="do not add up"):
        decode(forged(PatchRef(1, 0, 16, DIGEST, 0), blobs=[b"x" * 16]), Limits(), {DIGEST: small_file}.get)
    back = decode(forged(PatchRef(1, 0, 16, DIGEST, 32), PatchRef(1, 64, 4), blobs=[b"wxyz"]), Limits(),
                  {DIGEST: small_file}.get)
    first, second = back.steps[0].patches
    assert bytes(first.data) == small_file.read_bytes()[32:48] and first.data.readonly
    assert bytes(second.data) == b"wxyz"


# --- the shared trace files ---------------------------------------------------------------------

def test_a_trace_file_refers_to_a_models_folder_file_and_is_recorded_again_once_it_changed(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    path = models / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q4_0, vocab=next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf"))
    prog = PROGRAMS["model"].load()
    trace = record(prog.run, prog.__file__, "model", 1, also=PROGRAMS["model"].also_files,
                   path=str(path), prompt="Hello")
    assert trace.error is None, trace.error
    (weights,) = file_patches(trace, held=False)
    repacked = sum(len(p.data) for p in file_patches(trace, held=True))
    assert repacked > 1 << 20
    uploads = UploadStore(tmp_path / "uploads", 1 << 30, 1 << 30, models_dir=models)
    files = TraceFiles(tmp_path / "traces", 1 << 30, files=TrustedFiles(uploads))
    digest = "ef" * 32
    files.put(digest, trace)
    written = (tmp_path / "traces" / f"{digest}.trace").stat().st_size
    assert written < len(encode_trace(trace)) - len(weights.data) - repacked + 4096
    back = TraceFiles(tmp_path / "traces", 1 << 30, files=TrustedFiles(uploads)).get(digest)
    assert back is not None and back.hash == trace.hash
    assert file_pages(file_patches(back, held=False)[0].data)[0].path == str(path.resolve())
    for k in sampled(trace):
        assert pools_at(back, k) == pools_at(trace, k), k
    st = path.stat()  # the file changed (its modification time): its identity with it
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert files.get(digest) is None and not files.has(digest)


def test_the_trusted_files_name_uploads_fixtures_models_and_the_bundled_model(tmp_path, gemma_path):
    models, fixtures = tmp_path / "models", tmp_path / "fixtures"
    models.mkdir()
    fixtures.mkdir()
    (models / "m.gguf").write_bytes(b"GGUF model")
    (fixtures / "f.gguf").write_bytes(b"GGUF fixture")
    (tmp_path / "elsewhere.gguf").write_bytes(b"GGUF elsewhere")
    uploads = UploadStore(tmp_path / "uploads", 1 << 30, 1 << 30, fixtures_dir=fixtures, models_dir=models)
    sha = hashlib.sha256(b"GGUF upload").hexdigest()
    (tmp_path / "uploads" / f"{sha}.gguf").write_bytes(b"GGUF upload")
    trusted = TrustedFiles(uploads, gemma_path)
    expected = {tmp_path / "uploads" / f"{sha}.gguf": sha,
                fixtures / "f.gguf": hashlib.sha256(b"GGUF fixture").hexdigest(),
                models / "m.gguf": file_identity(models / "m.gguf"),
                gemma_path: hashlib.sha256(gemma_path.read_bytes()).hexdigest()}
    for path, digest in expected.items():
        assert trusted.digest_of(str(path)) == digest, path
        assert trusted.path(digest).resolve() == path.resolve(), path
    assert trusted.digest_of(str(tmp_path / "elsewhere.gguf")) is None
    assert trusted.path("00" * 32) is None and trusted.path("../elsewhere") is None


def test_a_trace_file_of_another_version_of_the_format_is_recorded_again(tmp_path):
    """A file version 1 wrote (every byte inline) is not refused as an error: it is absent."""
    files = TraceFiles(tmp_path, 1 << 30)
    digest = "12" * 32
    (tmp_path / f"{digest}.trace").write_bytes(b"GGML-LENS-RESULT/1\n" + b"\0" * 12)
    assert files.get(digest) is None and not files.has(digest)
