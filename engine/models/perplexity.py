"""Perplexity and KL divergence as llama.cpp's llama-perplexity computes them.

The text is tokenized whole (BOS first when the vocabulary adds one) and cut into chunks of n_ctx
tokens (`split_chunks`): as many as fit (`--chunks` at most); fewer than 2*n_ctx tokens are refused.
Each chunk runs from an empty KV cache (llama_memory_clear) with its first token replaced by BOS
when the model adds one, in batches of n_batch (each split into ubatches by the context). Only
the second half is scored: the logits at positions first = n_ctx/2 .. n_ctx-2 predict tokens
first+1 .. n_ctx-1, so n_ctx - 1 - first tokens a chunk (every earlier token is context).

The arithmetic is the tool's, step by step, in the C types it uses (float32 as np.float32, double
as Python/numpy float64): the largest logit, expf of each logit minus it (the C library's expf,
engine/libm.py), those summed in a double one after another (a cumulative sum, never numpy's
pairwise sum), the double log of that sum (the C library's log, through math.log).
- Plain perplexity (`ppl_nll`): -log p = -(float(logit[tok] - max) - log(sum)) in double.
- Writing the base logits file (`base_rows`): log(sum) rounded to float, -log p =
  (max + log_sum) - logit[tok] in float, and each token's log-probabilities stored as 16 bits: a
  float scale = (max - min)/65535 and a float offset (the log-probability of min), min no lower
  than max - 16, each logit above min as round((logit - min)/scale) (nearest_int: the float
  trick of adding 1.5*2^23), 0 at or below.
- KL divergence against such a file (`kld_token`): Q's -log p in float, the base's from its 16
  bits, KLD = sum over the base's tokens with log p_base > -16 of p_base*(log p_base - log p_Q)
  (each term in float, the sum in double), whether both put their largest probability on the same
  token (the first of equal largest), and dp = p_Q(tok) - p_base(tok).
Then the running sums in double (nll, nll^2; for KLD the sums of kl_divergence_result), the
estimate +/- its error as the tool prints it, and the KLD percentiles (interpolated in float).

The logits file (llama.cpp's format, so either tool reads the other's): "_logits_", n_ctx (u32),
n_vocab, n_chunk (i32), the n_chunk*n_ctx tokens as the text gave them (before BOS replaced any),
then per chunk n_ctx - 1 - first rows of nv = 2*ceil(n_vocab/2) + 4 uint16: the two floats,
n_vocab codes, a zero pad when n_vocab is odd.

llama-perplexity sums in several threads, each its share of tokens, the shares added in the order
the threads finish; the engine adds token after token. The printed figures (4 to 6 decimals) do
not see the difference (the last bits of a double). Several chunks in one batch (n_batch > n_ctx:
llama-perplexity then decodes n_batch/n_ctx chunks together as separate sequences) run here one
after another.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import BinaryIO

import numpy as np

from engine.libm import expf
from engine.quants.common import nearest_int  # the same trick as ggml's quantizers

F32 = np.float32
LOGITS_MAGIC = b"_logits_"
LOG_PROB_RANGE = F32(16)  # log-probabilities more than this below the top one are stored as 0


def row_width(n_vocab: int) -> int:
    """nv: the uint16 of one token's row in the logits file (two floats, the codes, a pad)."""
    return 2 * ((n_vocab + 1) // 2) + 4


@dataclass(frozen=True)
class Chunking:
    """How llama-perplexity cuts the tokens: n_chunk chunks of n_ctx tokens, scored from first."""

    n_ctx: int
    n_chunk: int

    @property
    def first(self) -> int:
        return self.n_ctx // 2

    @property
    def n_scored(self) -> int:  # tokens scored a chunk
        return self.n_ctx - 1 - self.first

    def chunk(self, tokens, i: int, bos: int | None) -> list[int]:
        """Chunk i's tokens as decoded: the first replaced by BOS when the model adds one."""
        ids = [int(t) for t in tokens[i * self.n_ctx:(i + 1) * self.n_ctx]]
        if bos is not None:
            ids[0] = bos
        return ids

    def targets(self, tokens, i: int) -> np.ndarray:
        """The tokens chunk i's scored logits predict (positions first+1 .. n_ctx-1)."""
        start = i * self.n_ctx + self.first + 1
        return np.asarray(tokens[start:start + self.n_scored], np.int64)


class PerplexityError(ValueError):
    """What llama-perplexity refuses, in its words."""


def split_chunks(n_tokens: int, n_ctx: int, n_chunks: int = -1) -> Chunking:
    """The chunks of n_tokens: n_tokens // n_ctx, at most n_chunks (when not negative)."""
    if n_ctx <= 0:
        raise PerplexityError("perplexity tool requires '--ctx-size' > 0")
    if n_tokens < 2 * n_ctx:
        raise PerplexityError(
            f"you need at least {2 * n_ctx} tokens to evaluate perplexity with a context of "
            f"{n_ctx}; the data file you provided tokenizes to only {n_tokens} tokens")
    n_max = n_tokens // n_ctx
    return Chunking(n_ctx, n_max if n_chunks < 0 else min(n_chunks, n_max))


def _sum_exp(logits: np.ndarray, top: np.ndarray) -> np.ndarray:
    """Per row: the double sum, in order, of expf(logit - top) (float differences)."""
    e = expf(logits - top[:, None]).astype(np.float64)
    return np.cumsum(e, axis=1)[:, -1]


def _log(x: np.ndarray) -> np.ndarray:
    """The C library's double log of each value (math.log calls it)."""
    return np.array([math.log(float(v)) for v in x], np.float64)


def ppl_nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Plain perplexity's -log p(target) per row (double), as the tool's log_softmax."""
    logits = np.asarray(logits, F32)
    top = logits.max(axis=1)
    log_sum = _log(_sum_exp(logits, top))
    picked = logits[np.arange(len(targets)), targets]
    return -((picked - top).astype(np.float64) - log_sum)


def base_rows(logits: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Writing a base file: (-log p(target) per row as the tool computes it there (in float,
    returned as double), the rows of the file [n, nv] uint16)."""
    logits = np.asarray(logits, F32)
    n, n_vocab = logits.shape
    top = logits.max(axis=1)
    low = np.maximum(logits.min(axis=1), top - LOG_PROB_RANGE)
    log_sum = _log(_sum_exp(logits, top)).astype(F32)
    min_log_prob = (low - top) - log_sum
    scale = (top - low) / F32(65535)
    rows = np.zeros((n, row_width(n_vocab)), np.uint16)
    rows[:, :4] = np.stack([scale, min_log_prob], axis=1).astype("<f4").view(np.uint16)
    for r in range(n):
        if scale[r]:
            inv = F32(1) / scale[r]
            codes = nearest_int(inv * (logits[r] - low[r]))
            rows[r, 4:4 + n_vocab] = np.where(logits[r] > low[r], codes, 0).astype(np.uint16)
    picked = logits[np.arange(n), targets]
    return ((top + log_sum) - picked).astype(np.float64), rows


@dataclass
class KLDSums:
    """kl_divergence_result: the running sums over the scored tokens (double), the largest
    |dp| (float), the count of tokens whose top token agrees; and each token's KLD, dp and
    -log p (the terms of those sums, for a per-token view)."""

    sum_nll: float = 0.0
    sum_nll2: float = 0.0
    sum_nll_base: float = 0.0
    sum_nll_base2: float = 0.0
    sum_nll_nll_base: float = 0.0
    sum_kld: float = 0.0
    sum_kld2: float = 0.0
    sum_p_diff: float = 0.0
    sum_p_diff2: float = 0.0
    sum_p_diff4: float = 0.0
    max_p_diff: np.float32 = F32(0)
    n_same_top: int = 0
    count: int = 0
    kld_values: list = field(default_factory=list)  # float, one per token
    p_diff_values: list = field(default_factory=list)
    nll_values: list = field(default_factory=list)  # Q's -log p (float), one per token


def kld_rows(logits: np.ndarray, base: np.ndarray, targets: np.ndarray, s: KLDSums) -> None:
    """The tool's log_softmax against base rows, for each scored token in order, into s."""
    logits = np.asarray(logits, F32)
    n, n_vocab = logits.shape
    top = logits.max(axis=1)
    imax = logits.argmax(axis=1)  # the first of equal largest, as the tool's strict '>'
    log_sum = _log(_sum_exp(logits, top)).astype(F32)
    head = np.ascontiguousarray(base[:, :4]).view("<f4").astype(F32)
    codes = base[:, 4:4 + n_vocab].astype(F32)
    for r in range(n):
        scale, min_log_prob = head[r, 0], head[r, 1]
        tok = int(targets[r])
        nll = (top[r] + log_sum[r]) - logits[r, tok]
        nll_base = -(scale * codes[r, tok] + min_log_prob)
        s.sum_nll += float(nll)
        s.sum_nll2 += float(nll * nll)
        s.sum_nll_base += float(nll_base)
        s.sum_nll_base2 += float(nll_base * nll_base)
        s.sum_nll_nll_base += float(nll * nll_base)
        log_z = top[r] + log_sum[r]
        p_log_base = scale * codes[r] + min_log_prob
        kept = p_log_base > F32(-16)
        terms = expf(p_log_base[kept]) * ((p_log_base[kept] - logits[r][kept]) + log_z)
        kld = float(np.cumsum(terms.astype(np.float64))[-1]) if terms.size else 0.0
        s.sum_kld += kld
        s.sum_kld2 += kld * kld
        s.count += 1
        s.n_same_top += int(imax[r] == int(p_log_base.argmax()))
        p_diff = expf(-nll)[()] - expf(-nll_base)[()]
        p_diff2 = float(p_diff * p_diff)
        s.sum_p_diff += float(p_diff)
        s.sum_p_diff2 += p_diff2
        s.sum_p_diff4 += p_diff2 * p_diff2
        s.max_p_diff = max(s.max_p_diff, abs(p_diff))
        s.kld_values.append(F32(kld))
        s.p_diff_values.append(p_diff)
        s.nll_values.append(nll)


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """The tool's mean and its standard error (0 with ten values or fewer)."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(a: float, b: float, ab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (ab / count - (a / count) * (b / count)) / (count - 1)


def percentile(values: list, fraction: float) -> np.float32:
    """The tool's percentile of sorted float values, interpolated in float."""
    frac = F32(fraction)
    if frac <= 0:
        return values[0]
    if frac >= 1:
        return values[-1]
    p = frac * F32(len(values) - 1)
    ip = int(p)
    p = p - F32(ip)
    return (F32(1) - p) * values[ip] + p * values[min(ip + 1, len(values) - 1)]


def median(values: list) -> np.float32:
    n = len(values)
    return F32(0.5) * (values[n // 2] + values[n // 2 - 1]) if n % 2 == 0 else values[n // 2]


def ppl_estimate(nll: float, nll2: float, count: int) -> tuple[float, float | None]:
    """The final estimate: PPL = exp(mean nll) and its error (None where the tool reports a
    negative variance)."""
    nll2, nll = nll2 / count, nll / count
    ppl = math.exp(nll)
    nll2 -= nll * nll
    return ppl, (math.sqrt(nll2 / (count - 1)) * ppl if nll2 > 0 else None)


def kld_chunk_figures(s: KLDSums) -> dict:
    """The figures of one chunk's line in the KLD table (running over the chunks so far)."""
    log_ppl = mean_and_uncertainty(s.sum_nll, s.sum_nll2, s.count)
    base = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, s.count)
    cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count)
    kld = mean_and_uncertainty(s.sum_kld, s.sum_kld2, s.count)
    mse = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, s.count)
    rms = math.sqrt(mse[0])
    top = s.n_same_top / s.count
    return {
        "ppl": (math.exp(log_ppl[0]), math.exp(log_ppl[0]) * log_ppl[1]),
        "ln_ppl_ratio": (log_ppl[0] - base[0],
                         math.sqrt(log_ppl[1] ** 2 + base[1] ** 2 - 2.0 * cov)),
        "kld": kld,
        "rms_p_diff": (rms, 0.5 / rms * mse[1] if rms else math.inf),
        "same_top": (top, math.sqrt(top * (1 - top) / (s.count - 1))),
    }


