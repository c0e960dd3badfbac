"""Will it fit? The engine's memory plan against llama.cpp's own buffers, to the byte.

Oracle: llama.cpp (llama-cpp-python 0.3.36) loading the same file and making its context with
the same settings, in a process of its own (tests/support/llamacpp_memory.py): every buffer line
it logs (load_tensors' model buffers, the output buffer, each KV cache's buffer and size line,
Mamba's RS buffer, sched_reserve's compute buffer: MiB to two decimals) must be the line
`ggml-lens plan` prints, and its memory breakdown (llama_get_memory_breakdown: bytes per buffer
type for the model, the context's caches and the compute buffer) must equal the plan's bytes.

Files: the bundled Gemma and tiny files of every architecture the engine builds (llama, qwen2,
qwen3, qwen3moe, gemma2, gemma3 with a sliding window of 64, phi3, mamba), in weight types the
AVX2 build repacks (Q4_0, Q4_K) or not (Q8_0), and a 7B-shaped LLaMA whose weights are holes
(a sparse file: llama.cpp maps it, the plan never reads it). Settings: contexts 512 to 32768 (and
1000, padded to 1024), ubatches 64 to 512, K/V caches f16, q8_0, q4_0 with flash attention on
and off (V f16 without it), -nr, --swa-full, --no-mmap. `make test` runs a representative
subset; GGML_LENS_SWEEP=all the whole grid.
"""

from __future__ import annotations

import itertools
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as cli_main
from app.cli_plan import plan_lines
from engine.core.types import GGMLType
from engine.models.params import ContextParams, cache_type
from engine.models.plan import FIT_MARGIN, FIT_MIN_CTX, Plan, fit, fit_bytes, plan
from tests.conformance.test_models import write_tiny_llama
from tests.conformance.test_models_gemma2_phi3 import write_gemma2, write_phi3
from tests.conformance.test_models_moe_mamba import write_tiny_mamba, write_tiny_qwen3moe
from tests.support.llamacpp_memory import measure
from tests.support.tiny_gemma import gemma_weights
from tests.support.tiny_models import TinyFile

ALL = os.environ.get("GGML_LENS_SWEEP") == "all"
MIB = 1 << 20

# the buffer lines llama.cpp logs while it loads a model and makes its context (plan_lines'
# lines in the same formats)
BUFFER_LINE = re.compile(r"^(load_tensors: .* model buffer size = |llama_context: .* output "
                         r"buffer size = |llama_kv_cache_iswa: creating |llama_kv_cache: .* KV "
                         r"buffer size = |llama_kv_cache: size = |llama_memory_recurrent: .* RS "
                         r"buffer size = |sched_reserve: .* compute buffer size = )")


def write_gemma3(path: Path, type_: GGMLType, seed: int = 3) -> None:
    """A tiny `gemma3` file: QK norms, heads of 64, 7 layers (the sixth global, the others
    sliding) and a window of 64 positions, so that the SWA cache is smaller than the context,
    and a context of 32768 as the bundled Gemma's (what -c 0 and --fit start from)."""
    e, n_head, n_kv, n_ff, n_layer, n_vocab, hd = 256, 4, 2, 512, 7, 320, 64
    with TinyFile(path, "gemma3", type_, seed) as f:
        f.decoder_keys(32768, e, n_layer, n_ff, n_head, n_kv, n_vocab, rms_eps=1e-6,
                       freq_base=1000000.0)
        f.w.add_key_length(hd)
        f.w.add_value_length(hd)
        f.w.add_sliding_window(64)
        gemma_weights(f, "gemma3", e, n_layer, n_ff, n_head, n_kv, hd, n_vocab)


