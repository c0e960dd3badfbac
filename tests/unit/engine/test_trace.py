"""The recorder: determinism, state rebuilt from patches equals the live pools, golden traces."""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import random
from pathlib import Path

import numpy as np
import pytest

from engine.core.layout import GGML_OBJECT_SIZE, GGML_TENSOR_SIZE
from engine.core.notes import tell
from engine.gguf import GGUFReader
from engine.programs import FIXTURES_DIR, PROGRAMS, trace_program
from engine.trace import record
from tests.support.recorded import recorded

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("GGML_LENS_UPDATE_GOLDEN") == "1"


def normalised(trace) -> list[dict]:
    """Steps without timings and with thread interleaving folded (chunks as one sorted set).

    Which bytes a CPU-dependent node changed (a BLAS product's) is itself CPU-dependent: such a
    step keeps only the fact."""
    out = []
    for step in trace.to_json()["steps"]:
        if not step["same_on_every_cpu"]:
            step["changes"]["data"] = "values depend on the CPU's BLAS kernel"
        threads = step.pop("threads")
        step["shares"] = sorted(json.dumps(r) for t in threads for r in t["ranges"])
        step["thread_kinds"] = sorted({t["kind"] for t in threads})
        out.append(step)
    return out


def record_source(tmp_path: Path, name: str, text: str):
    """The trace of a program's text, written to a file of its own (the recorder follows the
    calls made from that file)."""
    src = tmp_path / f"{name}.py"
    src.write_text(text)
    ns: dict = {}
    exec(compile(text, str(src), "exec"), ns)
    return record(ns["run"], str(src), name)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_same_program_same_hash(name):
    a, b = recorded(name), trace_program(name)  # (two recordings: the first may be another test's)
    assert a.hash == b.hash
    assert normalised(a) == normalised(b)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_golden_trace(name):
    """Golden traces change only on purpose: GGML_LENS_UPDATE_GOLDEN=1 rewrites them."""
    path = GOLDEN / f"{name}.json"
    trace = recorded(name)
    current = {"hash": trace.hash, "steps": normalised(trace)}
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(current, indent=1) + "\n")
    assert path.exists(), f"no golden trace for {name}: run with GGML_LENS_UPDATE_GOLDEN=1"
    golden = json.loads(path.read_text())
    assert current["steps"] == golden["steps"]
    assert current["hash"] == golden["hash"]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_rebuilt_state_equals_live_pools(name):
    """Pools (and backend buffers) rebuilt from the trace at step k, in any order, equal the live
    ones when step k ran.

    Every step of the small walkthroughs is checked; for those with large pools every 7th step
    and the last, and with a real model's (hundreds of MB) every 300th (pools are compared by
    hash)."""
    live: dict[int, dict[int, str]] = {}
    sizes: list[int] = []

    def on_step(step, contexts):
        total = sum(c.mem_size for c in contexts if not c.freed)
        sizes.append(total)
        every = 7 if total < 64 << 20 else 300
        if total < 4 << 20 or step.index % every == 0 or step.kind == "end":
            live[step.index] = {c.id: hashlib.sha1(c.pool.tobytes()).hexdigest()
                                for c in contexts if not c.freed}

    prog = PROGRAMS[name]
    mod = prog.load()
    trace = record(mod.run, mod.__file__, name, prog.threads, on_step=on_step)
    assert len(sizes) == len(trace.steps) - (1 if trace.steps[-1].kind in ("error", "cap") else 0)
    order = sorted(live)
    random.Random(0).shuffle(order)  # backwards and forwards: each state stands alone
    for k in order:
        state = trace.state_at(k)
        regions = {**state.contexts, **state.buffers}  # context pools and backend buffers
        for cid, digest in live[k].items():
            assert hashlib.sha1(regions[cid].pool.tobytes()).hexdigest() == digest, \
                f"step {k}, context or buffer {cid}"


