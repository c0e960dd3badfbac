"""Lessons cannot go stale: every stop of every lesson resolves on a trace the current engine
records, its answer fits the stop's form, and the learner who gives that answer is told it is
right (and one who gives another, that it is wrong). The lesson files are checked as they are
read: a file with a fault is refused with its name and the fault."""

from __future__ import annotations

import pytest

from app.lessons import LESSONS, Form, LessonError, read_lesson, read_lessons
from app.lessons.answers import UNREAD, fill, judge, read_number, read_shape, solve
from app.lessons.facts import FACTS, TraceFact, FactError, Selector, resolve
from app.views.debugger.panels import PANELS
from engine.core.context import ggml_used_mem
from engine.core.tensor import ggml_nbytes
from engine.programs import trace_program

PANEL_IDS = frozenset(p.id for p in PANELS)


@pytest.fixture(scope="module")
def traces():
    """Each walkthrough a lesson stops on, recorded once as the app records it."""
    return {name: trace_program(name) for name in sorted({x.walkthrough for x in LESSONS.values()})}


def test_there_are_lessons_for_the_concepts_a_learner_meets():
    assert len(LESSONS) >= 12
    assert all(len(x.stops) >= 4 for x in LESSONS.values())
    walkthroughs = {x.walkthrough for x in LESSONS.values()}
    for needed in ("simple-ctx", "views-and-permute", "graph-build", "threads", "quantized-tensor", "gguf-load",
                   "simple-backend", "offload", "attention-block", "tiny-llama"):
        assert needed in walkthroughs
    orders = [x.order for x in LESSONS.values()]
    assert orders == sorted(orders) and len(set(orders)) == len(orders)  # the map's order, no ties


@pytest.mark.parametrize("lesson_id", sorted(LESSONS))
def test_every_stop_resolves_on_the_recorded_trace_and_fits_its_form(lesson_id, traces):
    lesson = LESSONS[lesson_id]
    trace = traces[lesson.walkthrough]
    for i, stop in enumerate(lesson.stops):
        solved = solve(trace, stop)  # FactError: this lesson went stale
        assert 0 <= solved.asked <= solved.step < len(trace.steps)
        right = str(solved.choice) if stop.form == Form.CHOICE else solved.answer
        assert judge(stop, solved, right).right, (lesson_id, i, solved)
        wrong = str((solved.choice + 1) % len(stop.options)) if stop.form == Form.CHOICE else \
            "[999, 999]" if stop.form == Form.SHAPE else str(solved.value + 1)
        assert not judge(stop, solved, wrong).right, (lesson_id, i, wrong)
        for lang in ("en", "zh"):  # every placeholder filled
            for text in (stop.question(lang), stop.hint(lang)):
                assert "{" not in fill(text, solved)
            assert solved.answer in fill(stop.explain(lang), solved, answer=True)
        assert stop.panel in PANEL_IDS


def test_a_stop_on_a_step_the_program_no_longer_makes_fails(traces):
    trace = traces["simple-ctx"]
    with pytest.raises(FactError, match="no step"):
        resolve(trace, Selector(call="ggml_new_tensor_3d"), TraceFact("used_mem"))
    with pytest.raises(FactError, match="assigns a tensor to 'zz'"):
        resolve(trace, Selector(call="b = ggml_new_tensor_2d"), TraceFact("nbytes", tensor="$zz"))
    with pytest.raises(FactError, match="no tensor is named"):
        resolve(trace, Selector(call="b = ggml_new_tensor_2d"), TraceFact("nbytes", tensor="result"))


