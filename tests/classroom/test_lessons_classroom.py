"""A lesson taught to a class: the teacher makes a class on one web process, two learners answer
on the two web processes (the classroom's Redis keeps the counts), and the teacher's page counts
both, each learner's first answer once, with the spread of what they answered. The right answer
is the engine's own number (ggml_used_mem after the step), not the lesson's resolver."""

from __future__ import annotations

import re

import pytest
from redis import Redis

from app.lessons import LESSONS
from app.lessons.tally import KEY
from engine.core.context import ggml_used_mem
from engine.programs import trace_program
from tests.support.classroom import Classroom
from tests.support.load import Report, client, open_page

LESSON = "context-arena"
STOP = 1  # "What will ggml_used_mem(ctx) be after a = ggml_new_tensor_2d(…)?"


@pytest.fixture(scope="module")
def room(tmp_path_factory):
    room = Classroom(tmp_path_factory.mktemp("lessons-classroom"), webs=2, workers=1).start()
    try:
        yield room
    finally:
        room.stop()


def test_the_teachers_view_counts_two_learners_answers_across_web_processes(room):
    trace = trace_program(LESSONS[LESSON].walkthrough)
    a = next(s.index for s in trace.steps if s.call.startswith("a = ggml_new_tensor_2d"))
    right = ggml_used_mem(trace.state_at(a).contexts[0])
    wrong = right - 32

    with client(200) as teacher:
        r = teacher.post(room.web(0) + f"/lessons/{LESSON}/classes", follow_redirects=False)
    assert r.status_code == 303
    tally_url = r.headers["location"]
    code = tally_url.rsplit("/", 1)[1]
    with Redis.from_url(room.queue) as redis:
        assert redis.get(KEY + code) == LESSON.encode()  # the class is the classroom's, not a process's

    report = Report()
    answers = [(201, 0, "learner-one", str(right)), (202, 1, "learner-two", str(wrong)),
               (202, 1, "learner-two", str(right))]  # (learner two's second try is not counted)
    for n, web, learner, answer in answers:
        with client(n) as c:
            page = open_page(c, "GET", room.web(web) + f"/lessons/{LESSON}?class={code}", report)
            assert f'name="class" value="{code}"' in page.text
            verdict = open_page(c, "POST", room.web(web) + f"/lessons/{LESSON}/stops/{STOP}", report,
                                data={"answer": answer, "class": code, "learner": learner})
            assert ('data-right="true"' in verdict.text) == (answer == str(right))
    assert not report.errors, report.errors

    with client(200) as teacher:
        view = open_page(teacher, "GET", room.web(1) + tally_url, report).text
    assert not report.errors, report.errors
    assert f"/lessons/{LESSON}?class={code}" in view  # the learners' link
    row = re.search(rf'<tr data-stop="{STOP}">(.*?)</tr>', view, re.S).group(1)
    assert re.search(r'class="n-answered">2<', row) and re.search(r'class="n-right">1<', row)
    spread = dict((said, int(n)) for said, n in re.findall(r"<code>([^<]+)</code>\s*<span class=\"bar\"[^>]*></span>\s*"
                                                           r"<span class=\"n\">(\d+)</span>", row))
    assert spread == {str(right): 1, str(wrong): 1}
    other = re.search(r'<tr data-stop="0">(.*?)</tr>', view, re.S).group(1)
    assert re.search(r'class="n-answered">0<', other)  # nobody answered question 1