def test_rebuilt_state_has_the_tensors_and_graph():
    trace = trace_program("simple-ctx")
    final = trace.state_at(len(trace.steps) - 1)
    assert [t.name for t in final.tensors()] == ["leaf_0", "leaf_1", "node_0"]
    (gf,) = final.graphs()
    assert gf.n_nodes == 1 and gf.n_leafs == 2
    mid = trace.state_at(2)  # after the second tensor: no graph yet, names still empty
    assert [t.name for t in mid.tensors()] == ["", ""] and mid.graphs() == []
    for state in (final, mid):
        assert state.newest_tensor() == state.tensors()[-1]
    assert trace.state_at(0).newest_tensor() is None  # (the context alone)


def test_steps_say_what_changed():
    trace = trace_program("simple-ctx")
    kinds = [s.kind for s in trace.steps]
    assert kinds[0] == "call" and kinds[-1] == "end"
    new_a = trace.steps[1]
    assert new_a.call.startswith("a = ggml_new_tensor_2d(")
    assert tell(new_a.notes) == ("ggml_new_tensor_2d reserved 32 bytes of header, 336 of tensor struct "
                          "and 32 of data at offset 0x0")
    assert [(o.header, o.offs, o.size) for o in new_a.objects] == [(0, 32, 368)]
    visits = [s for s in trace.steps if s.kind == "visit"]
    assert [s.call for s in visits] == ["visit 'leaf_0'", "visit 'leaf_1'", "visit 'node_0'"]
    assert all(s.parent == visits[0].parent for s in visits)
    named = {(f.field, f.new) for s in visits for f in s.fields}
    assert ("name", "'leaf_0'") in named
    nodes = [s for s in trace.steps if s.kind == "node"]
    assert len(nodes) == 1 and nodes[0].threads[0].kind == "chunks"


def test_thread_shares_recorded_per_node():
    trace = trace_program("threads", 4)
    mm = next(s for s in trace.steps if s.kind == "node" and "MUL_MAT" in s.call)
    assert sorted(t.ith for t in mm.threads) == [0, 1, 2, 3]
    chunks = sorted(c[0] for t in mm.threads for c in t.ranges)
    assert chunks == list(range(18))  # 96 x 40 output in 16 x 16 chunks: 6 x 3


def test_calls_that_make_tensors_are_steps_and_queries_are_not(tmp_path):
    """A facade call is a step unless its function is declared a query (engine.core.api.query):
    ggml_get_rows makes a tensor, however its name begins; ggml_nbytes and ggml_get_name only read."""
    trace = record_source(tmp_path, "rows",
        "from engine.ggml import *\n"
        "def run(n_threads=1):\n"
        "    ctx = ggml_init(ggml_init_params(mem_size=1 << 16))\n"
        "    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 3)\n"
        "    ids = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2)\n"
        "    n = ggml_nbytes(a) + len(ggml_get_name(a))\n"
        "    rows = ggml_get_rows(ctx, a, ids)\n")
    calls = [s for s in trace.steps if s.kind == "call"]
    assert [s.line for s in calls] == [3, 4, 5, 7]
    assert [o.size for o in calls[-1].objects] == [336 + 2 * 4 * 4]


def test_program_error_is_the_last_step(tmp_path):
    trace = record_source(tmp_path, "bad",
        "from engine.ggml import *\n"
        "def run(n_threads=1):\n"
        "    ctx = ggml_init(ggml_init_params(mem_size=1024))\n"
        "    a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 4, 3)\n"
        "    ggml_reshape_2d(ctx, a, 5, 2)\n")
    assert trace.steps[-1].kind == "error" and trace.steps[-1].line == 5
    assert "GGML_ASSERT(ggml_nelements(a) == ne0*ne1)" in trace.error


