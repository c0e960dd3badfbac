"""llama.cpp's default CPU path, bit for bit: repacked weights, tiled K-quant products, flash
attention `auto`, and the flags that switch them.

Oracle: llama.cpp (llama-cpp-python 0.3.36) in a process of its own, on its default path (extra
buffer types on, GGML_CPU_TILED_MM unset) with the settings llama-cli's flags give; the engine
with the same flags as ContextParams (load_model(path, params=...)). Every logit of a prompt and
of 3 tokens decoded after it through the cache must be the same float.

Settings (llama-cli's flags): the defaults (-fa auto: on; f16 cache; weights repacked); -fa off;
-fa on -ctk q8_0 -ctv q8_0; -nr -fa off. `make test` runs the defaults at prompts of 1, 63, 128
and 600 tokens (ubatches of 512 and 88) and each other setting at 63; GGML_LENS_SWEEP=all (`make
test-sweep`) every setting at every length. Tiny files of each weight type the AVX2 build repacks
(Q4_0, Q4_K, IQ4_NL, MXFP4), in every decoder architecture the engine builds, on the defaults.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from engine.core.types import GGMLType
from engine.models import load_model
from engine.models.params import ContextParams, cache_type
from tests.conformance.test_models import write_tiny_llama
from tests.conformance.test_models_gemma2_phi3 import write_gemma2, write_phi3
from tests.conformance.test_models_moe_mamba import write_tiny_mamba, write_tiny_qwen3moe
from tests.support.llamacpp_run import ask_many

pytestmark = pytest.mark.llamacpp

N_THREADS = 2
N_DECODE = 3
BATCH = dict(n_ctx=1024, n_batch=512, n_ubatch=512)
LENGTHS = (1, 63, 128, 600)
ALL = os.environ.get("GGML_LENS_SWEEP") == "all"

# llama-cli's flags -> (ContextParams' fields, llama_cpp.Llama's arguments and the oracle's switches)
SETTINGS = {
    "defaults": ({}, dict(flash_attn=True)),
    "-fa off": (dict(flash_attn="off"), dict(flash_attn=False)),
    "-fa on -ctk q8_0 -ctv q8_0": (dict(flash_attn="on", type_k="q8_0", type_v="q8_0"),
                                   dict(flash_attn=True, type_k=int(cache_type("q8_0")),
                                        type_v=int(cache_type("q8_0")))),
    "-nr -fa off": (dict(no_repack=True, flash_attn="off"), dict(flash_attn=False, extra_bufts=False)),
}
RUNS = [(s, n) for s in SETTINGS for n in LENGTHS if ALL or s == "defaults" or n == 63]


def prompt(n_vocab: int, n: int, seed: int = 5) -> list[int]:
    """A BOS (id 2) and n - 1 + N_DECODE random token ids."""
    rng = np.random.default_rng(seed + n)
    return [2] + [int(t) for t in rng.integers(100, n_vocab, n - 1 + N_DECODE)]


def ours(model, ids: list[int], n: int) -> np.ndarray:
    model.reset()
    rows = list(model.decode(ids[:n]).logits)
    rows += [model.decode([t]).logits[0] for t in ids[n:]]
    return np.array(rows)


def theirs(jobs: list[tuple[Path, list[int], int]], tmp: Path, oracle: dict,
           batch: dict = BATCH) -> list[np.ndarray]:
    """llama.cpp's logits for each (file, ids, prompt length), one process for all the jobs."""
    outs = [tmp / f"logits-{i}.npy" for i in range(len(jobs))]
    ask_many([(p, {"logits": ids, "out": str(o), "batch": n}) for (p, ids, n), o in zip(jobs, outs)],
             N_THREADS, **batch, swa_full=False, **oracle)
    return [np.load(o) for o in outs]


def differing_rows(mine: np.ndarray, llama: np.ndarray) -> list[int] | str:
    """The rows (positions) whose logits are not the same floats; a shape mismatch as text."""
    if mine.shape != llama.shape:
        return f"shapes {mine.shape} and {llama.shape}"
    return np.flatnonzero((mine.view(np.uint32) != llama.view(np.uint32)).any(axis=1)).tolist()


def assert_bits(mine: np.ndarray, llama: np.ndarray, what: str) -> None:
    differ = differing_rows(mine, llama)
    assert not differ, f"{what}: rows {differ[:8] if isinstance(differ, list) else differ} differ"


