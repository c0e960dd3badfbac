"""Which weights llama.cpp's default path repacks, and into what: the engine's placement against
llama.cpp's own load log.

llama.cpp (llama-cpp-python 0.3.36, extra buffer types on) logs, while it loads a model, each
tensor the CPU_REPACK buffer type repacks and with which layout ("repack tensor X with
q4_K_8x8"), the first tensor it could not place there ("tensor 'token_embd.weight' (q8_0) (and
N others) cannot be used with preferred buffer type CPU_REPACK"), and each weight buffer's size
in MiB. The engine loads weights as llama.cpp does, with mmap (its default: the CPU weights are a
CPU_Mapped buffer spanning the file from the first to the end of the last) and without
(use_mmap=False: its CPU buffer holds just the tensors placed there). The engine's
ModelFile(repack=True) must repack the same tensors into the same layouts, give its buffers the
same sizes (so the same tensors stay in the CPU buffer; llama.cpp's count of those also counts a
tied output head, asked for twice, so the test checks the first it names instead): the bundled
Gemma (Q4_K_M: its Q4_K weights repack) and tiny files of every weight type the build repacks,
LLaMA and qwen3moe (its 3-D experts, read by MUL_MAT_ID, repack too).
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.backend.buffer import ggml_backend_buffer_get_size
from engine.core.types import GGMLType
from engine.models.common import ModelFile
from tests.conformance.test_models import write_tiny_llama
from tests.conformance.test_models_moe_mamba import write_tiny_qwen3moe
from tests.support.llamacpp_run import ask, ask_many

REPACKED = re.compile(r"repack tensor (\S+) with (\S+)")
MOVED = re.compile(r"tensor '(\S+)' \((\w+)\) \(and (\d+) others\) cannot be used with preferred "
                   r"buffer type CPU_REPACK")
SIZE = re.compile(r"(\S+) model buffer size = +([\d.]+) MiB")


def llama_cpp_placement(log: str) -> tuple[dict[str, str], str, dict[str, str]]:
    """From llama.cpp's load log: {tensor: layout} repacked, the first tensor it left in the CPU
    buffer, {buffer type: MiB as printed}."""
    repacked = dict(REPACKED.findall(log))
    moved = MOVED.search(log)
    sizes = dict(SIZE.findall(log))
    return repacked, moved.group(1) if moved else "", sizes


def engine_placement(path: Path, first_left: str, mmap: bool = False) -> tuple[dict[str, str], str, dict[str, str]]:
    """The same from the engine's ModelFile(repack=True), first_left checked to be in CPU."""
    f = ModelFile(path, repack=True, mmap=mmap)
    try:
        placed = f.loaded.placed
        # (a tied head's repacked copy of the table is named as the table: llama.cpp's log too)
        repacked = {(f.loaded.head.name if name == "output.weight" and f.loaded.head else name):
                    why.split(" -> ")[1] for name, (where, why) in placed.items() if where == "CPU_REPACK"}
        sizes = {name: f"{ggml_backend_buffer_get_size(buf) / 1024 / 1024:.2f}"
                 for name, buf in f.loaded.buffers.items()}
        return repacked, first_left if placed[first_left][0] == "CPU" else "", sizes
    finally:
        f.close()


def test_gemma_repacks_what_llama_cpp_repacks(gemma_path):
    for mmap in (False, True):
        theirs = llama_cpp_placement(ask(gemma_path, {"load_log": True}, use_mmap=mmap)["log"])
        assert theirs[0] and theirs[1]  # the log does say it (Q4_K weights: q4_K_8x8)
        assert ("CPU_Mapped" in theirs[2]) == mmap, theirs[2]
        assert engine_placement(gemma_path, theirs[1], mmap) == theirs, mmap


REPACKING_TYPES = [GGMLType.Q4_0, GGMLType.Q4_K, GGMLType.IQ4_NL, GGMLType.MXFP4]


def test_tiny_files_repack_what_llama_cpp_repacks(tmp_path):
    """A tiny LLaMA and a tiny qwen3moe file of each type the AVX2 build repacks (the token
    table, read by GET_ROWS, stays in the CPU buffer; every matrix whose rows come in eights
    repacks, and so does every expert tensor, read by MUL_MAT_ID)."""
    paths = []
    for t in REPACKING_TYPES:
        for arch, write in (("llama", write_tiny_llama), ("qwen3moe", write_tiny_qwen3moe)):
            paths.append(tmp_path / f"{arch}-{t.name}.gguf")
            write(paths[-1], t)
    logs = ask_many([(p, {"load_log": True}) for p in paths], use_mmap=False)
    for path, answer in zip(paths, logs):
        theirs = llama_cpp_placement(answer["log"])
        assert theirs[0] and theirs[1], path.name
        assert path.name.startswith("llama") or any("_exps." in name for name in theirs[0]), path.name
        assert engine_placement(path, theirs[1]) == theirs, path.name