KLD_LEVELS = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900),
              ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001))
P_DIFF_LEVELS = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900),
                 ("75.0%", 0.750), ("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050),
                 (" 1.0%", 0.010), (" 0.1%", 0.001))


def kld_summary(s: KLDSums) -> dict:
    """The statistics printed at the end (the tool prints them from 100 scored tokens on)."""
    log_ppl = mean_and_uncertainty(s.sum_nll, s.sum_nll2, s.count)
    base = mean_and_uncertainty(s.sum_nll_base, s.sum_nll_base2, s.count)
    ppl, ppl_base = math.exp(log_ppl[0]), math.exp(base[0])
    ppl_unc, ppl_base_unc = ppl * log_ppl[1], ppl_base * base[1]
    cov = covariance(s.sum_nll, s.sum_nll_base, s.sum_nll_nll_base, s.count)
    ratio = log_ppl[0] - base[0]
    ratio_unc = math.sqrt(log_ppl[1] ** 2 + base[1] ** 2 - 2.0 * cov)
    kld = sorted(s.kld_values)
    dp = sorted(s.p_diff_values)
    mse = mean_and_uncertainty(s.sum_p_diff2, s.sum_p_diff4, s.count)
    rms = math.sqrt(mse[0])
    top = s.n_same_top / s.count
    with np.errstate(divide="ignore", invalid="ignore"):
        cor = cov / (log_ppl[1] * base[1]) if log_ppl[1] * base[1] else math.nan
    return {
        "mean_ppl_q": (ppl, ppl_unc),
        "mean_ppl_base": (ppl_base, ppl_base_unc),
        "cor_ln_ppl": cor,
        "mean_ln_ppl_ratio": (ratio, ratio_unc),
        "mean_ppl_ratio": (math.exp(ratio), math.exp(ratio) * ratio_unc),
        "mean_ppl_diff": (ppl - ppl_base, math.sqrt(ppl_unc ** 2 + ppl_base_unc ** 2
                                                    - 2.0 * ppl * ppl_base * cov)),
        "mean_kld": mean_and_uncertainty(s.sum_kld, s.sum_kld2, s.count),
        "kld_max": float(kld[-1]),
        "kld_percentiles": {name: float(percentile(kld, f)) for name, f in KLD_LEVELS},
        "kld_median": float(median(kld)),
        "kld_min": float(kld[0]),
        "mean_p_diff": mean_and_uncertainty(s.sum_p_diff, s.sum_p_diff2, s.count),
        "p_diff_max": float(dp[-1]),
        "p_diff_percentiles": {name: float(percentile(dp, f)) for name, f in P_DIFF_LEVELS},
        "p_diff_median": float(median(dp)),
        "p_diff_min": float(dp[0]),
        "rms_p_diff": (rms, 0.5 / rms * mse[1] if rms else math.inf),
        "same_top": (top, math.sqrt(top * (1.0 - top) / (s.count - 1))),
    }


