"""llama.cpp's switches on the model walkthroughs, over HTTP: the Prompt form offers them under
llama-cli's flags, they travel in the query as the prompt does (every link, the recording's key,
its job, run()), a refused combination is llama.cpp's refusal on a 422 page, and the DAG says what
a FLASH_ATTN_EXT node stands for. An API client passes them the same way (the OpenAPI schema lists
them)."""

from __future__ import annotations

import html
import re

import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from engine.core.optable import GGMLOp, ggml_op_symbol
from engine.models.params import ContextParams, ParamsError
from engine.programs import PROGRAMS
from engine.programs.settings import SETTINGS, read_settings
from engine.trace import StepKind
from engine.trace.evaldump import diff_dumps, parse_dump


@pytest.fixture(scope="module")
def client(model_data):
    return TestClient(create_app(Settings(data_dir=model_data)))


def text(r) -> str:
    """A page's words: tags dropped, entities read, spaces folded."""
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", r.text)))


def kept(client: TestClient, name: str, settings=(), prompt=None):
    """The trace the app keeps for these inputs (None: not recorded yet)."""
    traces = client.app.state.traces
    return traces.kept(traces.key(name, None, None, prompt, (), settings))


def recorded(client: TestClient, name: str, query: str, settings=(), prompt=None):
    """The trace of the walkthrough at this query, recorded by the app if it has not been."""
    found = kept(client, name, settings, prompt)
    if found is None:
        assert client.get(f"/walkthroughs/{name}?{query}").status_code == 200
        found = kept(client, name, settings, prompt)
    return found


def node_ops(trace) -> set[str]:
    return {s.call.split(" ")[0] for s in trace.steps if s.kind == StepKind.NODE}


def test_the_form_offers_llama_cpps_flags(client: TestClient):
    page = client.get("/walkthroughs/model/steps/0")
    assert page.status_code == 200
    form = re.search(r'<fieldset class="llama-settings">(.*?)</fieldset>', page.text, re.S)[1]
    for flag, key in (("-fa", "fa"), ("-ctk", "ctk"), ("-ctv", "ctv"), ("-ub", "ub"), ("-c", "c")):
        assert re.search(rf'{flag} <select name="{key}">', form), flag
    assert 'type="checkbox" name="nr" value="1"> -nr' in form
    assert '<option value="auto" selected>auto</option>' in form  # llama.cpp's defaults shown
    assert '<option value="f16" selected>f16</option>' in form and "q8_0" in form
    assert "never repacks" not in form
    gemma = client.get("/walkthroughs/gemma3/steps/0").text
    form = re.search(r'<fieldset class="llama-settings">(.*?)</fieldset>', gemma, re.S)[1]
    assert '-fa <select name="fa">' in form and 'name="ctk"' not in form and 'name="nr"' not in form
    assert "never repacks its weights" in form and "-nr" in form  # the note: llama.cpp's -nr
    assert "llama-settings" not in client.get("/walkthroughs/simple-add/steps/0").text


