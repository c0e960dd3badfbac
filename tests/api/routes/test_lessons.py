"""Lesson routes: the map, a lesson's page (which holds no answer), the verdicts, a class's
tally in one process."""

from __future__ import annotations

import re
import time

import pytest
from fastapi.testclient import TestClient

from app.lessons import LESSONS, Form
from app.lessons.views import solved_stops
from app.main import create_app
from app.settings import Settings
from engine.core.tensor import ggml_nbytes
from engine.programs import trace_program


@pytest.fixture(scope="module")
def module_client(tmp_path_factory):
    return TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))))


@pytest.fixture
def client(module_client):
    """The module's client with no language cookie: a `?lang=zh` visit sets one, and each test
    reads the language it asks for."""
    module_client.cookies.clear()
    return module_client


@pytest.mark.parametrize("url,status,texts", [
    ("/lessons", 200, ["The context arena and mem_size", "The KV cache", 'data-lesson="sampling"']),
    ("/lessons/context-arena", 200, ["Question 1 of 5", "ggml_init has made the context", 'id="debugger"',
                                     'data-asked-url="/walkthroughs/simple-ctx/steps/0"']),
    ("/lessons/context-arena?lang=zh", 200, ["它的内存池有多少字节"]),
    ("/lessons/nope", 404, ["There is no lesson named"]),
    ("/lessons/context-arena?class=0badc0de", 404, ["There is no class 0badc0de"]),
    ("/lessons/context-arena/classes/0badc0de", 404, ["There is no class"]),
    ("/", 200, ["New to ggml? Learn with lessons", 'href="/lessons/context-arena"']),
])
def test_pages(client, url, status, texts):
    r = client.get(url)
    assert r.status_code == status
    for t in texts:
        assert t in r.text


def test_a_lesson_page_holds_no_answer(client):
    lesson = LESSONS["gallocr-reuse"]
    solved = solved_stops(trace_program(lesson.walkthrough), lesson)
    page = client.get(f"/lessons/{lesson.id}").text
    asked = [(s.answer, s.given) for s in solved]
    for answer, given in asked:
        if answer not in given:  # (a question may name a number that happens to be the answer)
            assert not re.search(rf"(?<![\d.]){re.escape(answer)}(?![\d])", page), answer


@pytest.mark.parametrize("answer,texts", [
    ("3", ["Not quite.", "The answer is higher than 3.", "Hint:", "Show the answer"]),
    ("0x190", ["Right.", "The answer is <code>400</code>", "Next question"]),
    ("four hundred", ["Write a number", "Hint:"]),
])
def test_verdicts_on_a_number(client, answer, texts):
    r = client.post("/lessons/context-arena/stops/1", data={"answer": answer})
    assert r.status_code == 200
    for t in texts:
        assert t in r.text
    assert ("400" in r.text) == ("Right." in r.text)  # the answer only once it is earned


def test_verdicts_on_a_choice_and_a_shape_and_the_answer_asked_for(client):
    stop = next(i for i, s in enumerate(LESSONS["tensor-struct"].stops) if s.form == Form.CHOICE)
    right = LESSONS["tensor-struct"].stops[stop].options.index("MUL")  # the op of ggml_mul
    r = client.post(f"/lessons/tensor-struct/stops/{stop}", data={"answer": str(right)})
    assert 'data-right="true"' in r.text and "GGML_OP_MUL" in r.text
    r = client.post(f"/lessons/tensor-struct/stops/{stop}", data={"answer": "9"})
    assert 'data-right="false"' in r.text and "Choose one of the options" in r.text
    r = client.post("/lessons/compute-plan/stops/0", data={"answer": "[40, 96]"})
    assert 'data-right="false"' in r.text
    r = client.post("/lessons/compute-plan/stops/0", data={"answer": "96 x 40"})
    assert 'data-right="true"' in r.text and "[96, 40]" in r.text
    r = client.post("/lessons/compute-plan/stops/0", data={"reveal": "true"})
    assert 'data-revealed="true"' in r.text and "[96, 40]" in r.text
    assert client.post("/lessons/compute-plan/stops/9", data={"answer": "1"}).status_code == 404