def test_step_cap_ends_a_runaway_program(tmp_path, monkeypatch):
    import engine.trace.recorder as T

    monkeypatch.setattr(T, "STEP_CAP", 50)
    trace = record_source(tmp_path, "loop",
        "from engine.ggml import *\n"
        "def run(n_threads=1):\n"
        "    ctx = ggml_init(ggml_init_params(mem_size=1 << 20))\n"
        "    while True:\n"
        "        ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1)\n")
    assert len(trace.steps) == 51 and trace.steps[-1].kind == "cap"
    assert trace.error == "stopped after 50 steps"



BLAS_PROGRAM = '''
import numpy as np
from engine.ggml import *


def run(n_threads: int = 1) -> dict:
    ctx = ggml_init(ggml_init_params(mem_size=1024 * 1024, mem_buffer=None, no_alloc=False))
    w = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, 8)  # rows past 1024 by more than 8
    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, 2048, 9)  # activation rows: a BLAS product
    set_data(w, np.linspace(-1, 1, 2048 * 8, dtype=np.float32).reshape(8, 2048))
    set_data(x, np.linspace(1, -3, 2048 * 9, dtype=np.float32).reshape(9, 2048))
    y = ggml_scale(ctx, ggml_mul_mat(ctx, w, x), 0.5)
    u = ggml_add(ctx, x, x)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, y)
    ggml_build_forward_expand(gf, u)
    ggml_graph_compute_with_ctx(ctx, gf, n_threads)
    return {"y": y}
'''


def test_blas_values_are_marked_and_left_out_of_the_hash(tmp_path, monkeypatch):
    """A BLAS product's last bits depend on the CPU's BLAS kernel: its node, and every node
    computed from it, are marked, and the hash does not change when those bits do."""
    import importlib.util

    from engine.compute.kernels import matmul

    path = tmp_path / "blas_program.py"
    path.write_text(BLAS_PROGRAM)
    spec = importlib.util.spec_from_file_location("blas_program", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)

    def trace():
        return record(mod.run, str(path), "blas-program", 2)

    first = trace()
    marks = {s.call: s.same_on_every_cpu for s in first.steps if s.kind == "node"}
    assert [v for k, v in marks.items() if k.startswith("MUL_MAT")] == [False]
    assert [v for k, v in marks.items() if k.startswith("SCALE")] == [False]
    assert [v for k, v in marks.items() if k.startswith("ADD")] == [True]

    exact = matmul.blas_product
    monkeypatch.setattr(matmul, "blas_product",
                        lambda x, w: np.nextafter(exact(x, w), np.float32(np.inf)))
    other = trace()  # another CPU's BLAS: other last bits
    assert other.outputs["y"] != first.outputs["y"]
    assert other.hash == first.hash
    assert normalised(other) == normalised(first)


def test_checkpoints_rebuild_the_same_state(monkeypatch):
    """A state rebuilt from a checkpoint and the patches after it equals one rebuilt from step 0."""
    import engine.trace.states as T

    plain = trace_program("tiny-llama")
    monkeypatch.setattr(T, "checkpoint_every", lambda pool_bytes: 4096)
    by_bytes = trace_program("tiny-llama")
    assert len(by_bytes._checkpoints()) > 10
    monkeypatch.setattr(T, "checkpoint_every", lambda pool_bytes: 1 << 62)
    monkeypatch.setattr(T, "CHECKPOINT_PATCHES", 64)  # by the number of patches replayed instead
    by_patches = trace_program("tiny-llama")
    assert len(by_patches._checkpoints()) > 10
    monkeypatch.setattr(T, "CHECKPOINT_PATCHES", 1 << 62)
    assert plain._checkpoints() == []
    for k in random.Random(1).sample(range(len(plain.steps)), 25) + [len(plain.steps) - 1]:
        a = plain.state_at(k)
        for checked in (by_bytes, by_patches):
            b = checked.state_at(k)
            assert a.contexts.keys() == b.contexts.keys()
            for cid in a.contexts:
                assert np.array_equal(a.contexts[cid].pool, b.contexts[cid].pool), (k, cid)


