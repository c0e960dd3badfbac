"""llama.cpp's sampler chain: from one position's logits to the next token.

The chain is llama.cpp's (src/llama-sampler.cpp), in the order its common sampler and
llama-cpp-python apply it: top-k, top-p, min-p, temperature, then `dist`, which draws from what is
left with a Mersenne Twister seeded like llama.cpp's (std::mt19937(seed)), so a seed gives the very
tokens llama.cpp gives. Each stage works on a candidate list (token ids with their logits) that
may be sorted by logit, descending, as llama.cpp's `llama_token_data_array` is; the float arithmetic
is llama.cpp's: float32 softmax terms through the C library's expf, summed in order, the draw's
running sum in double. With temperature 0 the chain is greedy: the first most likely token.

Leaves out: repetition penalties, typical-p, mirostat, DRY, XTC, grammars.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine import libm
from engine.core.cxxrandom import Mt19937

F32 = np.float32


@dataclass(frozen=True, slots=True)
class SamplerParams:
    """llama.cpp's defaults (common_params_sampling and llama-cpp-python's Llama.sample)."""

    temp: float = 0.8  # 0: greedy
    top_k: int = 40  # <= 0: off
    top_p: float = 0.95  # >= 1: off
    min_p: float = 0.05  # <= 0: off
    seed: int = 0xFFFFFFFF  # LLAMA_DEFAULT_SEED: a fresh seed each time

    @property
    def greedy(self) -> bool:
        return self.temp == 0


@dataclass(slots=True)
class Candidates:
    """llama_token_data_array: ids and logits, `sorted` when ordered by logit, descending."""

    ids: np.ndarray  # int32
    logits: np.ndarray  # float32
    sorted: bool = False

    def sort(self, k: int | None = None) -> None:
        """The k largest first (all when k is None), the list cut to them. (llama.cpp's partial
        sort leaves the order of equal logits unspecified; here equal logits keep id order.)"""
        if k is not None and k < self.logits.size:  # only the k largest (and their ties) sorted
            kth = np.partition(self.logits, self.logits.size - k)[self.logits.size - k]
            pool = np.flatnonzero(self.logits >= kth)
            order = pool[np.argsort(-self.logits[pool], kind="stable")[:k]]
        else:
            order = np.argsort(-self.logits, kind="stable")
        self.ids, self.logits, self.sorted = self.ids[order], self.logits[order], True

    def keep(self, n: int) -> None:
        self.ids, self.logits = self.ids[:n], self.logits[:n]


def _max_logit(c: Candidates) -> np.float32:
    return c.logits[0] if c.sorted else c.logits.max()


def softmax(c: Candidates) -> np.ndarray:
    """llama_sampler_softmax_impl without sorting: expf(l - max) / their float32 running sum."""
    p = libm.expf(c.logits - _max_logit(c))
    return p / np.cumsum(p, dtype=F32)[-1]


def top_k(c: Candidates, k: int) -> None:
    if k <= 0:
        return
    k = min(k, c.ids.size)
    if not c.sorted:
        c.sort(k)
    c.keep(k)


def top_p(c: Candidates, p: float, min_keep: int = 1) -> None:
    """Keep the most likely tokens until their probabilities sum to at least p."""
    if p >= 1.0:
        return
    probs = softmax(c)
    if not c.sorted:
        order = np.argsort(-c.logits, kind="stable")
        c.ids, c.logits, probs, c.sorted = c.ids[order], c.logits[order], probs[order], True
    cum = np.cumsum(probs, dtype=F32)
    reached = np.nonzero((cum >= F32(p)) & (np.arange(1, cum.size + 1) >= min_keep))[0]
    c.keep(int(reached[0]) + 1 if reached.size else c.ids.size)


def min_p(c: Candidates, p: float, min_keep: int = 1) -> None:
    """Keep the tokens whose probability is at least p times the most likely one's."""
    if p <= 0.0 or c.ids.size == 0:
        return
    if not c.sorted:  # llama.cpp's unsorted pass: filter in place, order kept
        floor = _max_logit(c) + libm.scalar(libm.logf, p)
        keep = c.logits >= floor
        if keep.any() and int(keep.sum()) >= min_keep:
            c.ids, c.logits = c.ids[keep], c.logits[keep]
            return
        c.sort()
    floor = c.logits[0] + libm.scalar(libm.logf, p)
    below = np.nonzero((c.logits < floor) & (np.arange(c.ids.size) >= min_keep))[0]
    below = below[below >= 1]  # the first token always stays
    c.keep(int(below[0]) if below.size else c.ids.size)


def temperature(c: Candidates, temp: float) -> None:
    if temp <= 0.0:  # only the first most likely token stays finite
        best = int(np.argmax(c.logits))
        kept = c.logits[best]
        c.logits = np.full_like(c.logits, -np.inf)
        c.logits[best] = kept
        return
    c.logits = (c.logits / F32(temp)).astype(F32)


def dist(c: Candidates, rng: Mt19937) -> int:
    """llama_sampler_dist: the index in `c` of the token drawn with probability softmax(logits)."""
    if c.ids.size == 1:
        rng.uniform()  # one draw per token, as llama.cpp keeps its generator aligned
        return 0
    p = libm.expf(c.logits - _max_logit(c))
    running = np.cumsum(p.astype(np.float64))
    target = running[-1] * rng.uniform()
    return int(np.argmax(running >= target))


class Sampler:
    """A sampler chain with its generator: `sample(logits)` is llama_sampler_sample's token."""

    def __init__(self, params: SamplerParams | None = None) -> None:
        self.params = p = params or SamplerParams()
        seed = p.seed
        if seed == 0xFFFFFFFF:
            entropy = np.random.SeedSequence().entropy  # (drawn from the OS: an int)
            assert isinstance(entropy, int)
            seed = entropy & 0xFFFFFFFF
        self.rng = Mt19937(seed)

    def candidates(self, logits: np.ndarray) -> Candidates:
        """What is left to draw from after top-k, top-p, min-p and temperature."""
        p = self.params
        c = Candidates(np.arange(logits.size, dtype=np.int32), np.asarray(logits, F32).copy())
        top_k(c, p.top_k)
        top_p(c, p.top_p)
        min_p(c, p.min_p)
        temperature(c, p.temp)
        return c

    def sample(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, F32).reshape(-1)
        if self.params.greedy:
            return int(np.argmax(logits))  # llama_sampler_greedy: the first largest
        c = self.candidates(logits)
        return int(c.ids[dist(c, self.rng)])
