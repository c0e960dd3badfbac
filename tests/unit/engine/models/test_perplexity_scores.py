"""engine/models/perplexity_scores.py against numpy: which logits row scores which token, each
scored token's -log p, rank and KLD, on a stand-in model whose logits depend on the whole prefix
(so a chunk run from the wrong start, or a row paired with the wrong token, gives other numbers).
The figures as llama-perplexity prints them are tested end to end against the tool
(tests/conformance/test_perplexity.py) and against the page (tests/api/routes/test_perplexity_page.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np

from engine.models.perplexity import split_chunks
from engine.models.perplexity_scores import score_text, target_ranks

N_VOCAB = 50
BOS = 1


class Prefixed:
    """A model whose logits at a position are a function of every token up to it."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.hp = SimpleNamespace(n_vocab=N_VOCAB)
        self.tokenizer = SimpleNamespace(bos_id=BOS, add_bos=True, piece_text=lambda t: f"<{t}>")
        self.cached: list[int] = []

    def reset(self) -> None:
        self.cached = []

    def decode(self, ids):
        self.cached += list(ids)
        rows = [np.random.default_rng([self.seed, *self.cached[:i + 1]]).standard_normal(N_VOCAB)
                * 3 for i in range(len(self.cached))]
        return SimpleNamespace(logits=np.asarray(rows, np.float32))


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = row.astype(np.float64)
    return row - row.max() - math.log(np.exp(row - row.max()).sum())


def tokens() -> list[int]:
    t = np.random.default_rng(7).integers(2, N_VOCAB, 300).tolist()
    return [BOS] + t[1:]


def expected(model: Prefixed, toks: list[int], n_ctx: int, i: int):
    """Chunk i by hand: (log-probabilities of its rows, the tokens they score)."""
    ids = [BOS] + toks[i * n_ctx + 1:(i + 1) * n_ctx]
    model.reset()
    logits = model.decode(ids).logits
    first = n_ctx // 2
    return [log_softmax(logits[j - 1]) for j in range(first + 1, n_ctx)], ids[first + 1:]


def test_each_scored_token_is_the_one_its_row_predicts():
    toks, model = tokens(), Prefixed(0)
    c = split_chunks(len(toks), 64)
    run = score_text(model, toks, c, c.n_chunk)
    assert c.n_chunk == 4 and len(run.chunks) == 4 and run.pieces[:2] == ["<1>", f"<{toks[1]}>"]
    for i, ch in enumerate(run.chunks):
        rows, targets = expected(Prefixed(0), toks, 64, i)
        assert len(ch.nll) == len(targets) == 31
        np.testing.assert_allclose(ch.nll, [-r[t] for r, t in zip(rows, targets)], rtol=1e-6)
        ranks = [int(np.flatnonzero(np.argsort(-r, kind="stable") == t)[0]) + 1
                 for r, t in zip(rows, targets)]
        assert ch.rank.tolist() == ranks
        assert ch.top.tolist() == [int(np.argmax(r)) for r in rows]
        assert all(run.top_pieces[t] == f"<{t}>" for t in ch.top.tolist())
        np.testing.assert_allclose(ch.p, np.exp(-ch.nll))
    ppl = math.exp(run.scored_nll().mean())
    assert run.final.startswith(f"Final estimate: PPL = {ppl:.4f} +/- ")
    assert [ch.running for ch in run.chunks][-1] == f"[4]{ppl:.4f},"


def test_a_second_models_kld_is_the_divergence_of_its_distribution_from_the_firsts():
    toks = tokens()
    c = split_chunks(len(toks), 64, 3)
    run = score_text(Prefixed(0), toks, c, 4, second=Prefixed(1))
    for i, ch in enumerate(run.chunks):
        base, targets = expected(Prefixed(0), toks, 64, i)
        q, _ = expected(Prefixed(1), toks, 64, i)
        kld = [float((np.exp(b) * (b - r)).sum()) for b, r in zip(base, q)]
        # the base's log-probabilities are kept in 16 bits over 16 nats, as in the tool's file
        np.testing.assert_allclose(ch.kld, kld, atol=2e-3)
        np.testing.assert_allclose(ch.nll_q, [-r[t] for r, t in zip(q, targets)], rtol=1e-5)
        np.testing.assert_allclose(ch.nll, [-r[t] for r, t in zip(base, targets)], rtol=1e-5)
        assert ch.rank_q.tolist() == target_ranks(np.exp(q), np.asarray(targets)).tolist()
        assert ch.kld_line.startswith(f"{i + 1:4d}    ")
    assert run.kld_summary is None  # 3 x 31 tokens: the tool prints statistics from 100 on
    run = score_text(Prefixed(0), toks, split_chunks(len(toks), 64), 4, second=Prefixed(1))
    mean = float(np.mean(np.concatenate([ch.kld for ch in run.chunks])))
    assert f"Mean    KLD: {mean:10.6f} ± " in "\n".join(run.kld_summary)


def test_a_rank_counts_the_logits_strictly_above():
    logits = np.array([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 1.0, 1.0]], np.float32)
    assert target_ranks(logits, np.array([0, 2])).tolist() == [3, 2]
    assert target_ranks(logits, np.array([1, 0])).tolist() == [1, 1]
