"""Hostile chat templates and tokenizers (app/sandbox/template.py): an uploaded file's template
runs in a worker process bounded in time and memory, never in the server, and its tokenizer's
size is capped before it is built. Each case is a GGUF file a model walkthrough accepts (a 'llama'
architecture; no weights: the Chat tab reads only the metadata), uploaded and sent a message.

The cases about the server's time, memory and processes run against one served app
(tests/support/served.py), each measured against the memory before it; stopping on SIGTERM while
a template runs has a server of its own; the rest runs in-process."""

from __future__ import annotations

import html
import os
import signal
import threading
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest
from gguf import GGUFWriter, TokenType

from app.sandbox import template as T
from app.sandbox.template import TemplateLimits, TemplateRefused, render_chat
from engine.models.chat import OUTPUT_CHARS
from tests.support.served import Served, serve

MiB = 1 << 20
ANSWER = 5.0  # seconds the server may take to answer a hostile request
GROWTH = 50 * MiB  # bytes the server's memory may grow in one hostile case
# ... in the case of 2M merges, whose file the upload store keeps parsed (app/store.py: its 2M
# strings' offsets and lengths, 32 MB, and its mapped pages); the old code grew by gigabytes
MERGES_GROWTH = 100 * MiB
LIMITS = TemplateLimits()

LEGIT = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] | trim }}"
         "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")
NESTED_RANGES = ("{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}"
                 "{% endfor %}")  # 10^10 turns of a loop that writes nothing: a CPU bomb
FOLDED = "{{ 'a' * 2**31 }}"  # a 2 GiB constant, which Jinja folds while it compiles
HUGE_OUTPUT = ("{% for a in range(100000) %}{% for b in range(100000) %}0123456789"
               "{% endfor %}{% endfor %}")  # 100 GB written ten characters at a time
MANY_MERGES = 2_000_000  # the red team's vocabulary: 2M merges in a 24 MiB file


def chat_file(path: Path, template: str, n_merges: int = 1) -> Path:
    """A GGUF file with a byte-level BPE vocabulary of 258 tokens (BOS '<s>', EOS '</s>'),
    `n_merges` merges (all the same one: the count is what costs) and `template`."""
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list([chr(0x100 + i) for i in range(256)] + ["<s>", "</s>"])
    w.add_token_types([TokenType.NORMAL] * 256 + [TokenType.CONTROL] * 2)
    w.add_bos_token_id(256)
    w.add_eos_token_id(257)
    w.add_token_merges(["\u0100 \u0101"] * n_merges)
    w.add_chat_template(template)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def test_the_many_merges_file_is_what_the_red_team_sent(tmp_path: Path) -> None:
    path = chat_file(tmp_path / "merges.gguf", LEGIT, MANY_MERGES)
    assert 24 * MiB <= path.stat().st_size < 25 * MiB


# --- against the served app: time, memory, processes ------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    tmp = tmp_path_factory.mktemp("templates")
    with serve(tmp / "server.log", env={"GGML_LENS_DATA": str(tmp / "data")}) as s:
        yield s


def upload(c: httpx.Client, path: Path) -> str:
    """The uploaded file's digest."""
    r = c.post("/gguf", files={"file": (path.name, path.read_bytes())}, timeout=60)
    assert r.status_code == 303, r.text
    return r.headers["location"].rsplit("/", 1)[-1]


def chat(c: httpx.Client, digest: str, message: str = "Hi there") -> tuple[httpx.Response, float]:
    """The Chat tab's form sent for the model walkthrough on the file: the answer and its time."""
    t = time.monotonic()
    r = c.get("/walkthroughs/model/chat", params={"file": digest, "message": message,
                                                  "system": "Be brief"})
    return r, time.monotonic() - t


def settled_growth(s: Served, before: int) -> int:
    """How much the server's memory grew since `before`, after a moment for work it left running."""
    time.sleep(1.0)
    return s.rss() - before


@pytest.mark.parametrize("template, refusal", [
    (NESTED_RANGES, "did not finish within"),
    (FOLDED, "needs more than 1024 MiB of memory"),
    (HUGE_OUTPUT, f"writes more than {OUTPUT_CHARS:,} characters"),
], ids=["nested-ranges", "folded-constant", "huge-output"])
def test_a_hostile_template_is_refused_in_time_and_memory(served: Served, tmp_path: Path,
                                                          template: str, refusal: str) -> None:
    with served.client(timeout=ANSWER + 5) as c:
        digest = upload(c, chat_file(tmp_path / "hostile.gguf", template))
        before = served.rss()
        r, took = chat(c, digest)
        growth = settled_growth(served, before)
    print(f"{template[:40]}: answered {r.status_code} in {took:.1f} s, the server grew "
          f"{growth / MiB:.1f} MiB")
    assert r.status_code == 422 and refusal in html.unescape(r.text), r.text
    assert took < ANSWER and growth < GROWTH
    assert served.no_children_within(5) == [] and served.alive()