def test_facts_read_what_ggml_would_answer(traces):
    """The facts against the engine's own functions on the state rebuilt after the step."""
    trace = traces["simple-ctx"]
    state = trace.state_at(2)
    a, b = (state.tensor(trace.steps[k].tensor) for k in (1, 2))
    at_b = Selector(call="b = ggml_new_tensor_2d")
    assert resolve(trace, at_b, TraceFact("object_offset", tensor="$b"))[1] == b.offs - 32
    assert resolve(trace, at_b, TraceFact("data_offset", tensor="$a"))[1] == a.data - a.ctx.base
    assert resolve(trace, at_b, TraceFact("used_mem"))[1] == ggml_used_mem(state.contexts[0])
    assert resolve(trace, at_b, TraceFact("nbytes", tensor="$b"))[1] == ggml_nbytes(b)
    assert resolve(trace, at_b, TraceFact("field", tensor="$b", field="nb[1]"))[1] == int(b.nb[1])
    assert resolve(trace, at_b, TraceFact("shape", tensor="$b"))[1].ne == tuple(int(n) for n in b.ne[:2])


def test_answers_are_read_as_a_learner_types_them():
    assert read_number("768") == 768 and read_number("0x300") == 768 and read_number(" 1_024 ") == 1024
    assert read_number("1,024") == 1024 and read_number("2.5") == 2.5
    assert read_number("twelve") is None and read_number("") is None and read_number("0x") is None
    assert read_shape("[4, 3]") == (4, 3) and read_shape("4 x 3 x 1") == (4, 3) and read_shape("(4,)") == (4,)
    assert read_shape("four") is None


def test_an_unreadable_answer_is_wrong_and_counted_as_unread(traces):
    lesson = LESSONS["context-arena"]
    solved = solve(traces[lesson.walkthrough], lesson.stops[1])
    judged = judge(lesson.stops[1], solved, "a lot")
    assert not judged.right and judged.said == UNREAD
    low = judge(lesson.stops[1], solved, str(solved.value - 10))
    assert not low.right and low.higher is True  # the answer is higher than what was said


def test_every_fact_kind_says_what_it_is():
    assert all(k.doc for k in FACTS.values())
    used = {s.fact.kind for x in LESSONS.values() for s in x.stops}
    assert len(used) >= 15  # the lessons use the vocabulary, not one kind


GOOD = """
id = "{id}"
order = 1
walkthrough = "simple-ctx"
concept = {{ en = "c", zh = "概念" }}
title = {{ en = "t", zh = "标题" }}
intro = {{ en = "i", zh = "介绍" }}
"""
STOP = """
[[stops]]
at = {{ call = "a = ggml_new_tensor_2d" }}
fact = {{ kind = "{kind}" }}
answer = "number"
panel = "{panel}"
question = {{ en = "{question}", zh = "问题" }}
hint = {{ en = "h", zh = "提示" }}
explain = {{ en = "{{answer}}", zh = "{{answer}}" }}
"""


@pytest.mark.parametrize("change,fault", [
    ({}, None),
    ({"kind": "bytes_used"}, "unknown fact kind 'bytes_used'"),
    ({"panel": "nowhere"}, "panel 'nowhere'"),
    ({"question": "is it {answer}?"}, "may hold only"),
    ({"stops": 3}, "4 or more stops"),
    ({"id": "other"}, "its id must be its file's name"),
])
def test_a_lesson_file_with_a_fault_is_refused_naming_it(tmp_path, change, fault):
    fields = {"kind": "used_mem", "panel": "pool", "question": "how many?", "stops": 4, "id": "mine"} | change
    path = tmp_path / "mine.toml"
    path.write_text(GOOD.format(id=fields["id"]) + STOP.format(**fields) * fields["stops"], encoding="utf-8")
    if fault is None:
        assert len(read_lesson(path, PANEL_IDS).stops) == 4
        return
    with pytest.raises(LessonError, match=fault) as e:
        read_lesson(path, PANEL_IDS)
    assert "mine.toml" in str(e.value)


def test_a_lesson_without_its_chinese_text_is_refused(tmp_path):
    text = (GOOD.format(id="mine") + STOP.format(kind="used_mem", panel="pool", question="q") * 4)
    (tmp_path / "mine.toml").write_text(text.replace('zh = "标题"', 'zh = ""'), encoding="utf-8")
    with pytest.raises(LessonError, match="`title` needs a non-empty text"):
        read_lessons(tmp_path)