@pytest.fixture(scope="module")
def gemma_logits(gemma_path, tmp_path_factory):
    """{(setting, length): the rows whose logits differ from llama.cpp's (compared as they come:
    a 600-token prompt's logits are 630 MB a side, kept no longer than their comparison)}, one
    llama.cpp process a setting."""
    out = {}
    for setting, (fields, oracle) in SETTINGS.items():
        lengths = [n for s, n in RUNS if s == setting]
        model = load_model(gemma_path, params=ContextParams(n_threads=N_THREADS, **BATCH, **fields))
        jobs = [(gemma_path, prompt(model.hp.n_vocab, n), n) for n in lengths]
        tmp = tmp_path_factory.mktemp("gemma")
        outs = [tmp / f"logits-{i}.npy" for i in range(len(jobs))]
        ask_many([(p, {"logits": ids, "out": str(o), "batch": n}) for (p, ids, n), o in zip(jobs, outs)],
                 N_THREADS, **BATCH, swa_full=False, **oracle)
        for (_, ids, n), o in zip(jobs, outs):
            out[setting, n] = differing_rows(ours(model, ids, n), np.load(o))
            o.unlink()
        model.close()
    return out


@pytest.mark.parametrize("setting,n", RUNS, ids=[f"{s} {n}" for s, n in RUNS])
def test_gemma_logits_are_llama_cpps(gemma_logits, setting, n):
    differ = gemma_logits[setting, n]
    shown = differ[:8] if isinstance(differ, list) else differ
    assert not differ, f"gemma3 {setting}, {n}-token prompt: rows {shown} differ"


def test_the_defaults_repack_and_tile(gemma_path):
    """What the default path is made of: Q4_K weights in CPU_REPACK, the others mapped from the
    file (CPU_Mapped), tiled products, flash attention; -nr keeps every weight in the mapping,
    and -lm none reads them into a CPU buffer."""
    model = load_model(gemma_path, params=ContextParams(n_threads=N_THREADS, **BATCH))
    assert model.cparams.flash_attn and model.cparams.tiled == (os.environ.get("GGML_CPU_TILED_MM") != "0")
    assert set(model.file.loaded.buffers) == {"CPU_Mapped", "CPU_REPACK"}
    model.close()
    model = load_model(gemma_path, params=ContextParams(no_repack=True, **BATCH))
    assert set(model.file.loaded.buffers) == {"CPU_Mapped"}
    model.close()
    model = load_model(gemma_path, params=ContextParams(no_repack=True, load_mode="none", **BATCH))
    assert set(model.file.loaded.buffers) == {"CPU"}
    model.close()


WRITERS = {"llama": write_tiny_llama, "qwen2": lambda p, t: write_tiny_llama(p, t, arch="qwen2"),
           "qwen3": lambda p, t: write_tiny_llama(p, t, arch="qwen3"),
           "gemma2": lambda p, t: write_gemma2(p, t, 0), "phi3": lambda p, t: write_phi3(p, t, 0),
           "mamba": write_tiny_mamba, "qwen3moe": write_tiny_qwen3moe}
TINY_BATCH = dict(n_ctx=256, n_batch=256, n_ubatch=256)
REPACKING = (GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4)
EVERY_TYPE = ("llama", "qwen3moe")  # (the others Q4_K alone unless GGML_LENS_SWEEP=all)


def test_tiny_files_on_the_default_path(tmp_path):
    """Every decoder architecture with weights of each type the build repacks: the defaults'
    logits (prompts of 1 and 20 tokens) equal llama.cpp's (qwen3moe: its experts repacked too,
    MUL_MAT_ID by CPU_REPACK's forward_mul_mat_id)."""
    jobs, mine = [], []
    for arch, write in WRITERS.items():
        for t in REPACKING if arch in EVERY_TYPE or ALL else REPACKING[1:2]:
            path = tmp_path / f"{arch}-{t.name}.gguf"
            write(path, t)
            model = load_model(path, params=ContextParams(n_threads=N_THREADS, **TINY_BATCH))
            assert "CPU_REPACK" in model.file.loaded.buffers, path.name
            for n in (1, 20):
                ids = prompt(model.hp.n_vocab, n)
                jobs.append((path, ids, n))
                mine.append(ours(model, ids, n))
            model.close()
    for (path, _, n), m, ll in zip(jobs, mine, theirs(jobs, tmp_path, dict(flash_attn=True), TINY_BATCH)):
        assert_bits(m, ll, f"{path.name}, {n}-token prompt")
