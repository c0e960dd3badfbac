"""The classroom's shared files (app/tracefiles.py, app/objects.py): a trace written by one
process is read by another, through the data directory or the object store, unchanged; a file
that is not a trace, or is larger than allowed, is refused before anything it sizes is read; the
uploads and programs of one process reach another through the object store."""

from __future__ import annotations

import os

import pytest

from app import tracefiles
from app.jobs import RecordingLost
from app.objects import SharedStore, TooLarge
from app.playground import ProgramStore
from app.routes.playground import STARTER
from app.sandbox.boundary import Limits
from app.sandbox.wire import MAGIC, MalformedResult
from app.settings import Settings
from app.store import UploadStore
from app.tracefiles import TraceFiles
from app.traces import Recipe, TraceCache
from engine.programs import FIXTURES_DIR, PROGRAMS, trace_program


@pytest.fixture
def shared():
    return SharedStore("memory://")  # (one store object: what two machines would reach over the network)


@pytest.mark.parametrize("name", ["gguf-load", "minilm", "tiny-llama"])
def test_a_trace_written_by_one_process_is_read_unchanged_by_another_through_the_store(tmp_path, shared, name):
    prog = PROGRAMS[name]
    trace = trace_program(name, **({"path": str(FIXTURES_DIR / prog.reads)} if prog.reads else {}))
    TraceFiles(tmp_path / "a", 1 << 30, shared).put("ab" * 32, trace)
    b = TraceFiles(tmp_path / "b", 1 << 30, shared)
    assert b.has("ab" * 32) and not b.has("cd" * 32)
    back = b.get("ab" * 32)
    assert back.hash == trace.hash and repr(back.outputs) == repr(trace.outputs)
    k = len(trace.steps) - 1
    assert {c: bytes(x.pool.data) for c, x in trace.state_at(k).contexts.items()} == \
        {c: bytes(x.pool.data) for c, x in back.state_at(k).contexts.items()}


def test_a_file_that_is_not_a_trace_or_too_large_is_refused_before_it_is_read(tmp_path, monkeypatch):
    files = TraceFiles(tmp_path, 1 << 30)
    (tmp_path / f"{'ee' * 32}.trace").write_bytes(b"\x80\x04pickle, not a trace")
    with pytest.raises(MalformedResult, match="magic"):
        files.get("ee" * 32)
    files.put("ff" * 32, trace_program("simple-ctx"))
    monkeypatch.setattr(tracefiles, "READ_LIMITS", Limits(trace=100, steps=100_000, pools=1 << 30))
    with pytest.raises(MalformedResult, match="larger than 100 bytes"):
        files.get("ff" * 32)
    with pytest.raises(ValueError, match="not a trace digest"):
        files.get("../../etc/passwd")


def test_a_refused_trace_file_is_a_readable_error_not_a_crash(tmp_path):
    files = TraceFiles(tmp_path, 1 << 30)
    cache = TraceCache(4, files=files)
    recipe = Recipe("simple-ctx", 1)
    (tmp_path / f"{recipe.digest}.trace").write_bytes(MAGIC + b"\xff\xff\xff\xff")
    with pytest.raises(RecordingLost, match="refused: the head is 4,294,967,295 bytes"):
        cache.shared(recipe)


def test_the_trace_files_keep_the_most_recently_used_within_their_limit(tmp_path):
    trace = trace_program("simple-add")
    files = TraceFiles(tmp_path, 1 << 30)
    for i in range(3):
        files.put(f"{i:064x}", trace)
        os.utime(tmp_path / f"{i:064x}.trace", (1000 + i, 1000 + i))  # written long ago, in order
    size = (tmp_path / f"{0:064x}.trace").stat().st_size
    files.get(f"{0:064x}")  # read: the most recently used now
    files.limit = 2 * size
    files.put(f"{3:064x}", trace)
    assert sorted(p.stem[-1] for p in tmp_path.glob("*.trace")) == ["0", "3"]


def test_uploads_and_programs_reach_another_process_through_the_store(tmp_path, shared):
    gguf = (FIXTURES_DIR / "minilm-q8_0.gguf").read_bytes()
    a = UploadStore(tmp_path / "a", 1 << 30, 1 << 31, shared=shared)
    pending = a.begin()
    pending.write(gguf)
    digest = pending.finish()
    pending.commit()
    b = UploadStore(tmp_path / "b", 1 << 30, 1 << 31, shared=shared)
    assert b.path(digest).read_bytes() == gguf
    assert b.open(digest).get("general.architecture") == "bert"
    assert UploadStore(tmp_path / "c", 1000, 1 << 31, shared=shared).path(digest) is None  # over its limit

    pa = ProgramStore(tmp_path / "pa", shared=shared)
    h = pa.save(STARTER)
    assert ProgramStore(tmp_path / "pb", shared=shared).load(h) == STARTER
    shared.put_bytes(f"programs/{'00' * 32}.py", b"print('not the text of its hash')")
    assert ProgramStore(tmp_path / "pc", shared=shared).load("00" * 32) is None


def test_an_object_larger_than_allowed_is_not_fetched(tmp_path, shared):
    shared.put_bytes("big", b"x" * 5000)
    with pytest.raises(TooLarge, match="5,000 bytes, more than 4,096"):
        shared.fetch("big", tmp_path / "big", 4096)
    assert not (tmp_path / "big").exists() and not list(tmp_path.iterdir())
    assert shared.fetch("missing", tmp_path / "m", 4096) is False


def test_a_classroom_is_configured_from_the_environment():
    s = Settings.from_env({"GGML_LENS_QUEUE": "redis://q:6379/0", "GGML_LENS_STORE": "s3://b/p",
                           "GGML_LENS_RUNS_PER_CLIENT": "40", "GGML_LENS_RUN_QUEUE": "100",
                           "GGML_LENS_TRACES_LIMIT": "1000"})
    assert (s.queue, s.store, s.runs_per_client, s.run_queue, s.traces_limit) == \
        ("redis://q:6379/0", "s3://b/p", 40, 100, 1000)
    assert s.shares_traces and not Settings.from_env({}).shares_traces
    assert Settings.from_env({"GGML_LENS_SHARE_TRACES": "1"}).shares_traces