def test_a_switch_makes_its_own_trace_and_every_link_carries_it(client: TestClient):
    """-fa off is another recording (its key holds it); -fa auto names the default's; the step's
    links, forms and the recording page keep the switch."""
    r = client.get("/walkthroughs/gemma3?fa=off", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/walkthroughs/gemma3/steps/0?fa=off"
    page = client.get(r.headers["location"])
    assert page.status_code == 200
    assert '<option value="off" selected>off</option>' in page.text
    off, on = kept(client, "gemma3", (("flash_attn", "off"),)), kept(client, "gemma3")
    assert off is not None and on is not None and off is not on
    traces = client.app.state.traces
    assert traces.key("gemma3", None, settings=read_settings("gemma3", ("flash_attn",),
                                                                {"flash_attn": "auto"})) \
        == traces.key("gemma3", None)  # the default named: the same recording
    assert "SOFT_MAX" in node_ops(off) and "FLASH_ATTN_EXT" not in node_ops(off)
    assert "FLASH_ATTN_EXT" in node_ops(on) and "SOFT_MAX" not in node_ops(on)
    hrefs = re.findall(r'href="(/walkthroughs/gemma3/steps/\d+[^"]*)"', page.text)
    assert hrefs and all("fa=off" in h for h in hrefs)
    assert re.search(r'<input type="hidden" name="fa" value="off">', page.text)  # the other forms
    polled = client.get("/walkthroughs/gemma3/recording?fa=off&step=3", follow_redirects=False)
    assert polled.status_code == 303 and polled.headers["location"].endswith("/steps/3?fa=off")


def test_the_model_walkthrough_runs_llama_cpps_settings(client: TestClient):
    """-ctk q8_0 -ctv q8_0 -nr -ub 32 reach the builder: a Q8_0 cache (the Buffers tab says so),
    the weights left unrepacked, the prompt in ubatches of 32; the odds are the builder's with
    the same ContextParams."""
    from engine.models import load_model
    from engine.programs.gemma3 import softmax

    prompt = "The capital of France is a city where many people live and work, of course"
    query = f"ctk=q8_0&ctv=q8_0&nr=1&ub=32&prompt={prompt}"
    page = client.get(f"/walkthroughs/model?{query}")
    assert page.status_code == 200, text(page)
    settings = (("type_k", "q8_0"), ("type_v", "q8_0"), ("no_repack", "1"), ("n_ubatch", "32"))
    trace = kept(client, "model", settings, prompt)
    state = trace.state_at(len(trace.steps) - 1)
    assert "CPU_REPACK" not in {b.name for b in state.buffers.values()}
    passes = {s.n_past for s in trace.steps if s.kind == StepKind.NODE}
    assert len(passes) == 1 and len(trace.outputs["prompt_tokens"]) <= 32  # one ubatch
    last = client.get(f"/walkthroughs/model/steps/{len(trace.steps) - 1}?{query}")
    assert "data of 'cache_k_l0' (q8_0)" in html.unescape(last.text)
    params = ContextParams(n_ctx=256, n_threads=1, type_k="q8_0", type_v="q8_0", no_repack=True,
                           n_ubatch=32)
    model = load_model(client.app.state.traces.model_path, params=params)
    logits = model.decode(model.tokenizer.encode_prompt(prompt), all_logits=False).logits[-1]
    best = int(logits.argmax())
    assert tuple(trace.outputs["top10_0"][0]) == (best, model.tokenizer.piece_text(best),
                                                  softmax(logits)[best])


def test_two_ubatches_make_two_passes(client: TestClient):
    prompt = ("The capital of France is a city where many people live and work. It is known for "
              "its museums, its bridges over the river, its cafes and the tower of iron that "
              "stands by the water.")
    r = client.get(f"/walkthroughs/model?ub=32&c=512&prompt={prompt}")
    assert r.status_code == 200
    trace = kept(client, "model", (("n_ubatch", "32"), ("n_ctx", "512")), prompt)
    n = len(trace.outputs["prompt_tokens"])
    assert n > 32
    assert sorted({s.n_past for s in trace.steps if s.kind == StepKind.NODE}) == [0, 32]
    cells = {int(t.ne[1]) for t in trace.state_at(len(trace.steps) - 1).tensors()
             if t.name == "cache_k_l0"}
    assert cells == {512}  # -c 512: the cache's cells


@pytest.mark.parametrize("query, words", [
    ("fa=off&ctv=q8_0", "llama.cpp refuses these settings: quantized V cache requires flash_attn "
                        "to be enabled"),
    ("ctk=q3_K", "-ctk q3_K: Unsupported cache type: q3_K"),
    ("fa=maybe", "error: unknown value for --flash-attn: 'maybe'"),
    ("ub=7", "-ub 7: the walkthroughs offer -ub 512, 256, 128, 64, 32"),
    ("nr=yes", "-nr is a switch"),
])
def test_a_refused_setting_is_llama_cpps_words_on_a_page(client: TestClient, query, words):
    """Asked for by any of the walkthrough's URLs (the first one redirects to step 0)."""
    for url in (f"/walkthroughs/model?{query}", f"/walkthroughs/model/steps/3?{query}",
                f"/walkthroughs/model/recording?{query}",
                f"/walkthroughs/model/eval-callback.txt?{query}"):
        r = client.get(url)
        assert r.status_code == 422, url
        assert words in text(r) and "Traceback" not in r.text
        assert r.headers["content-type"].startswith("text/html")


def test_the_refusals_are_llama_cpps_own():
    """The words on the page are ContextParams' (engine/models/params.py: llama.cpp's), not ours."""
    with pytest.raises(ParamsError) as e:
        ContextParams(flash_attn="off", type_v="q8_0").resolve("gemma3", 32768, 256, 256)
    assert "quantized V cache requires flash_attn to be enabled" == str(e.value)
    with pytest.raises(ParamsError, match="Unsupported cache type: q3_K"):
        ContextParams(type_k="q3_K")


@pytest.mark.parametrize("url", ["/walkthroughs/simple-add?fa=on", "/walkthroughs/gemma3?ctk=q8_0",
                                 "/programs/" + "0" * 64 + "/steps/0?fa=on"])
def test_a_walkthrough_without_the_switch_refuses_it(client: TestClient, url):
    r = client.get(url, follow_redirects=False)
    assert r.status_code in (403, 422) and "Traceback" not in r.text


def test_an_api_client_names_the_switches_in_the_query(client: TestClient):
    schema = client.get("/openapi.json").json()
    params = {p["name"]: p for p in
              schema["paths"]["/{kind}/{name}/steps/{n}"]["get"]["parameters"]}
    for setting in SETTINGS.values():
        assert setting.key in params and params[setting.key]["description"].startswith(setting.flag)
    last = len(recorded(client, "gemma3", "fa=off", (("flash_attn", "off"),)).steps) - 1
    r = client.get(f"/walkthroughs/gemma3/steps/{last}/graph/find?fa=off&q=kq_soft_max-3")
    assert r.status_code == 200 and "fa=off" in r.json()["url"] and "expand=3" in r.json()["url"]


def dag(client: TestClient, url: str) -> tuple[str, str]:
    """The DAG panel of a step's page and its drawing's text, entities read (inlined, or fetched
    from its own URL)."""
    page = client.get(url).text
    panel = page[page.index('<section id="graph"'):]
    panel = panel[:panel.index("</section>")]
    svg = re.search(r"<svg.*</svg>", panel, re.S)
    if svg is None:
        svg = client.get(html.unescape(re.search(r'hx-get="([^"]+\.svg[^"]*)"', panel)[1])).text
    else:
        svg = svg[0]
    return panel, html.unescape(svg)


def test_the_dag_says_what_flash_attention_replaces(client: TestClient):
    """At a layer's FLASH_ATTN_EXT (its layer drawn in full) the drawing has the node, whose
    tooltip and the line under the drawing say what it replaces; -fa off, the same layer has
    KQ (MUL_MAT, drawn X) and SOFT_MAX, and no such line."""
    on = recorded(client, "gemma3", "")
    step = next(s.index for s in on.steps if s.kind == StepKind.NODE and s.call.startswith("FLASH_ATTN_EXT"))
    note = ("one node for KQ = K·Q, softmax, KQV = V·softmax: the MUL_MAT → SOFT_MAX → MUL_MAT of "
            "the path without flash attention")
    panel, svg = dag(client, f"/walkthroughs/gemma3/steps/{step}")
    symbol = ggml_op_symbol(GGMLOp.FLASH_ATTN_EXT)
    assert f"FLASH_ATTN_EXT ({_words('drawn as')} {symbol} ): {note}" in _words(panel)
    assert symbol in svg and f"FLASH_ATTN_EXT, {note}" in svg
    assert "soft_max" not in svg
    off = recorded(client, "gemma3", "fa=off", (("flash_attn", "off"),))
    step = next(s.index for s in off.steps if s.kind == StepKind.NODE and s.call.startswith("SOFT_MAX"))
    panel, svg = dag(client, f"/walkthroughs/gemma3/steps/{step}?fa=off")
    assert "FLASH_ATTN_EXT" not in panel and symbol not in svg
    assert ggml_op_symbol(GGMLOp.SOFT_MAX) in svg and "kq_soft_max-0" in svg


def _words(s: str) -> str:
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", s))).strip()


def test_flash_attention_on_and_off_dumps_diff_as_expected(client: TestClient):
    """The eval-callback dumps of one prompt, -fa on and off (`ggml-lens diff`'s comparison):
    the same nodes up to the attention of layer 0; the path without flash attention has KQ,
    softmax, KQV and the copy of its output in each layer (FLASH_ATTN_EXT is unnamed: ggml's
    node_N, left out), the transposed V's writes in place of the row-wise ones; the first node
    that differs is the attention's output projection, and both pick the same next token."""
    dumps = {}
    for fa in ("on", "off"):
        r = client.get(f"/walkthroughs/gemma3/eval-callback.txt?fa={fa}")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        dumps[fa] = parse_dump(r.text)
    d = diff_dumps(dumps["on"], dumps["off"])
    n_layer = 18
    per_layer = {"kq-{}", "kq_soft_max-{}", "kqv-{}", "kqv_out-{}", "cache_v_l{} (reshaped) (view)"}
    assert set(d.only_b) == {n.format(il) for n in per_layer for il in range(n_layer)}
    assert set(d.only_a) == {f"cache_v_l{il} (view)" for il in range(n_layer)}
    assert [n.op for n in dumps["on"] if n.op == "FLASH_ATTN_EXT"] == ["FLASH_ATTN_EXT"] * n_layer
    before = d.compared[:d.compared.index(d.first_over)]
    assert [n.name for n in before][-1] == "cache_k_l0 (view)" and all(n.max_abs == 0 for n in before)
    assert d.first_over.name == "attn_out-0"
    on = recorded(client, "gemma3", "")
    off = recorded(client, "gemma3", "fa=off", (("flash_attn", "off"),))
    assert on.outputs["next_token"][:2] == off.outputs["next_token"][:2]


def test_every_setting_is_llama_cpps_and_the_walkthroughs():
    """Each setting names a ContextParams field, run()'s keyword with the same default, a line
    of help on the form; the programs take only known ones."""
    import inspect

    from app.views.debugger.settings import HELP
    from engine.models.params import ContextParams

    model = inspect.signature(PROGRAMS["model"].load().run).parameters
    for name, s in SETTINGS.items():
        assert name in ContextParams.__dataclass_fields__ and name in HELP
        assert model[name].default == s.value(s.default)
        assert s.default in s.choices
    assert inspect.signature(PROGRAMS["gemma3"].load().run).parameters["flash_attn"].default == "auto"
    assert all(set(p.settings) <= set(SETTINGS) for p in PROGRAMS.values())