def test_a_freed_context_leaves_the_rebuilt_state():
    """After ggml_free the pool is gone (ggml returned it to the allocator): a rebuilt state no
    longer holds it, so a program that makes and frees contexts in a loop (ggml-opt's graph
    copies) does not make every state hold every pool it ever had."""
    trace = trace_program("mnist-style")
    k = next(s.index for s in trace.steps if s.call.strip().startswith("ggml_free(ctx)"))
    before, after = trace.state_at(k - 1), trace.state_at(k)
    freed = set(before.contexts) - set(after.contexts)
    assert len(freed) == 1
    assert after.nbytes == before.nbytes - before.contexts[freed.pop()].mem_size
    train = trace_program("mnist-train")
    assert len(train.state_at(len(train.steps) - 1).contexts) < 10  # not one per epoch


def test_backend_buffers_are_tracked_in_the_order_they_were_made(monkeypatch):
    """The buffer registry is keyed by address: an address an earlier recording used keeps that
    recording's place in it. The recorder takes the buffers in the order they were made, so a
    step that makes two lists them the same way in any process (a playground copy of mnist-train
    once listed them the other way round)."""
    from types import SimpleNamespace

    from engine.trace import backend as traced

    rec = SimpleNamespace(space=object(), shadow={})
    rec.shadow_pool = lambda buf: rec.shadow.setdefault(buf.id, buf)
    made = [SimpleNamespace(id=k, space=rec.space, mem_size=8) for k in (9, 11)]
    monkeypatch.setattr(traced, "_BUFFERS", {0x2000: made[1], 0x1000: made[0]})  # an older order
    recorder = traced.BackendRecorder(rec)
    recorder.track_buffers()
    assert [b.id for b in recorder.buffers] == [9, 11]


def test_a_loaded_models_bytes_are_kept_as_the_files(tmp_path):
    """The step that loads a GGUF keeps its data section as a view of the file's pages (no copy
    of a model's weights), and compares the pool with the file, not with zeros: a weight the
    program then overwrites is a patch of its own, on top. Every state rebuilt from that equals
    the live pools."""
    path = FIXTURES_DIR / "minilm-q8_0.gguf"
    text = f'''
import numpy as np
from engine.ggml import *

def run(n_threads=1):
    gguf, ctx = gguf_init_from_file({str(path)!r}, gguf_init_params(no_alloc=False, ctx=True))
    w = ggml_get_tensor(ctx, "token_embd_norm.weight")
    set_data(w, np.arange(384, dtype=np.float32))
    ctx2 = ggml_init(ggml_init_params(mem_size=1 << 20, mem_buffer=None, no_alloc=False))
    y = ggml_scale(ctx2, w, 2.0)
    gf = ggml_new_graph(ctx2)
    ggml_build_forward_expand(gf, y)
    ggml_graph_compute_with_ctx(ctx2, gf, n_threads)
    return {{"y": y}}
'''
    live: dict[int, dict[int, bytes]] = {}
    src = tmp_path / "loads.py"
    src.write_text(text)
    ns: dict = {}
    exec(compile(text, str(src), "exec"), ns)
    trace = record(ns["run"], str(src), "loads",
                   on_step=lambda step, pools: live.__setitem__(
                       step.index, {c.id: hashlib.sha1(c.pool.tobytes()).digest()
                                    for c in pools if not c.freed}))
    assert trace.outputs["y"] == [2.0 * i for i in range(384)]
    raw = path.read_bytes()
    load = trace.steps[0]
    (from_file,) = [p for p in load.patches if isinstance(p.data, memoryview)]
    assert len(from_file.data) > 20 << 20 and not any(len(p.data) > 4096 for p in load.patches
                                                       if p is not from_file)
    r = GGUFReader(path)
    assert bytes(from_file.data) == raw[r.data_offset:r.data_offset + r.data_size]
    assert from_file.offset == GGML_OBJECT_SIZE + GGML_TENSOR_SIZE  # the blob's data, first in the pool
    written = next(s for s in trace.steps if s.call.strip().startswith("set_data"))
    assert len(written.patches) == 1 and 0 < len(written.patches[0].data) <= 384 * 4
    for k in random.Random(0).sample(sorted(live), len(live)):
        state = trace.state_at(k)
        for cid, digest in live[k].items():
            assert hashlib.sha1(state.contexts[cid].pool.tobytes()).digest() == digest, (k, cid)


