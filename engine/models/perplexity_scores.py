"""A llama-perplexity run token by token: the terms its printed sums are made of.

llama-perplexity prints sums (the running PPL after each chunk, the final estimate, the KLD
statistics); a learner looking at a text wants the terms. `score_text` runs a model over the
chunks as the tool does (engine/models/perplexity.py: its chunking, BOS in place of each chunk's
first token, the second half scored) and returns, for each scored token, the very -log p its
running sums add, the rank of the true token among the logits, and, when a second model is given
(the tool's --kl-divergence against the first as the base, run here chunk by chunk in lockstep
instead of through a base file), that model's -log p, rank and KLD, beside the lines the tool
prints from the same values.

Which -log p: the tool scores plain perplexity in double (`ppl_nll`) but, while writing a base
file, in float (`base_rows`); with a second model the first one's figures are the latter, as
`llama-perplexity --kl-divergence-base` prints them. Leaves out: several sequences in one batch
(as app/cli_perplexity.py, the chunks run one after another; the figures are the same).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from engine.models.perplexity import (KLD_TABLE_HEAD, Chunking, KLDSums, PerplexityError,
                                      base_rows, kld_chunk_figures, kld_chunk_line, kld_rows,
                                      kld_summary, kld_summary_lines, ppl_estimate, ppl_nll)

KLD_MIN_TOKENS = 100  # the tool prints the KLD statistics from this many scored tokens on


def target_ranks(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Per row, the true token's rank among the logits: 1 + how many are strictly larger."""
    logits = np.asarray(logits, np.float32)
    picked = logits[np.arange(len(targets)), targets]
    return 1 + (logits > picked[:, None]).sum(axis=1)


def running_text(i: int, ppl: float) -> str:
    """The tool's running estimate after chunk i (1-based): `[i]12.3456,`."""
    return f"[{i}]{ppl:.4f},"


def final_estimate_line(ppl: float, unc: float) -> str:
    """The tool's last line of plain perplexity."""
    return f"Final estimate: PPL = {ppl:.4f} +/- {unc:.5f}"


@dataclass
class PPLSums:
    """The plain perplexity's running sums in double, added token after token in order."""

    nll: float = 0.0
    nll2: float = 0.0
    count: int = 0

    def add(self, values: np.ndarray) -> float:
        """Add a chunk's -log p values; the running PPL after them."""
        for x in values.tolist():
            self.nll += x
            self.nll2 += x * x
        self.count += len(values)
        return math.exp(self.nll / self.count)


@dataclass(frozen=True)
class ChunkScores:
    """One chunk's scored tokens (positions first+1 .. n_ctx-1 of the chunk)."""

    index: int  # 0-based
    start: int  # the chunk's first token's index in the text's tokens
    nll: np.ndarray  # -log p(true token) per scored token (double): the first model's
    rank: np.ndarray  # the true token's rank among its logits (1: the most likely)
    top: np.ndarray  # the most likely token (the first of equal largest logits)
    running: str  # the running estimate printed after the chunk ("[1]12.3456,")
    nll_q: np.ndarray | None = None  # the second model's -log p (float, as double)
    rank_q: np.ndarray | None = None
    kld: np.ndarray | None = None  # KL divergence of the second model from the first, per token
    kld_line: str | None = None  # the tool's table row after this chunk

    @property
    def p(self) -> np.ndarray:
        """The probability the first model gave each true token, exp(-nll)."""
        return _exp(-self.nll)

    @property
    def p_q(self) -> np.ndarray | None:
        return None if self.nll_q is None else _exp(-self.nll_q)


