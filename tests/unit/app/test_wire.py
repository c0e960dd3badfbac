"""The worker's output format: every trace a program can make crosses it unchanged, and anything
else a worker could write is refused as malformed data, before the server allocates by it and
without executing any of it."""

from __future__ import annotations

import dataclasses
import os
import pickle
import struct
from pathlib import Path

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from app.sandbox.boundary import Limits
from app.sandbox.wire import MAGIC, Head, MalformedResult, PatchRef, _frame, decode, encode_failure, encode_trace
from engine.core.notes import Note, tell
from engine.programs import PROGRAMS, trace_program
from engine.trace.steps import ContextMeta, ObjectAdded, Step, StepKind

BIG = Limits(trace=1 << 30, steps=100_000, pools=4 << 30)
MARKER = Path("/tmp/ggml-lens-wire-executed")
# the walkthroughs a learner's program could be (the model ones read files a program may not)
SMALL = [name for name, p in PROGRAMS.items() if not p.model and not p.reads]


@pytest.mark.parametrize("name", SMALL)
def test_every_walkthrough_crosses_the_format_unchanged(name):
    trace = trace_program(name)
    trace.printed = "printed ✓"
    back = decode(encode_trace(trace), BIG)
    assert back.hash == trace.hash
    assert repr(back.outputs) == repr(trace.outputs)  # (repr: NaN equals itself there)
    assert back.printed == trace.printed and back.error == trace.error
    assert [s.threads for s in back.steps] == [s.threads for s in trace.steps]
    assert [s.notes for s in back.steps] == [s.notes for s in trace.steps]
    k = len(trace.steps) - 1
    a, b = trace.state_at(k), back.state_at(k)
    assert {c: bytes(x.pool.data) for c, x in a.contexts.items()} == \
        {c: bytes(x.pool.data) for c, x in b.contexts.items()}


def test_outputs_are_numbers_strings_and_arrays_or_refused():
    trace = trace_program("simple-ctx")
    trace.outputs = {"m": [[1.5, 2.0], [3.0, 4.0]], "n": 3, "s": "x", "b": True, "z": None, "f": np.float32(0.5)}
    assert decode(encode_trace(trace), BIG).outputs == {"m": [[1.5, 2.0], [3.0, 4.0]], "n": 3, "s": "x",
                                                        "b": True, "z": None, "f": 0.5}
    trace.outputs = {"thing": object()}
    with pytest.raises(TypeError, match="'thing' is a object"):
        encode_trace(trace)


def test_a_pickle_that_would_run_code_is_refused_as_malformed():
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {MARKER}",))

    MARKER.unlink(missing_ok=True)
    body = pickle.dumps(Evil())
    for data in (body, b"T" + body, MAGIC + struct.pack("<I", len(body)) + body + bytes(8)):
        with pytest.raises(MalformedResult):
            decode(data, Limits())
    assert not MARKER.exists()


def _one_step(*refs: PatchRef, mem_size: int = 64, **step) -> tuple[Head, list[bytes]]:
    s = Step(0, StepKind.CALL, "x", 1, (), contexts=(ContextMeta(1, 4096, mem_size, None, False),), **step)
    return Head(ok=True, steps=[s], patches=[list(refs)]), [b"y" * r.size for r in refs]


@pytest.mark.parametrize("head_blobs, rule", [
    (_one_step(PatchRef(1, 60, 8)), "outside pool 1"),
    (_one_step(PatchRef(2, 0, 8)), "outside pool 2"),
    (_one_step(PatchRef(1, -1, 8)), "outside pool 1"),
    (_one_step(mem_size=1 << 40), "more than"),
    (_one_step(tensor=(1, 0)), "refers to bytes"),
    (_one_step(objects=(ObjectAdded(1, 0, 32, 1 << 30, "TENSOR", "t"),)), "refers to bytes"),
    ((Head(ok=True, steps=[], patches=[]), []), "1 to"),
])
def test_a_trace_that_points_outside_its_pools_is_refused(head_blobs, rule):
    head, blobs = head_blobs
    with pytest.raises(MalformedResult, match=rule):
        decode(_frame(head, blobs), Limits())