@pytest.mark.parametrize("no_repack", [True, False], ids=["nr", "repacked"])
def test_a_mapped_models_weights_are_the_files_pages(tmp_path, no_repack):
    """A model loaded as llama.cpp loads it by default (-lm auto: the CPU weights a CPU_Mapped
    buffer over the file's mapping) is recorded without a copy of those weights: the step that
    maps them keeps the file's pages as its patch, the trace's held bytes leave them out, and a
    rebuilt state's buffer is the file's pages (mapped copy-on-write), equal to the live one at
    every sampled step. Repacked weights are held once, in their buffer's mirror (a memory file
    the patches view and later states map). What the program left allocated is released when
    it ends."""
    from engine.backend.buffer import live_buffers
    from engine.core.types import GGMLType
    from engine.trace.pools import file_pages
    from tests.conformance.test_models import write_tiny_llama

    from tests.support.vocab import vocab_files

    path = tmp_path / "tiny.gguf"
    write_tiny_llama(path, GGMLType.Q4_0, vocab=next(p for p in vocab_files() if p.name == "ggml-vocab-llama-spm.gguf"))
    before = len(live_buffers())
    live: dict[int, dict[int, bytes]] = {}

    def seen(step, pools) -> None:
        if step.index % 7 == 0:  # (the loading steps among them: a buffer half loaded)
            live[step.index] = {c.id: hashlib.sha1(c.pool.tobytes()).digest() for c in pools if not c.freed}

    prog = PROGRAMS["model"].load()
    trace = record(prog.run, prog.__file__, "model", 1, on_step=seen, also=PROGRAMS["model"].also_files,
                   path=str(path), prompt="Hello", then=(5, 7), no_repack=no_repack)
    assert trace.error is None, trace.error
    assert len(live_buffers()) == before  # (its weights, cache and compute buffers freed at its end)
    viewed = [(p, file_pages(p.data)) for s in trace.steps for p in s.patches]
    (weights,) = [p for p, src in viewed if src is not None and not src[0].held]
    where = file_pages(weights.data)
    assert where is not None and where[0].path == str(path)
    r = GGUFReader(path)
    first = min(t.data_offset for t in r.tensors)
    assert where[1] == first and bytes(weights.data) == path.read_bytes()[first:first + len(weights.data)]
    mirrored = [p for p, src in viewed if src is not None and src[0].held]
    assert bool(mirrored) == (not no_repack)  # (the repacked weights, in their mirror)
    total = sum(len(p.data) for s in trace.steps for p in s.patches)
    assert trace.recorded_bytes == total - len(weights.data)
    for k in sorted(live):
        state = trace.state_at(k)
        pools = {**state.contexts, **state.buffers}
        for cid, digest in live[k].items():
            assert hashlib.sha1(pools[cid].pool.tobytes()).digest() == digest, (k, cid)
    last = trace.state_at(len(trace.steps) - 1)
    (buf,) = [b for b in last.buffers.values() if b.name == "CPU_Mapped"]
    base = buf.pool.base  # the file's pages (read-only, or mapped copy-on-write), not a copy
    assert isinstance(getattr(base, "obj", base), mmap.mmap), type(base)