def write_sparse_llama(path: Path, n_embd: int, n_layer: int, n_ff: int, n_head: int,
                       n_vocab: int, type_: GGMLType) -> int:
    """A LLaMA file whose header is real and whose weights are holes: the header, the keys and
    the tensor infos written by gguf-py, the file then extended to the size its tensors need
    (a sparse file: no disk, no bytes to read). Returns that size."""
    import gguf

    from engine.core.types import TYPE_TRAITS

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("none")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    tr = TYPE_TRAITS[type_]

    def mat(name: str, k: int, rows: int) -> None:
        row = k // tr.blck_size * tr.type_size
        w.add_tensor_info(name, (rows, row), np.dtype(np.uint8), rows * row,
                          gguf.GGMLQuantizationType(int(type_)))

    def vec(name: str, n: int) -> None:
        w.add_tensor_info(name, (n,), np.dtype(np.float32), 4 * n)

    mat("token_embd.weight", n_embd, n_vocab)
    for i in range(n_layer):
        vec(f"blk.{i}.attn_norm.weight", n_embd)
        for x in "qkv":
            mat(f"blk.{i}.attn_{x}.weight", n_embd, n_embd)
        mat(f"blk.{i}.attn_output.weight", n_embd, n_embd)
        vec(f"blk.{i}.ffn_norm.weight", n_embd)
        mat(f"blk.{i}.ffn_gate.weight", n_embd, n_ff)
        mat(f"blk.{i}.ffn_up.weight", n_embd, n_ff)
        mat(f"blk.{i}.ffn_down.weight", n_ff, n_embd)
    vec("output_norm.weight", n_embd)
    mat("output.weight", n_embd, n_vocab)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    fout = w.fout[0]
    data = -(-fout.tell() // w.data_alignment) * w.data_alignment
    size = data + sum(-(-t.nbytes // w.data_alignment) * w.data_alignment
                      for t in w.tensors[0].values())
    fout.close()
    os.truncate(path, size)
    return size


TINY = {"llama": lambda p: write_tiny_llama(p, GGMLType.Q4_0),
        "qwen2": lambda p: write_tiny_llama(p, GGMLType.Q4_K, arch="qwen2"),
        "qwen3": lambda p: write_tiny_llama(p, GGMLType.Q8_0, arch="qwen3"),
        "qwen3moe": lambda p: write_tiny_qwen3moe(p, GGMLType.Q4_0),
        "gemma2": lambda p: write_gemma2(p, GGMLType.Q4_0, 1),
        "gemma3": lambda p: write_gemma3(p, GGMLType.Q4_K),
        "phi3": lambda p: write_phi3(p, GGMLType.Q4_0, 2),
        "mamba": lambda p: write_tiny_mamba(p, GGMLType.Q4_0)}


@pytest.fixture(scope="module")
def files(tmp_path_factory, gemma_path) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("plan")
    out = {}
    for arch, write in TINY.items():
        out[arch] = tmp / f"{arch}.gguf"
        write(out[arch])
    out["gemma"] = gemma_path
    return out


@dataclass(frozen=True, slots=True)
class Setting:
    """llama-cli's flags for one plan: -c, -ub, -ctk (and -ctv: the same with flash
    attention, f16 without), -fa, -nr, --swa-full, --no-mmap."""

    n_ctx: int
    n_ubatch: int
    cache: str = "f16"
    fa: str = "on"
    nr: bool = False
    swa_full: bool = False
    mmap: bool = True

    def params(self) -> ContextParams:
        return ContextParams(n_ctx=self.n_ctx, n_ubatch=self.n_ubatch, flash_attn=self.fa,
                             type_k=self.cache, type_v=self.cache if self.fa == "on" else "f16",
                             no_repack=self.nr, swa_full=self.swa_full)

    def oracle(self) -> dict:
        p = self.params()
        return dict(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, flash_attn=self.fa,
                    type_k=int(p.type_k), type_v=int(p.type_v), swa_full=self.swa_full,
                    use_mmap=self.mmap, extra_bufts=not self.nr)


# every file on three settings that, together, take each value of each flag
SUBSET = (Setting(4096, 512, "q8_0", "on"), Setting(1000, 64, "q4_0", "off", nr=True),
          Setting(32768, 256, "f16", "off", swa_full=True, mmap=False))
EXTRAS = (dict(), dict(nr=True), dict(swa_full=True), dict(mmap=False))
GRID = tuple(Setting(c, ub, t, fa, **x) for c, ub, t, fa, x in itertools.product(
    (512, 4096, 32768), (64, 512), ("f16", "q8_0", "q4_0"), ("on", "off"), EXTRAS))
SETTINGS = GRID if ALL else SUBSET


def differences(path: Path, s: Setting, theirs: dict) -> list[str]:
    """What the plan of `path` with setting `s` says differently from llama.cpp's answer."""
    assert "error" not in theirs, (path.name, s, theirs["log"][-2000:])
    mine = plan(path, s.params(), mmap=s.mmap)
    out = []
    their_lines = [ln for ln in theirs["log"].splitlines() if BUFFER_LINE.match(ln)]
    my_lines = [ln for ln in plan_lines(mine) if BUFFER_LINE.match(ln)]
    if my_lines != their_lines:
        out.append(f"log lines: ours {my_lines} theirs {their_lines}")
    bd = theirs["breakdown"]
    bytes_theirs = ({k: v[0] for k, v in bd.items() if v[0]}, sum(v[1] for v in bd.values()),
                    sum(v[2] for v in bd.values()))
    bytes_mine = ({b.name: b.size for b in mine.model}, sum(c.size for c in mine.caches),
                  mine.compute)
    if bytes_mine != bytes_theirs:
        out.append(f"bytes (model, caches, compute): ours {bytes_mine} theirs {bytes_theirs}")
    return [f"{path.name} {s}: {d}" for d in out]


def test_plans_are_llama_cpps(files):
    """Every file on every setting: each buffer llama.cpp logs is the line `ggml-lens plan`
    prints, and its memory breakdown is the plan's bytes."""
    bad = []
    for path in files.values():  # one llama.cpp process a file
        answers = measure([(path, s.oracle()) for s in SETTINGS])
        bad += [d for s, theirs in zip(SETTINGS, answers) for d in differences(path, s, theirs)]
    assert not bad, "\n".join(bad[:20])


def test_the_issues_example(gemma_path, capsys):
    """The bundled Gemma at -c 4096 -ctk q8_0 -ctv q8_0 -fa on, as `ggml-lens plan --json`
    prints it and as llama.cpp's default llama_context_params (n_batch 2048, swa_full on,
    which llama-cli turns off) make it."""
    flags = ["-c", "4096", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on", "--swa-full"]
    assert cli_main(["plan", str(gemma_path), *flags, "--json"]) == 0
    import json

    got = json.loads(capsys.readouterr().out)
    [theirs] = measure([(gemma_path, Setting(4096, 512, "q8_0", "on", swa_full=True).oracle())])
    bd = theirs["breakdown"]
    assert got["model"] == {k: v[0] for k, v in bd.items() if v[0]}
    assert sum(got["kv"].values()) == bd["CPU"][1] and list(got["kv"]) == ["non-SWA", "SWA"]
    assert got["compute"] == {"CPU": bd["CPU"][2]}
    assert f"{got['output']['CPU'] / MIB:8.2f} MiB" in theirs["log"]
    assert got["peak"][0]["name"] == "result_output"  # the logits of a 512-token ubatch


def test_files_of_holes(tmp_path, monkeypatch):
    """LLaMA files whose weights are holes in a sparse file: a 1.1B-shaped one (1 GB, Q8_0),
    which llama.cpp maps and sizes as the plan does; an 8 GB one (a 7B shape with 36 layers),
    which llama.cpp's fit pass sizes without mapping it (no_alloc: its breakdown in bytes), as
    the plan does without --no-mmap's CPU buffer ever being made (dummy buffers only)."""
    import engine.backend.buffer as buffer_mod

    small, big = tmp_path / "llama-1b-holes.gguf", tmp_path / "llama-8gb-holes.gguf"
    write_sparse_llama(small, 2048, 22, 5632, 32, 32000, GGMLType.Q8_0)
    assert write_sparse_llama(big, 4096, 36, 11008, 32, 32000, GGMLType.Q8_0) > 8 * 10**9
    assert os.stat(big).st_blocks * 512 < 1 << 20  # really holes
    s = Setting(4096, 512, "q8_0", "on")
    theirs_small, theirs_big = measure([(small, s.oracle()), (big, {**s.oracle(), "no_alloc": True})])
    assert not differences(small, s, theirs_small)
    sizes = []
    made = buffer_mod.Buffer.__init__

    def record(self, buft, size, data=None):
        sizes.append(size)
        made(self, buft, size, data)

    monkeypatch.setattr(buffer_mod.Buffer, "__init__", record)
    mine = plan(big, s.params(), mmap=False)
    assert max(sizes) == 0
    bd = theirs_big["breakdown"]
    assert {b.name: b.size for b in mine.model} == {k: v[0] for k, v in bd.items() if v[0]}
    assert (sum(c.size for c in mine.caches), mine.graphs[0].size) == \
        (sum(v[1] for v in bd.values()), sum(v[2] for v in bd.values()))


def test_fit_measures_what_llama_fit_params_measures(files):
    """llama-fit-params measures a model in its fit pass (no_alloc, no mmap) and counts the
    host buffer types of its memory breakdown: at the model's own context and at the minimum
    one, those are fit_bytes of the plans (CPU_REPACK and the output buffer not counted)."""
    cases = [(files["gemma"], ContextParams()), (files["gemma"], ContextParams(n_ctx=4096)),
             (files["gemma3"], ContextParams(n_ctx=1024, type_k="q8_0", type_v="q8_0"))]
    answers = measure([(path, {**_oracle_of(p), "no_alloc": True}) for path, p in cases])
    for (path, p), theirs in zip(cases, answers):
        host = sum(sum(v[:3]) for v in theirs["breakdown"].values() if v[3])
        assert fit_bytes(plan(path, p, mmap=False)) == host, (path.name, p)


def _oracle_of(p: ContextParams) -> dict:
    return dict(n_ctx=p.n_ctx, n_batch=p.n_batch, n_ubatch=p.n_ubatch, flash_attn=p.flash_attn,
                type_k=int(p.type_k), type_v=int(p.type_v), swa_full=p.swa_full)


def test_fit_finds_a_context_that_fits(files, capsys):
    """--fit: with room for the model's own context, that context; with less, llama-fit-params'
    interpolation lands on a multiple of 256 whose measure fits, and the largest context whose
    whole plan fits is found exactly (the next one does not fit); with too little, none."""
    path = files["gemma3"]
    full, low = plan(path, mmap=False), plan(path, ContextParams(n_ctx=FIT_MIN_CTX), mmap=False)
    roomy = fit(path, plan(path).total + FIT_MARGIN)
    assert roomy.n_ctx == full.n_ctx_train == roomy.largest == full.context.n_ctx
    tight = fit(path, FIT_MARGIN + (fit_bytes(full) + fit_bytes(low)) // 2)
    target = tight.free - tight.margin
    assert tight.n_ctx % 256 == 0 and FIT_MIN_CTX < tight.n_ctx < full.n_ctx_train
    assert (tight.used_max, tight.used_min) == (fit_bytes(full), fit_bytes(low))
    assert fit_bytes(plan(path, ContextParams(n_ctx=tight.n_ctx), mmap=False)) <= target
    assert tight.plan.context.n_ctx == tight.n_ctx and tight.largest is not None
    assert plan(path, ContextParams(n_ctx=tight.largest)).total <= target
    assert plan(path, ContextParams(n_ctx=tight.largest + 256)).total > target
    assert fit(path, FIT_MARGIN + fit_bytes(low) - 1).n_ctx is None
    free = f"{tight.free}"
    assert cli_main(["plan", str(path), "--fit", free]) == 0
    assert capsys.readouterr().out == f"-c {tight.n_ctx} -ub 512\n"
    assert cli_main(["plan", str(path), "--fit", f"{FIT_MARGIN + fit_bytes(low) - 1}"]) == 1
    assert "unable to fit" in capsys.readouterr().err


def test_refusals(gemma_path, capsys):
    """-np beyond 1 and --fit with -c are refused with their reasons; llama.cpp's own
    refusals (a quantized V cache without flash attention) in its words."""
    assert cli_main(["plan", str(gemma_path), "-np", "2"]) == 2
    assert "one sequence" in capsys.readouterr().err
    assert cli_main(["plan", str(gemma_path), "-c", "4096", "--fit", "8G"]) == 1
    assert "leave -c unset" in capsys.readouterr().err
    assert cli_main(["plan", str(gemma_path), "-fa", "off", "-ctv", "q8_0"]) == 1
    assert "quantized V cache requires flash_attn" in capsys.readouterr().err


def resident(path: Path, start: int, end: int) -> int:
    """How many pages of the file's bytes [start, end) are in memory (mincore over a mapping
    of the file, which itself touches nothing)."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    page = mmap.PAGESIZE
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as m:
        base = ctypes.addressof(ctypes.c_char.from_buffer(m))
        first = start // page * page
        n = -(-(end - first) // page)
        vec = (ctypes.c_ubyte * n)()
        assert libc.mincore(ctypes.c_void_p(base + first), ctypes.c_size_t(end - first), vec) == 0
        return sum(v & 1 for v in vec)


def test_gemma_plan_is_quick_and_reads_no_weights(gemma_path, tmp_path, monkeypatch):
    """The bundled Gemma's plan at its defaults (its context of 32768) takes well under a
    second of the process's time (its CPU time: on a shared machine the wall clock counts
    others' work too), makes no buffer with a byte in it and reads no weight: a copy of the
    file, dropped from the page cache (all but a few pages), has no more of its weights' pages
    in memory after the plan than before."""
    import shutil

    import engine.backend.buffer as buffer_mod
    from engine.gguf.reader import GGUFReader

    copy = tmp_path / gemma_path.name
    shutil.copyfile(gemma_path, copy)
    with open(copy, "rb+") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    with GGUFReader(copy) as r:
        data, end = r.data_offset, r.size
    before = resident(copy, data, end)
    assert before < (end - data) // 4096 // 10  # (else the test below could not fail)
    sizes = []
    made = buffer_mod.Buffer.__init__

    def record(self, buft, size, data=None):
        sizes.append(size)
        made(self, buft, size, data)

    monkeypatch.setattr(buffer_mod.Buffer, "__init__", record)
    seconds = []
    for _ in range(2):
        t0 = time.process_time()
        p = plan(copy)
        seconds.append(time.process_time() - t0)
    assert isinstance(p, Plan) and p.context.n_ctx == 32768
    assert sizes and max(sizes) == 0  # dummy buffers only (llama.cpp's no_alloc)
    assert resident(copy, data, end) == before
    assert min(seconds) < 1.0, seconds


def test_the_kv_cache_of_a_context_is_linear_in_it(files):
    """The non-SWA cache grows by K and V rows per cell; the SWA cache stays at the window
    plus a ubatch (padded to 256) whatever the context beyond it, unless --swa-full."""
    small, big = (plan(files["gemma3"], ContextParams(n_ctx=c, type_k=cache_type("f16")))
                  for c in (1024, 4096))
    assert [k.name for k in small.caches] == ["non-SWA", "SWA"]
    assert big.caches[0].size == 4 * small.caches[0].size
    assert big.caches[1].size == small.caches[1].size
    assert big.caches[1].cells == small.caches[1].cells < small.caches[0].cells
    full = plan(files["gemma3"], ContextParams(n_ctx=4096, swa_full=True))
    assert full.caches[1].cells == 4096