def test_sizes_are_checked_before_anything_is_allocated():
    with pytest.raises(MalformedResult, match="more than"):  # a head of 4 GB claimed
        decode(MAGIC + b"\xff" * 4 + b"\x00" * 16, Limits())
    head, blobs = _one_step(PatchRef(1, 0, 8))
    good = _frame(head, blobs)
    with pytest.raises(MalformedResult, match="says"):  # a data section of an exabyte claimed
        decode(good[:-16] + struct.pack("<Q", 1 << 60) + good[-8:], Limits())
    steps = [Step(k, StepKind.CALL, "x", 1, ()) for k in range(20)]
    with pytest.raises(MalformedResult, match="steps"):
        decode(_frame(Head(ok=True, steps=steps, patches=[[]] * 20), []), Limits(steps=10))


def _with_note(note) -> bytes:
    """A one-step result whose step's note is `note`, as a worker could write it (plain data, or
    msgpack bytes)."""
    raw = msgspec.msgpack.decode(msgspec.msgpack.encode(_one_step()[0]))
    raw["steps"][0]["notes"] = ["@note"]
    h = msgspec.msgpack.encode(raw)
    note = note if isinstance(note, bytes) else msgspec.msgpack.encode(note)
    h = h.replace(msgspec.msgpack.encode("@note"), note)
    return MAGIC + struct.pack("<I", len(h)) + h + struct.pack("<Q", 0)


def _nested(depth: int) -> bytes:
    """A note nested `depth` deep, as msgpack (spliced: msgspec would not encode it that deep)."""
    level = msgspec.msgpack.encode({"key": "gallocr_gets", "args": [["name", "x"], ["size", 1], ["where", "@"]]})
    head, tail = level.split(msgspec.msgpack.encode("@"))
    return head * depth + msgspec.msgpack.encode({"key": "verbatim", "args": [["text", "x"]]}) + tail * depth


@pytest.mark.parametrize("note, rule", [
    ({"key": "gallocr_gets", "args": [["name", "k; v"], ["size", 64], ["where", Note.verbatim("x")]]}, None),
    ({"key": "no_such_template", "args": []}, "one of engine/core/notes.py's templates"),
    ({"key": "wrote", "args": []}, r"fills \['n'\]"),
    ({"key": "wrote", "args": [["n", 1], ["m", 2]]}, r"fills \['n'\]"),
    ({"key": "wrote", "args": [["n", [1, 2]]]}, "Expected"),
    ({"key": "wrote", "args": [["n", {"a": 1}]]}, "Object missing required field `key`"),
    ({"key": "verbatim", "args": [["text", 3]]}, "value of type int"),
    (_nested(2), "nests a note that holds notes"),
    (_nested(5000), "not a result"),
])
def test_a_note_is_a_template_with_its_values_or_refused(note, rule):
    if rule is None:
        (step,) = decode(_with_note(note), Limits()).steps
        assert tell(step.notes) == "gallocr: 'k; v' gets 64 bytes at x"
        return
    with pytest.raises(MalformedResult, match=rule):
        decode(_with_note(note), Limits())


def test_a_failure_is_its_message():
    assert decode(encode_failure("the program ran out of memory"), Limits()) == "the program ran out of memory"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_any_damage_to_a_result_is_malformed_or_a_checked_trace(data):
    """Cut or flip the bytes of a real result anywhere: the server gets MalformedResult or a
    trace that passed every check, never another exception."""
    raw = bytearray(_RESULT)
    if data.draw(st.booleans()):
        raw = raw[:data.draw(st.integers(0, len(raw)))]
    else:
        for _ in range(data.draw(st.integers(1, 8))):
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    try:
        out = decode(bytes(raw), Limits())
    except MalformedResult:
        return
    assert isinstance(out, str) or out.steps
    for s in [] if isinstance(out, str) else out.steps:  # and every note it holds can be told
        tell(s.notes)
        for t in s.threads:
            tell(t.notes)


_RESULT = encode_trace(dataclasses.replace(trace_program("views-and-permute")))
