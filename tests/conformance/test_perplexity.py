"""`ggml-lens perplexity` against llama.cpp's llama-perplexity, on the bundled Gemma 3 270M.

Both tools score the same short text (2 chunks of 128 tokens, batches of 128, 2 threads,
llama.cpp's default path: repacked weights, flash attention auto) and every figure they print is
compared as text: the running PPL after each chunk and the final estimate with its error, plainly
and while writing the base logits file (whose files must be the same bytes); then the KL
divergence of a Q4_0 requantization (made by `ggml-lens quantize`) from that base: the table of
chunks and every closing statistic, each tool reading the other's base file. The oracle is the
binary run here (tests/support/llamacpp_tools.py), never a stored number.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from app.cli import main
from tests.support.llamacpp_tools import run_tool

# an original text of ~600 Gemma tokens (the tool needs 2 chunks at least)
TEXT = """\
The small library called ggml grew out of an effort to run large language models on ordinary \
computers. Its author wanted a tensor library that had no dependencies, that allocated its memory \
once at the start, and that could be read from top to bottom in an afternoon. A model in ggml is a \
graph: each node is an operation such as a matrix multiplication, a normalization or a softmax, \
and each leaf is a tensor of weights or inputs. The graph is built first and computed later, on as \
many threads as the machine offers.
Quantization is what made the library famous. Instead of storing each weight as a sixteen-bit or \
thirty-two-bit float, ggml packs blocks of weights into a few bits each, with a scale per block. A \
block of thirty-two weights in the Q4_0 format takes eighteen bytes: two for the scale and sixteen \
for the four-bit values. The arithmetic that multiplies such blocks with activations is written \
carefully for each processor family, so that the model runs fast without leaving the main memory.
Perplexity measures how surprised a model is by a text. For every token, the model predicts a \
distribution over the vocabulary; the probability it gave to the token that actually came next is \
recorded, and the average of the negative logarithms of those probabilities is exponentiated. A \
perplexity of ten means the model was, on average, as uncertain as if it had to choose among ten \
equally likely tokens. Lower is better, and comparing the perplexity of a quantized model with \
that of the original tells how much the compression cost.
The Kullback-Leibler divergence goes further. It compares the whole distribution of the quantized \
model with the distribution of the original model at every position, not just the probability of \
the right token. When the two agree, the divergence is zero; when the quantized model spreads its \
probability differently, the divergence grows.
"""
RUN = ("-c", "128", "-b", "128", "-t", "2")
CHUNKS = ("--chunks", "2")
FINAL = re.compile(r"Final estimate: PPL = \S+ \+/- \S+")
RUNNING = re.compile(r"\[\d+\]\d+\.\d{4},")


def ppl_figures(text: str) -> list[str]:
    """The running estimates and the final line, as printed."""
    return RUNNING.findall(text) + FINAL.findall(text)


def kld_lines(stdout: str) -> list[str]:
    """The KLD table (from its head) and the statistics, without blank lines."""
    lines = [ln.rstrip() for ln in stdout.splitlines()]
    head = next(i for i, ln in enumerate(lines) if ln.startswith("chunk "))
    return [ln for ln in lines[head:] if ln]


def ours(*argv) -> str:
    """What `ggml-lens perplexity ARGV` prints on its standard output (run in this process)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["perplexity", *map(str, argv)]) == 0
    return out.getvalue()


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "text.txt"
    path.write_text(TEXT)
    return path


@pytest.fixture(scope="module")
def base_files(tmp_path_factory, gemma_path, text):
    """Each tool's base logits file of the Gemma and what each printed writing it."""
    tmp = tmp_path_factory.mktemp("base")
    theirs, mine = tmp / "llama.bin", tmp / "ggml-lens.bin"
    done = run_tool("llama-perplexity", "-m", gemma_path, "-f", text, *RUN, *CHUNKS,
                    "--kl-divergence-base", theirs)
    printed = ours(gemma_path, "-f", text, *RUN, *CHUNKS, "--kl-divergence-base", mine)
    return theirs, done.stdout + done.stderr, mine, printed


def test_perplexity_prints_llama_perplexitys_figures(gemma_path, text):
    done = run_tool("llama-perplexity", "-m", gemma_path, "-f", text, *RUN, *CHUNKS)
    theirs = ppl_figures(done.stdout + done.stderr)
    assert len(theirs) == 3, done.stdout + done.stderr
    assert ppl_figures(ours(gemma_path, "-f", text, *RUN, *CHUNKS)) == theirs


def test_base_logits_file_is_llama_perplexitys_bytes(base_files):
    """Writing the base file the tool scores in float: the same figures, the same bytes."""
    theirs, their_print, mine, my_print = base_files
    assert len(ppl_figures(their_print)) == 3, their_print
    assert ppl_figures(my_print) == ppl_figures(their_print)
    assert mine.stat().st_size == theirs.stat().st_size
    assert mine.read_bytes() == theirs.read_bytes()


def test_kl_divergence_prints_llama_perplexitys_statistics(gemma_path, base_files, tmp_path):
    theirs, _, mine, _ = base_files
    q4_0 = tmp_path / "q4_0.gguf"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["quantize", "--allow-requantize", str(gemma_path), str(q4_0), "Q4_0",
                     "2"]) == 0
    expected = kld_lines(run_tool("llama-perplexity", "-m", q4_0, *RUN, "--kl-divergence",
                                  "--kl-divergence-base", theirs).stdout)
    assert len(expected) == 2 + 1 + 7 + 13 + 17, expected  # table, the three statistics blocks
    assert expected[-1].startswith("Same top p:")
    # ggml-lens reading llama-perplexity's base file
    assert kld_lines(ours(q4_0, *RUN, "--kl-divergence", "--kl-divergence-base", theirs)) == \
        expected
    # llama-perplexity reading the file ggml-lens wrote
    assert kld_lines(run_tool("llama-perplexity", "-m", q4_0, *RUN, "--kl-divergence",
                              "--kl-divergence-base", mine).stdout) == expected