def kld_chunk_line(i: int, f: dict) -> str:
    """One row of the tool's KLD table."""
    return (f"{i:4d}    {f['ppl'][0]:9.4f} ± {f['ppl'][1]:9.4f}"
            f"    {f['ln_ppl_ratio'][0]:10.5f} ± {f['ln_ppl_ratio'][1]:10.5f}"
            f"    {f['kld'][0]:10.5f} ± {f['kld'][1]:10.5f}"
            f"    {100 * f['rms_p_diff'][0]:6.3f} ± {100 * f['rms_p_diff'][1]:6.3f} %"
            f"    {100 * f['same_top'][0]:6.3f} ± {100 * f['same_top'][1]:6.3f} %")


KLD_TABLE_HEAD = ("chunk             PPL               ln(PPL(Q)/PPL(base))          "
                  "KL Divergence              Δp RMS            Same top p")


def kld_summary_lines(k: dict) -> list[str]:
    """The tool's closing statistics, line by line."""
    def pm(name: str, v) -> str:
        return f"{name}: {v[0]:10.6f} ± {v[1]:10.6f}"

    out = ["====== Perplexity statistics ======",
           pm("Mean PPL(Q)                   ", k["mean_ppl_q"]),
           pm("Mean PPL(base)                ", k["mean_ppl_base"]),
           f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * k['cor_ln_ppl']:6.2f}%",
           pm("Mean ln(PPL(Q)/PPL(base))     ", k["mean_ln_ppl_ratio"]),
           pm("Mean PPL(Q)/PPL(base)         ", k["mean_ppl_ratio"]),
           pm("Mean PPL(Q)-PPL(base)         ", k["mean_ppl_diff"]),
           "", "====== KL divergence statistics ======",
           pm("Mean    KLD", k["mean_kld"]),
           f"Maximum KLD: {k['kld_max']:10.6f}"]
    pct = k["kld_percentiles"]
    out += [f"{name}   KLD: {pct[name]:10.6f}" for name, _ in KLD_LEVELS[:4]]
    out.append(f"Median  KLD: {k['kld_median']:10.6f}")
    out += [f"{name}   KLD: {pct[name]:10.6f}" for name, _ in KLD_LEVELS[4:]]
    out += [f"Minimum KLD: {k['kld_min']:10.6f}", "", "====== Token probability statistics ======",
            f"Mean    Δp: {100.0 * k['mean_p_diff'][0]:6.3f} ± {100.0 * k['mean_p_diff'][1]:5.3f} %",
            f"Maximum Δp: {100.0 * k['p_diff_max']:6.3f}%"]
    pct = k["p_diff_percentiles"]
    out += [f"{name}   Δp: {100.0 * pct[name]:6.3f}%" for name, _ in P_DIFF_LEVELS[:5]]
    out.append(f"Median  Δp: {100.0 * k['p_diff_median']:6.3f}%")
    out += [f"{name}   Δp: {100.0 * pct[name]:6.3f}%" for name, _ in P_DIFF_LEVELS[5:]]
    out += [f"Minimum Δp: {100.0 * k['p_diff_min']:6.3f}%",
            f"RMS Δp    : {100.0 * k['rms_p_diff'][0]:6.3f} ± {100.0 * k['rms_p_diff'][1]:5.3f} %",
            f"Same top p: {100.0 * k['same_top'][0]:6.3f} ± {100.0 * k['same_top'][1]:5.3f} %"]
    return out


