"""The model's answer, for a walkthrough that reads a prompt: the prompt form, the prompt's tokens
and, for every pass, the ten likeliest next tokens with their probabilities, each a link that
appends that token and runs one more pass through the KV cache."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _
from app.views.debugger.where import Where
from app.views.format import token_text
from engine.programs import PROGRAMS
from engine.trace import StepKind, Trace
from engine.trace.groups import StepGroup, step_groups


@dataclass(frozen=True, slots=True)
class Candidate:
    token: int
    text: str
    prob: float
    url: str  # the walkthrough with this token appended


@dataclass(frozen=True, slots=True)
class PassCandidates:
    label: str  # "after the prompt", "after ' the'"
    candidates: list[Candidate]


@dataclass(frozen=True, slots=True)
class AnswerView:
    prompt: str
    default_prompt: str
    tokens: list[str]  # the prompt's pieces, <bos> first
    appended: list[str]  # the appended tokens' pieces
    passes: list[PassCandidates]
    back_url: str | None  # one appended token fewer


def answer_view(trace: Trace, where: Where) -> AnswerView | None:
    default_prompt = None if where.is_program else PROGRAMS[where.name].prompt
    if default_prompt is None or "prompt_tokens" not in trace.outputs:
        return None
    then = list(where.then_ids)
    runs = forward_passes(trace)
    # a token appended makes a trace whose steps are this one's up to the end of its last pass
    # (the program's end step comes after the new pass instead): the new pass starts there
    last = runs[-1].last if runs else -1
    if last >= 0 and trace.steps[last].kind == StepKind.END:
        last -= 1
    new_pass = last + 1
    passes: list[PassCandidates] = []
    appended: list[str] = []
    for k in range(len(then) + 1):
        top = trace.outputs.get(f"top10_{k}") or []
        label = _("after the prompt") if k == 0 else _("after {token}").format(token=repr(appended[-1]))
        passes.append(PassCandidates(label, [
            Candidate(int(t), token_text(str(text)), float(p), _at_pass(where, [*then, int(t)], new_pass))
            for t, text, p in top]))
        if k < len(then):
            appended.append(token_text(next((str(x) for t, x, _ in top if int(t) == then[k]), str(then[k]))))
    back = None
    if then:  # the pass before the last is the last of the shorter trace
        back = _at_pass(where, then[:-1], runs[-2].first if len(runs) > 1 else 0)
    return AnswerView(where.prompt or default_prompt, default_prompt,
                      [token_text(str(t)) for t in trace.outputs["prompt_tokens"]],
                      appended, passes, back)


def forward_passes(trace: Trace) -> list[StepGroup]:
    """The trace's forward passes in order: the steps panel's pass groups (by n_past), without
    the steps before the first."""
    return [g for g in step_groups(trace.steps)
            if g.kind == "pass" and trace.steps[g.first].n_past is not None]


def _at_pass(where: Where, then: list[int], step: int) -> str:
    """The walkthrough with these tokens appended (a new trace: nothing selected), at `step`, the
    first step of a pass: through goto, which ends at the trace's last step if it has fewer."""
    query = where.url(step=step, then=",".join(map(str, then)) or None, tensor=None, row=0, block=0,
                      hex="struct").partition("?")[2]
    return f"{where.base}/goto?" + "&".join(q for q in (query, f"step={step}") if q)
