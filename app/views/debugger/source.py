"""The source panel: the program with the step's line marked, the call and what it changed."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _, note
from engine.core.notes import Note
from engine.trace.steps import MANY_OBJECTS, ObjectAdded
from engine.trace import FieldWrite, Step, StepKind, Trace


def call_text(step: Step) -> str:
    """The step's call as the learner reads it: the program's text, or for a scheduler's pass
    (no line of the program: its call is the pass's title) the title in the request's language."""
    if step.kind == StepKind.PASS and step.notes:
        title = dict(step.notes[0].args).get("title")
        if isinstance(title, Note):
            return _("pass {title}").format(title=note([title]))
    return step.call


@dataclass(frozen=True, slots=True)
class SourceLine:
    number: int
    text: str
    current: bool


@dataclass(frozen=True, slots=True)
class Source:
    lines: list[SourceLine]
    call: str
    notes: tuple[Note, ...]  # told in the request's language by the template
    fields: list[FieldWrite]
    parent_call: str | None  # the call a visit or node step belongs to
    error: bool  # the step is the error (or the limit) that stopped the program, at its line
    printed: str  # what the program printed (a learner's program)
    objects: list[ObjectAdded]  # the objects a step made, when its note sums up many
    path: str | None  # the file shown, when it is not the program's (a model builder's)


def source(trace: Trace, step: Step) -> Source:
    """The file the step's call was made from (the program's, or one of the files a model
    walkthrough steps into), its line marked."""
    path, text = trace.also[step.file - 1] if 0 < step.file <= len(trace.also) else \
        (None, trace.source)
    parent = trace.steps[step.parent].call if step.parent is not None else None
    return Source([SourceLine(i + 1, t, i + 1 == step.line) for i, t in enumerate(text.splitlines())],
                  call_text(step), step.notes, list(step.fields), parent,
                  step.kind in (StepKind.ERROR, StepKind.CAP), trace.printed,
                  list(step.objects) if len(step.objects) > MANY_OBJECTS else [], path)
