"""`ggml-lens quantize` against llama-quantize: the same file, byte for byte.

Oracle: llama.cpp's llama-quantize, built at set-up from the llama.cpp that llama-cpp-python 0.3.36
vendors (tests/support/llamacpp_tools.py). Each case quantizes one input with both and compares
the files' sha256; on a difference the message names the first key, tensor info or tensor whose
bytes differ. Inputs: tiny files written by the project's writers (llama, qwen2, qwen3, qwen3moe,
mamba, gemma2, phi3; F32, F16, BF16 and quantized weights), files written here to reach the rules
only large or unusual models reach (80 layers of a 70B llama, falcon, 8 experts, rows that do not
fill whole blocks), and the bundled Gemma 3 270M (Q4_K_M) requantized. Where llama-quantize refuses
(a type that needs an importance matrix, requantizing without --allow-requantize), the engine
refuses in the same words and writes nothing. `make test` runs a representative set;
GGML_LENS_SWEEP=all every file type on every input and the Gemma to several types.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pytest

from app.cli import main as cli
from engine.core.types import GGMLType
from engine.gguf.reader import GGUFReader
from engine.quants.ftype import QUANT_OPTIONS
from tests.conformance.test_models import write_tiny_llama
from tests.conformance.test_models_gemma2_phi3 import write_gemma2, write_phi3
from tests.conformance.test_models_moe_mamba import write_tiny_mamba, write_tiny_qwen3moe
from tests.support.llamacpp_tools import run_tool
from tests.support.tiny_models import TinyFile

pytestmark = pytest.mark.llamacpp
ALL = os.environ.get("GGML_LENS_SWEEP") == "all"
GEMMA = Path(__file__).resolve().parents[2] / "var" / "models" / "gemma-3-270m-q4_k_m.gguf"


# --- inputs llama.cpp's big models would give: written here -----------------------------------

def write_rules_model(path: Path, arch: str, n_layer: int, n_head: int, n_head_kv: int,
                      n_expert: int = 0, ncols: int = 256, qkv: bool = False) -> None:
    """A model of `n_layer` tiny layers (8 rows a weight): enough for llama-quantize, which reads
    only the hyperparameters and the tensors' names and shapes, to take the rules of a big model
    (a 70B llama's 80 layers, falcon's, 8 experts'); `ncols` that no 256-block fills take the
    fallbacks."""
    with TinyFile(path, arch, GGMLType.F32, seed=n_layer) as f:
        f.decoder_keys(128, ncols, n_layer, 64, n_head, n_head_kv, 64)
        f.w.add_layer_norm_eps(1e-5)
        if n_expert:
            f.w.add_expert_count(n_expert)
            f.w.add_expert_used_count(2)
            f.w.add_expert_feed_forward_length(16)
        f.mat("token_embd.weight", ncols, 64)
        for i in range(n_layer):
            b = f"blk.{i}."
            f.vec(b + "attn_norm.weight", ncols)
            if qkv:
                f.mat(b + "attn_qkv.weight", ncols, 8)
            else:
                for name in ("attn_q", "attn_k", "attn_v"):
                    f.mat(f"{b}{name}.weight", ncols, 8)
            f.mat(b + "attn_output.weight", ncols, 8)
            if n_expert:
                f.mat(b + "ffn_gate_inp.weight", ncols, n_expert)
                for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
                    f.mat(f"{b}{name}.weight", ncols, 4, n_expert)
            else:
                for name in ("ffn_gate", "ffn_up", "ffn_down"):
                    f.mat(f"{b}{name}.weight", ncols, 8)
        f.vec("output_norm.weight", ncols)
        f.mat("output.weight", ncols, 64)


def write_aligned_64(path: Path) -> None:
    """A file whose general.alignment is 64: llama-quantize copies the key but pads to 32 (its
    output context keeps gguf_init_empty's alignment), a file no reader takes; so does the engine."""
    with TinyFile(path, "llama", GGMLType.F32, seed=6) as f:
        f.decoder_keys(128, 256, 1, 64, 4, 2, 64)
        f.w.add_custom_alignment(64)
        f.mat("token_embd.weight", 256, 64)
        f.vec("blk.0.attn_norm.weight", 256)
        f.mat("blk.0.attn_q.weight", 256, 8)
        f.vec("output_norm.weight", 250)


INPUTS = {
    "llama-f32": lambda p: write_tiny_llama(p, GGMLType.F32),
    "llama-f16": lambda p: write_tiny_llama(p, GGMLType.F16, seed=1),
    "llama-bf16": lambda p: write_tiny_llama(p, GGMLType.BF16, seed=2),
    "llama-q4_k": lambda p: write_tiny_llama(p, GGMLType.Q4_K, seed=3),
    "llama-q6_k": lambda p: write_tiny_llama(p, GGMLType.Q6_K, seed=4),
    "llama-iq4_nl": lambda p: write_tiny_llama(p, GGMLType.IQ4_NL, seed=5),
    "qwen2-f32": lambda p: write_tiny_llama(p, GGMLType.F32, arch="qwen2"),
    "qwen3-f16": lambda p: write_tiny_llama(p, GGMLType.F16, arch="qwen3"),
    "qwen3moe-f32": lambda p: write_tiny_qwen3moe(p, GGMLType.F32),
    "mamba-f32": lambda p: write_tiny_mamba(p, GGMLType.F32),
    "gemma2-f32": lambda p: write_gemma2(p, GGMLType.F32, 0),
    "phi3-f32": lambda p: write_phi3(p, GGMLType.F32, 0),
    "llama70b": lambda p: write_rules_model(p, "llama", 80, 8, 1),
    "falcon": lambda p: write_rules_model(p, "falcon", 16, 4, 1, qkv=True),
    "experts8": lambda p: write_rules_model(p, "qwen3moe", 4, 4, 4, n_expert=8),
    "rows96": lambda p: write_rules_model(p, "llama", 4, 4, 2, ncols=96),
    "rows48": lambda p: write_rules_model(p, "llama", 2, 4, 2, ncols=48),
    "align64": write_aligned_64,
}
INPUTS["gemma3-270m"] = None  # the bundled model, not written


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Each input file, written once (by name, on first use)."""
    tmp = tmp_path_factory.mktemp("quantize-in")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name == "gemma3-270m":
            return GEMMA
        if name not in made:
            made[name] = tmp / f"{name}.gguf"
            INPUTS[name](made[name])
        return made[name]
    return get


# --- the comparison ----------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def first_difference(ours: Path, theirs: Path) -> str:
    """What differs first between two GGUF files: a key, a tensor info, a tensor's bytes."""
    try:
        return _first_difference(ours, theirs)
    except ValueError as e:  # a file the reader refuses: say where the bytes part
        a, b = ours.read_bytes(), theirs.read_bytes()
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        return f"byte {at} differs ({len(a)} and {len(b)} bytes; the reader says: {e})"


def _first_difference(ours: Path, theirs: Path) -> str:
    with GGUFReader(ours) as a, GGUFReader(theirs) as b:
        for i, (x, y) in enumerate(zip(a.kvs, b.kvs)):
            same_value = (np.array_equal(np.asarray(x.value), np.asarray(y.value))
                          if x.n > 1 or x.type != y.type else x.value == y.value)
            if (x.key, x.type, x.arr_type, x.n) != (y.key, y.type, y.arr_type, y.n) or not same_value:
                return f"key {i}: ours {x.key} = {str(x.value)[:60]}, llama's {y.key} = {str(y.value)[:60]}"
        if len(a.kvs) != len(b.kvs):
            return f"{len(a.kvs)} keys, llama-quantize wrote {len(b.kvs)}"
        for x, y in zip(a.tensors, b.tensors):
            if (x.name, x.type, x.ne, x.n_dims, x.offset) != (y.name, y.type, y.ne, y.n_dims, y.offset):
                return (f"tensor info {x.index}: ours {x.name} {x.type.name} {x.ne} at {x.offset}, "
                        f"llama's {y.name} {y.type.name} {y.ne} at {y.offset}")
        if len(a.tensors) != len(b.tensors):
            return f"{len(a.tensors)} tensors, llama-quantize wrote {len(b.tensors)}"
        for x, y in zip(a.tensors, b.tensors):
            bx, by = a.tensor_bytes(x), b.tensor_bytes(y)
            if not np.array_equal(bx, by):
                at = int(np.argmax(bx != by))
                return (f"tensor {x.name} ({x.type.name}): byte {at} of {x.nbytes} "
                        f"(row {at // x.nb[1]}) differs")
    return "the padding or the file's length differs"


def quantize_both(tmp: Path, src: Path, ftype: str, *options: str):
    """Run llama-quantize and `ggml-lens quantize` on the same input: (ours, theirs, llama's run,
    our exit code, what we printed)."""
    tag = "-".join([ftype, *(o.strip("-") for o in options)]).replace("/", "_")
    theirs, ours = tmp / f"llama-{tag}.gguf", tmp / f"ours-{tag}.gguf"
    done = run_tool("llama-quantize", *options, src, theirs, ftype, "2", check=False)
    with contextlib.redirect_stderr(io.StringIO()) as printed:
        code = cli(["quantize", *options, str(src), str(ours), ftype, "2"])
    return ours, theirs, done, code, printed.getvalue()


REFUSED = "llama_model_quantize: failed to quantize: "


def assert_same_file(tmp: Path, src: Path, ftype: str, *options: str) -> None:
    """The same file; or, where llama-quantize refuses before writing (a row no block of Q1_0
    fills has no fallback), the same refusal and no file."""
    ours, theirs, done, code, printed = quantize_both(tmp, src, ftype, *options)
    refusal = next((line for line in done.stderr.splitlines() if REFUSED in line), None)
    if done.returncode != 0 and refusal and not theirs.exists():
        assert code == 1 and refusal[refusal.index(REFUSED):] in printed, printed[-2000:]
        assert not ours.exists()
        return
    assert done.returncode == 0, f"llama-quantize failed:\n{done.stderr[-2000:]}"
    assert code == 0, printed[-2000:]
    if sha256(ours) != sha256(theirs):
        pytest.fail(f"{src.name} -> {ftype} {' '.join(options)}: {first_difference(ours, theirs)}")


# --- the cases ---------------------------------------------------------------------------------

CASES = [  # (input, file type, options)
    ("llama-f32", "Q4_0", ()), ("llama-f32", "Q8_0", ()), ("llama-f32", "Q4_K_M", ()),
    ("llama-f32", "Q2_K", ()), ("llama-f32", "Q3_K_M", ()), ("llama-f32", "Q5_K_S", ()),
    ("llama-f32", "Q6_K", ()), ("llama-f32", "TQ2_0", ()), ("llama-f32", "TQ1_0", ()),
    ("llama-f32", "MXFP4_MOE", ()), ("llama-f32", "F16", ()), ("llama-f32", "BF16", ()),
    ("llama-f32", "COPY", ()), ("llama-f32", "Q1_0", ()), ("llama-f32", "q5_1", ()),
    ("llama-f32", "7", ()),  # a file type by its number (Q8_0)
    ("llama-f16", "Q4_K_S", ()), ("llama-f16", "Q5_1", ()), ("llama-f16", "F32", ()),
    ("llama-bf16", "Q4_1", ()), ("llama-bf16", "Q3_K_L", ()),
    ("llama-q4_k", "Q4_0", ("--allow-requantize",)),
    ("llama-q6_k", "Q8_0", ("--allow-requantize",)),
    ("llama-iq4_nl", "Q5_K_M", ("--allow-requantize",)),
    ("llama-f32", "Q3_K_M", ("--pure",)),
    ("llama-f32", "Q4_0", ("--leave-output-tensor",)),
    ("llama-f32", "Q5_0", ("--output-tensor-type", "q8_0", "--token-embedding-type", "q4_0")),
    ("llama-f32", "F16", ("--token-embedding-type", "q6_k")),
    ("qwen2-f32", "Q8_0", ()), ("qwen3-f16", "Q3_K_S", ()),
    ("qwen3moe-f32", "Q4_K_M", ()), ("qwen3moe-f32", "MXFP4_MOE", ()),
    ("mamba-f32", "Q5_1", ()), ("gemma2-f32", "Q5_0", ()),
    ("gemma2-f32", "Q2_K", ("--output-tensor-type", "q5_k")),
    ("phi3-f32", "Q4_K_M", ()), ("phi3-f32", "Q3_K_M", ()),
    ("llama70b", "Q4_K_M", ()), ("llama70b", "Q2_K", ()), ("llama70b", "Q3_K_M", ()),
    ("falcon", "Q3_K_M", ()), ("falcon", "Q4_K_M", ()), ("falcon", "Q3_K_L", ()),
    ("experts8", "Q4_K_M", ()), ("experts8", "IQ4_XS", ()),
    ("rows96", "Q4_K_M", ()), ("rows96", "IQ4_XS", ()), ("rows48", "Q4_K_M", ()),
    ("rows48", "Q5_0", ()), ("align64", "Q4_0", ()), ("rows96", "Q1_0", ()),
    ("gemma3-270m", "Q4_0", ("--allow-requantize",)),
]
# the types llama-quantize writes without an importance matrix on some input (the others are
# refused, see test_a_type_that_needs_an_importance_matrix_is_refused_alike)
SWEEP_TYPES = [o.name for o in QUANT_OPTIONS if o.name not in
               ("Q2_0", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS",
                "IQ3_XS", "Q2_K_S")]
if ALL:
    CASES += [(src, t, ("--allow-requantize",)) for src in INPUTS if src != "gemma3-270m"
              for t in SWEEP_TYPES]
    CASES += [("gemma3-270m", t, ("--allow-requantize",))
              for t in ("Q8_0", "Q4_K_M", "Q2_K", "Q5_K_M", "Q6_K", "IQ4_NL", "F16")]


@pytest.mark.parametrize("src,ftype,options", CASES,
                         ids=[f"{s}-{t}{''.join(o[:1])}" for s, t, o in CASES])
def test_quantize_writes_llama_quantizes_file(inputs, tmp_path, src, ftype, options):
    assert_same_file(tmp_path, inputs(src), ftype, *options)


@pytest.mark.parametrize("src,ftype", [("llama-f32", "Q2_K_S"), ("llama-f32", "IQ3_XS"),
                                       ("llama-f32", "IQ2_M"), ("qwen3moe-f32", "IQ1_S"),
                                       ("llama-f16", "IQ3_XXS")])
def test_a_type_that_needs_an_importance_matrix_is_refused_alike(inputs, tmp_path, src, ftype):
    ours, theirs, done, code, printed = quantize_both(tmp_path, inputs(src), ftype)
    words = "this quantization requires an importance matrix!"
    assert done.returncode != 0 and words in done.stderr
    assert code == 1 and words in printed
    assert not ours.exists() and not theirs.exists()


def test_requantizing_needs_allow_requantize_alike(inputs, tmp_path):
    ours, theirs, done, code, printed = quantize_both(tmp_path, inputs("llama-q4_k"), "Q4_0")
    words = "requantizing from type q4_K is disabled"
    assert done.returncode != 0 and words in done.stderr
    assert code == 1 and words in printed
    assert not ours.exists()  # (llama-quantize leaves the file it had begun)


def test_each_tensor_says_which_rule_chose_its_type(inputs, tmp_path, capsys):
    """The per-tensor lines: llama-quantize's, then why (the Q4_K_M mix's Q6_K tensors)."""
    assert cli(["quantize", str(inputs("llama70b")), str(tmp_path / "o.gguf"), "Q4_K_M"]) == 0
    err = capsys.readouterr().err
    assert "[   1/" in err and "converting to q6_K .. size =" in err
    assert "why: the output head gets Q6_K" in err
    assert "why: attention values 0 of 80: use_more_bits" in err
    assert "why: kept: a 1-D tensor" in err


def log_lines(text: str) -> list[str]:
    """llama-quantize's per-tensor lines, fallback warnings and sizes, as both tools print them."""
    return [line for line in text.splitlines()
            if line.startswith(("[", "warning: ", "llama_model_quantize_impl: "))]


@pytest.mark.parametrize("dry_run", [False, True], ids=["write", "dry-run"])
def test_the_log_is_llama_quantizes(inputs, tmp_path, capsys, dry_run):
    """Tensor by tensor, the lines llama-quantize prints (sizes, conversions, fallback warnings;
    --dry-run: the sizes it would write, and no file)."""
    src, opts = inputs("rows96"), ["--dry-run"] if dry_run else []
    done = run_tool("llama-quantize", *opts, src, tmp_path / "theirs.gguf", "Q4_K_M")
    assert cli(["quantize", *opts, str(src), str(tmp_path / "ours.gguf"), "Q4_K_M"]) == 0
    ours = log_lines(capsys.readouterr().err)
    assert len(ours) > 40 and any(line.startswith("warning: ") for line in ours)
    assert ours == log_lines(done.stderr)
    assert (tmp_path / "ours.gguf").exists() != dry_run


IMATRIX_TYPES = ("IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ1_S", "IQ1_M", "IQ3_XXS", "IQ3_XS",
                 "Q2_K_S")
DRY = [(src, t) for src in ("llama-f32", "llama70b", "experts8", "falcon") for t in IMATRIX_TYPES]
if ALL:
    DRY = [(src, o.name) for src in INPUTS for o in QUANT_OPTIONS if o.name != "Q2_0"]


@pytest.mark.parametrize("src,ftype", DRY, ids=["-".join(c) for c in DRY])
def test_dry_run_chooses_llama_quantizes_types(inputs, tmp_path, capsys, src, ftype):
    """--dry-run prints each tensor's type without writing it, and llama-quantize does so even
    for the mixes it writes only with an importance matrix: their rules are compared here."""
    done = run_tool("llama-quantize", "--dry-run", "--allow-requantize", inputs(src), ftype,
                    check=False)
    code = cli(["quantize", "--dry-run", "--allow-requantize", str(inputs(src)), ftype])
    printed = capsys.readouterr().err
    assert code == done.returncode, printed[-2000:]  # 1: both refused (Q1_0 has no fallback)
    assert log_lines(printed) == log_lines(done.stderr)
    if code:
        assert done.stderr.splitlines()[-2] in printed  # "...: failed to quantize: <why>"


def test_the_file_types_are_llama_quantizes_list():
    """QUANT_OPTIONS is the list llama-quantize prints: names, numbers, descriptions, order."""
    done = run_tool("llama-quantize", "--help", check=False)
    listed = []
    for line in done.stdout.splitlines():
        head, sep, desc = line.partition(" : ")
        words = head.split()
        if sep and words and words[-1].isupper():  # "  15  or  Q4_K_M  : ...", "  COPY  : ..."
            number = int(words[0]) if words[0].isdigit() else None
            listed.append((words[-1], number, desc))
    ours = [(o.name, None if o.name == "COPY" else int(o.ftype), o.desc) for o in QUANT_OPTIONS]
    assert len(listed) > 30 and listed == ours