@dataclass
class PerplexityRun:
    """A text scored: its tokens, the chunks, each scored token's figures and the tool's lines."""

    tokens: list[int]  # the text's tokens (BOS first when the model adds one)
    pieces: list[str]  # each token's text
    chunking: Chunking
    n_chunk_max: int  # the chunks the text holds (before any --chunks limit)
    bos: int | None  # the token each chunk's first is replaced by (None: kept)
    chunks: list[ChunkScores] = field(default_factory=list)
    final: str | None = None  # "Final estimate: PPL = ..." (None where the tool prints none)
    ppl: tuple[float, float | None] | None = None  # the estimate and its error
    kld_head: str | None = None
    kld_summary: list[str] | None = None  # the closing statistics (None below 100 tokens)
    top_pieces: dict[int, str] = field(default_factory=dict)  # the most likely tokens' texts

    @property
    def first(self) -> int:
        return self.chunking.first

    def scored_nll(self) -> np.ndarray:
        """Every scored token's -log p in the order the sums add them."""
        return np.concatenate([c.nll for c in self.chunks]) if self.chunks else np.zeros(0)


def model_bos(model) -> int | None:
    """The BOS id a chunk starts with when the vocabulary adds one (else None)."""
    tok = getattr(model, "tokenizer", None)
    return tok.bos_id if tok is not None and getattr(tok, "add_bos", False) else None


def _scored_logits(model, ids: list[int], first: int) -> np.ndarray:
    """One chunk from an empty cache (llama_memory_clear): the logits of first .. n_ctx-2."""
    model.reset()
    return model.decode(ids).logits[first:len(ids) - 1]


def score_text(model, tokens: list[int], chunking: Chunking, n_chunk_max: int, second=None,
               on_chunk: Callable[[int], None] | None = None) -> PerplexityRun:
    """Score the chunks of `tokens` (the first model's encoding of the text) with `model`, and
    with `second` against it as the base when given; on_chunk(i) after each chunk (0-based).
    The models are the caller's (opened with the tool's context for chunking.n_ctx; closed by
    the caller)."""
    if second is not None and second.hp.n_vocab != model.hp.n_vocab:
        raise PerplexityError(f"inconsistent vocabulary ({model.hp.n_vocab} vs "
                              f"{second.hp.n_vocab})")
    c = chunking
    tokenizer = model.tokenizer
    bos = model_bos(model)
    run = PerplexityRun(list(tokens), [tokenizer.piece_text(t) for t in tokens], c, n_chunk_max,
                        bos)
    bos_q = model_bos(second) if second is not None else None
    sums, kld = PPLSums(), KLDSums()
    for i in range(c.n_chunk):
        targets = c.targets(tokens, i)
        logits = _scored_logits(model, c.chunk(tokens, i, bos), c.first)
        rank, top = target_ranks(logits, targets), logits.argmax(axis=1)
        extra: dict = {}
        if second is None:
            nll = ppl_nll(logits, targets)
        else:
            nll, rows = base_rows(logits, targets)
            del logits
            logits_q = _scored_logits(second, c.chunk(tokens, i, bos_q), c.first)
            n0 = kld.count
            kld_rows(logits_q, rows, targets, kld)
            extra = {"nll_q": np.asarray(kld.nll_values[n0:], np.float64),
                     "rank_q": target_ranks(logits_q, targets),
                     "kld": np.asarray(kld.kld_values[n0:], np.float64),
                     "kld_line": kld_chunk_line(i + 1, kld_chunk_figures(kld))}
            del logits_q, rows
        run.chunks.append(ChunkScores(i, i * c.n_ctx, nll, rank, top,
                                      running_text(i + 1, sums.add(nll)), **extra))
        if on_chunk is not None:
            on_chunk(i)
    run.top_pieces = {t: tokenizer.piece_text(t) for ch in run.chunks for t in set(ch.top.tolist())}
    ppl, unc = ppl_estimate(sums.nll, sums.nll2, sums.count)
    run.ppl = (ppl, unc)
    run.final = final_estimate_line(ppl, unc) if unc is not None else None
    if second is not None:
        run.kld_head = KLD_TABLE_HEAD
        if kld.count >= KLD_MIN_TOKENS:
            run.kld_summary = kld_summary_lines(kld_summary(kld))
    return run


def _exp(x: np.ndarray) -> np.ndarray:
    """exp by the C library, value by value (numpy's picks a SIMD path by CPU)."""
    x = np.asarray(x, np.float64)
    return np.fromiter(map(math.exp, x.ravel().tolist()), np.float64, x.size).reshape(x.shape)