def test_a_repacked_weights_buffer_is_its_mirror_and_keeps_each_write(tmp_path):
    """Recorded, a CPU_REPACK buffer's pool is its mirror's pages: the repack is written once,
    and each tensor's patch views it. Its tensors end and begin inside pages (a page copy-on-write
    after the first tensor's write still gets the next tensor's bytes into the mirror), and a
    weight written again keeps its first bytes in the earlier states: every state equals the
    live pools, and the first product's values are those of the first weights."""
    from engine.trace.pools import file_pages

    text = '''
import numpy as np
from engine.ggml import *
from engine.ggml_alloc import *
from engine.ggml_backend import *

K, ROWS, N = 256, 200, 4  # 4 weights of 28,800 bytes: their bounds fall inside pages

def weights(seed):
    values = np.random.default_rng(seed).standard_normal(ROWS * K).astype(np.float32)
    q = np.zeros(ROWS * ggml_row_size(GGML_TYPE_Q4_0, K), dtype=np.uint8)
    ggml_quantize_chunk(GGML_TYPE_Q4_0, values, q, 0, ROWS, K, None)
    return q

def run(n_threads=1):
    ctx_w = ggml_init(ggml_init_params(mem_size=N * ggml_tensor_overhead(), mem_buffer=None, no_alloc=True))
    ws = [ggml_new_tensor_2d(ctx_w, GGML_TYPE_Q4_0, K, ROWS) for _ in range(N)]
    ctx = ggml_init(ggml_init_params(mem_size=4 * ggml_tensor_overhead() + ggml_graph_overhead(),
                                     mem_buffer=None, no_alloc=True))
    x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, K, 1)
    y = ggml_mul_mat(ctx, ws[2], x)
    gf = ggml_new_graph(ctx)
    ggml_build_forward_expand(gf, y)
    reg = ggml_backend_cpu_reg()
    extra = ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts")
    buf_w = ggml_backend_alloc_ctx_tensors_from_buft(ctx_w, extra(ggml_backend_reg_dev_get(reg, 0))[0])
    ggml_backend_buffer_set_usage(buf_w, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
    buf = ggml_backend_alloc_ctx_tensors_from_buft(ctx, ggml_backend_cpu_buffer_type())
    for i in (1, 0, 3, 2):  # (out of order: a page's second tensor after its first)
        ggml_backend_tensor_set(ws[i], weights(i), 0, ggml_nbytes(ws[i]))
    ggml_backend_tensor_set(x, np.ones(K, dtype=np.float32), 0, ggml_nbytes(x))
    backend = ggml_backend_cpu_init()
    ggml_backend_graph_compute(backend, gf)
    first = ggml_backend_tensor_get(y, 0, ggml_nbytes(y))
    ggml_backend_tensor_set(ws[2], weights(9), 0, ggml_nbytes(ws[2]))  # the weight again
    ggml_backend_graph_compute(backend, gf)
    return {"first": np.frombuffer(first, np.float32).copy(), "y": y}
'''
    src = tmp_path / "pooled.py"
    src.write_text(text)
    ns: dict = {}
    exec(compile(text, str(src), "exec"), ns)
    live: dict[int, dict[int, bytes]] = {}
    trace = record(ns["run"], str(src), "pooled",
                   on_step=lambda step, pools: live.__setitem__(
                       step.index, {c.id: hashlib.sha1(c.pool.tobytes()).digest()
                                    for c in pools if not c.freed}))
    assert trace.error is None, trace.error
    loads = [s for s in trace.steps if "ggml_backend_tensor_set(ws[i]" in s.call]
    assert len(loads) == 4
    for s in loads:  # each load's patch: views of the mirror's pages, as many bytes as the tensor
        assert all((src := file_pages(p.data)) is not None and src[0].held for p in s.patches)
        assert sum(len(p.data) for p in s.patches) <= ROWS_BYTES
    again = next(s for s in trace.steps if "weights(9)" in s.call)
    assert again.patches and all(file_pages(p.data) is None for p in again.patches)  # (copies)
    assert trace.outputs["first"] != trace.outputs["y"]
    for k in sorted(live):
        state = trace.state_at(k)
        pools = {**state.contexts, **state.buffers}
        for cid, digest in live[k].items():
            assert hashlib.sha1(pools[cid].pool.tobytes()).digest() == digest, (k, cid)


ROWS_BYTES = 200 * 8 * 18  # a 200 x 256 Q4_0 weight's bytes