def write_logits_header(out: BinaryIO, c: Chunking, n_vocab: int, tokens) -> None:
    """The base file's head: magic, n_ctx, n_vocab, n_chunk and the chunks' tokens."""
    out.write(LOGITS_MAGIC + struct.pack("<Iii", c.n_ctx, n_vocab, c.n_chunk))
    out.write(np.asarray(tokens[:c.n_chunk * c.n_ctx], "<i4").tobytes())


@dataclass
class LogitsFile:
    """A base logits file opened for reading: its chunking, vocabulary size and tokens."""

    stream: BinaryIO
    chunks: Chunking
    n_vocab: int
    tokens: np.ndarray

    def chunk_rows(self) -> np.ndarray:
        """The next chunk's rows [n_scored, nv] uint16."""
        nv = row_width(self.n_vocab)
        want = self.chunks.n_scored * nv
        data = np.frombuffer(self.stream.read(2 * want), "<u2")
        if data.size != want:
            raise PerplexityError("failed reading log-probs for a chunk: the file ends early")
        return data.reshape(self.chunks.n_scored, nv)


def open_logits_file(stream: BinaryIO, name: str) -> LogitsFile:
    """Read a base file's head as the tool's kl_divergence does; its refusals in its words."""
    if stream.read(8) != LOGITS_MAGIC:
        raise PerplexityError(f"{name} does not look like a file containing log-probabilities")
    head = stream.read(12)
    if len(head) != 12:
        raise PerplexityError(f"failed reading n_vocab, n_chunk from {name}")
    n_ctx, n_vocab, n_chunk = struct.unpack("<Iii", head)
    tokens = np.frombuffer(stream.read(4 * n_ctx * n_chunk), "<i4")
    if tokens.size != n_ctx * n_chunk:
        raise PerplexityError(f"failed reading evaluation tokens from {name}")
    return LogitsFile(stream, Chunking(int(n_ctx), int(n_chunk)), int(n_vocab), tokens)