def test_a_tokenizer_of_millions_of_merges_is_refused_before_it_is_built(served: Served,
                                                                        tmp_path: Path) -> None:
    """The red team's 2M merges, asked for three times (the old code built them in the server
    each time: +2.2 GB)."""
    with served.client(timeout=ANSWER + 5) as c:
        digest = upload(c, chat_file(tmp_path / "merges.gguf", LEGIT, MANY_MERGES))
        before = served.rss()
        answers = [chat(c, digest) for _ in range(3)]
        growth = settled_growth(served, before)
    print(f"2M merges, three times: answered in {[round(t, 1) for _, t in answers]} s, the "
          f"server grew {growth / MiB:.1f} MiB")
    for r, took in answers:
        assert r.status_code == 422 and took < ANSWER, r.text
        assert "tokenizer.ggml.merges holds 2,000,000 elements" in html.unescape(r.text)
    assert growth < MERGES_GROWTH
    assert served.no_children_within(5) == [] and served.alive()


def test_a_legitimate_template_still_renders_the_prompt(served: Served, tmp_path: Path) -> None:
    """The same path renders a real template: the walkthrough's prompt is the conversation, the
    BOS and EOS texts the vocabulary's (the second time from the server's memory of them)."""
    expected = "<s><|system|>Be brief</s><|user|>Hi there</s><|assistant|>"
    with served.client(timeout=ANSWER + 5) as c:
        digest = upload(c, chat_file(tmp_path / "legit.gguf", LEGIT, 1000))
        for _ in range(2):
            r, took = chat(c, digest)
            assert r.status_code == 303 and took < ANSWER, r.text
            assert parse_qs(urlsplit(r.headers["location"]).query)["prompt"] == [expected]
    assert served.no_children_within(5) == []


def test_sigterm_stops_the_server_while_a_template_runs(tmp_path: Path) -> None:
    """While a CPU bomb renders, other requests are answered at once, and SIGTERM stops the
    server within the worker's wall-clock limit, leaving no worker behind."""
    with serve(tmp_path / "server.log", env={"GGML_LENS_DATA": str(tmp_path / "data")}) as s, \
            s.client(timeout=ANSWER + 5) as c:
        digest = upload(c, chat_file(tmp_path / "bomb.gguf", NESTED_RANGES))
        bomb = threading.Thread(target=chat, args=(c, digest), daemon=True)
        bomb.start()
        deadline = time.monotonic() + 2
        while not s.children() and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = s.children()  # (the template's worker, while it runs)
        t = time.monotonic()
        assert httpx.get(s.url + "/", timeout=ANSWER).status_code == 200
        assert time.monotonic() - t < 1.0  # (the server is not busy with the template)
        os.kill(s.server_pid, signal.SIGTERM)
        t = time.monotonic()
        s.proc.wait(LIMITS.wall + 5)
        print(f"SIGTERM during a CPU bomb: the server stopped in {time.monotonic() - t:.1f} s")
        assert workers, "the template did not run in a worker"
        assert all(not Path(f"/proc/{pid}").exists() for pid in workers)


# --- in-process: the worker's protocol and the specials kept per file ------------------------

def test_a_worker_renders_and_the_specials_are_kept_per_file(tmp_path: Path) -> None:
    path = chat_file(tmp_path / "legit.gguf", LEGIT, 10)
    messages = [{"role": "user", "content": "Hi"}]
    assert render_chat(path, messages) == "<s><|user|>Hi</s><|assistant|>"
    assert T._SPECIALS[T._File.of(path)] == T.ChatTokens("<s>", "</s>")
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))
    assert T._File.of(path) not in T._SPECIALS  # (another file at the same path)


def test_a_file_that_breaks_a_rule_gets_the_engines_message(tmp_path: Path) -> None:
    for template, why in (("{% for %}", "does not parse"),
                          ("{{ 1 / 0 }}", "ZeroDivisionError: division by zero"),
                          ("{{ raise_exception('no system role') }}", "no system role"),
                          ("{% for x in range(10**9) %}{% endfor %}", "Range too big"),
                          ("x" * ((1 << 17) + 1), "the longest read here has 131,072")):
        with pytest.raises(TemplateRefused, match=why):
            render_chat(chat_file(tmp_path / "bad.gguf", template), [])


def test_no_more_workers_than_slots_run_at_once(tmp_path: Path) -> None:
    """With every slot taken, a request waits SLOT_WAIT seconds, then is told to come back."""
    path = chat_file(tmp_path / "legit.gguf", LEGIT)
    taken = [T._SLOTS.acquire(timeout=0) for _ in range(T.AT_ONCE)]
    try:
        t = time.monotonic()
        with pytest.raises(T.TemplatesBusy):
            render_chat(path, [])
        assert T.SLOT_WAIT <= time.monotonic() - t < T.SLOT_WAIT + 1
    finally:
        for ok in taken:
            if ok:
                T._SLOTS.release()
    assert all(taken)


def test_a_worker_that_writes_no_usable_reply_is_refused() -> None:
    for out, status in ((b"", 1), (b"[1, 2]", 0), (b'{"prompt": 3, "bos": "", "eos": ""}', 0),
                        (b'{"prompt": "x", "bos": "", "eos": "", "more": 1}', 0),
                        (b'{"prompt": "x", "bos": "", "eos": ""}', 1)):
        with pytest.raises(TemplateRefused, match="without a usable answer"):
            T._reply(out, status)
    with pytest.raises(TemplateRefused, match="not UTF-8"):
        T._reply(b'{"prompt": "\\udc80", "bos": "", "eos": ""}', 0)