def test_a_class_counts_each_learner_once_in_one_process(client):
    r = client.post("/lessons/context-arena/classes", follow_redirects=False)
    assert r.status_code == 303
    teacher = r.headers["location"]
    code = teacher.rsplit("/", 1)[1]
    page = client.get(f"/lessons/context-arena?class={code}").text
    assert f'name="class" value="{code}"' in page
    for learner, answer in (("a1", "400"), ("b2", "300"), ("a1", "300"), ("c3", "0x190")):
        assert client.post("/lessons/context-arena/stops/1",
                           data={"answer": answer, "class": code, "learner": learner}).status_code == 200
    view = client.get(teacher).text
    answered = re.findall(r'class="n-answered">(\d+)<', view)
    right = re.findall(r'class="n-right">(\d+)<', view)
    assert answered[:2] == ["0", "3"] and right[:2] == ["0", "2"]  # a1's second answer not counted
    assert re.search(r'<li class="is-right"><code>400</code>.*?<span class="n">2</span>', view, re.S)
    assert re.search(r"<li class=\"\"><code>300</code>.*?<span class=\"n\">1</span>", view, re.S)


def test_next_json_says_where_the_next_object_lands(client):
    trace = trace_program("simple-ctx")
    k = next(s.index for s in trace.steps if s.call.startswith("b = ggml_new_tensor_2d"))
    b = trace.state_at(k).tensor(trace.steps[k].tensor)
    got = client.get(f"/walkthroughs/simple-ctx/steps/{k - 1}/next.json").json()
    assert got["step"] == k and len(got["objects"]) == 1
    o = got["objects"][0]
    assert (o["ctx"], o["header"], o["type"], o["data"], o["nbytes"], o["ne"]) == \
        (b.ctx.id, b.offs - 32, "TENSOR", b.data - b.ctx.base, 24, [int(n) for n in b.ne[:2]])
    assert client.get(f"/walkthroughs/simple-ctx/steps/{k}/next.json").json() == {"step": k + 1, "objects": []}
    assert client.get(f"/walkthroughs/simple-ctx/steps/{len(trace.steps) - 1}/next.json").json()["step"] is None


PROGRAM = """from engine.ggml import *

ctx = ggml_init(ggml_init_params(mem_size=64 * 1024, mem_buffer=None, no_alloc=False))
x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 10)
y = ggml_new_tensor_2d(ctx, GGML_TYPE_F16, 8, 3)
"""


def test_prediction_works_on_a_learners_program_too(tmp_path):
    c = TestClient(create_app(Settings(data_dir=tmp_path, programs=True)))
    r = c.post("/programs", data={"source": PROGRAM, "threads": "1"}, follow_redirects=False)
    url = r.headers["location"]
    deadline = time.monotonic() + 60
    while not re.search(r"/programs/[0-9a-f]{64}/steps/\d+", url):  # its recording page, until recorded
        assert time.monotonic() < deadline, "the program was never recorded"
        time.sleep(0.1)
        r = c.get(url, follow_redirects=False)
        url = r.headers.get("location", url)
    digest = re.search(r"/programs/([0-9a-f]{64})/", url).group(1)
    page = c.get(f"/programs/{digest}/steps/1").text
    assert "data-predict-toggle" in page and "/static/predict.js" in page
    got = c.get(f"/programs/{digest}/steps/1/next.json").json()
    (o,) = got["objects"]
    ran: dict = {}
    exec(PROGRAM, ran)  # the same program on the engine, here: where its y lands
    y = ran["y"]
    assert (o["header"], o["data"], o["nbytes"], o["ne"]) == \
        (y.offs - 32, y.data - y.ctx.base, ggml_nbytes(y), [int(n) for n in y.ne[:2]])
    c.app.state.jobs.close(wait=60)


def test_several_processes_without_redis_keep_no_class(tmp_path):
    c = TestClient(create_app(Settings(data_dir=tmp_path, share_traces=True)))
    r = c.post("/lessons/context-arena/classes", follow_redirects=False)
    assert r.status_code == 409 and "--queue redis://" in r.text
