"""The perplexity page's view-models: the form, a run's progress, and its result (the lines
llama-perplexity prints and the heat map of the text, one cell per token).

Every figure comes from the engine's run (engine/models/perplexity_scores.py): the printed lines
as its functions format them, each scored token's -log p, probability, rank and KLD as it
returned them. Here they are only arranged: which tokens a chunk scores, which colour band a
value falls in, the words of a tooltip.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import N_, _
from app.perplexity_runs import (BUILTIN, CTX_SIZES, DEFAULT_CTX, DEFAULT_MODEL, MAX_EVAL_TOKENS,
                                 MAX_TEXT_BYTES, PerplexityRuns, RunSpec, RunStatus)
from engine.models.perplexity_scores import PerplexityRun

# colour bands: a value below edges[i] (and not below edges[i-1]) is band i; above all, the last
NLL_EDGES = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 9.0)  # -log p, nats
KLD_EDGES = (0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0)  # nats
BUILTIN_TITLE = N_("Lighthouses and the Light They Throw (an essay written for ggml-lens, "
                   "public domain)")


def band(value: float, edges: tuple[float, ...]) -> int:
    return next((i for i, e in enumerate(edges) if value < e), len(edges))


@dataclass(frozen=True, slots=True)
class LegendBand:
    level: int
    label: str


def legend(edges: tuple[float, ...]) -> list[LegendBand]:
    """The bands' ranges, '< 0.1', '0.1–0.25', ..., '≥ 9'."""
    out = [LegendBand(0, f"< {edges[0]:g}")]
    out += [LegendBand(i, f"{edges[i - 1]:g}–{edges[i]:g}") for i in range(1, len(edges))]
    return out + [LegendBand(len(edges), f"≥ {edges[-1]:g}")]


@dataclass(frozen=True, slots=True)
class FormView:
    models: list[str]  # the models folder's files, by name
    model: str
    kld: str  # the second model ("" none)
    ctx_sizes: tuple[int, ...]
    c: int
    chunks: int | None  # None: as many as the text holds (capped)
    own: bool  # the learner's text is chosen
    text: str  # the learner's text as typed
    builtin_title: str
    builtin_text: str
    max_text: int  # bytes
    max_tokens: int
    error: str | None = None


def form_view(runs: PerplexityRuns, spec: RunSpec | None = None, text: str = "",
              own: bool = False, error: str | None = None) -> FormView:
    names = runs.model_names()
    model = spec.model if spec else (DEFAULT_MODEL if DEFAULT_MODEL in names else
                                     (names[0] if names else ""))
    return FormView(names, model, spec.kld if spec else "", CTX_SIZES,
                    spec.c if spec else DEFAULT_CTX,
                    spec.chunks if spec and spec.chunks > 0 else None, own, text,
                    _(BUILTIN_TITLE), runs.text(BUILTIN).decode("utf-8", "replace"),
                    MAX_TEXT_BYTES, MAX_EVAL_TOKENS, error)


@dataclass(frozen=True, slots=True)
class ProgressView:
    done: int  # chunks scored
    total: int | None  # None until the text is tokenized
    place: int  # 0: running; else its place in the queue
    seconds: int | None


def progress_view(status: RunStatus) -> ProgressView:
    p = status.progress
    return ProgressView(status.done, status.total, p.place if p else 0, p.seconds if p else None)


@dataclass(frozen=True, slots=True)
class Cell:
    """One token of the heat map."""

    text: str  # the token's text ('↵' marks a newline)
    kind: str  # "scored", "context", "bos" (replaced by BOS when decoded)
    title: str
    nll: str = ""  # -log p as the engine computed it (repr, all digits): data for tests and JS
    kld: str = ""
    nll_band: int = -1
    kld_band: int = -1


@dataclass(frozen=True, slots=True)
class ChunkView:
    number: int  # 1-based, as the tool counts
    first_token: int  # index in the text's tokens
    last_token: int
    scored_from: int
    running: str  # "[3]12.3456,"
    cells: list[Cell]


@dataclass(frozen=True, slots=True)
class ResultView:
    spec: RunSpec
    n_tokens: int
    n_ctx: int
    n_chunk: int
    n_chunk_max: int  # the chunks the text holds
    n_scored: int  # tokens scored in all
    running: str  # "[1]..,[2]..," as printed
    final: str | None  # "Final estimate: PPL = ..."
    kld_table: list[str]  # the head and a row per chunk (empty without a second model)
    kld_summary: list[str] | None  # the statistics (None: no second model, or too few tokens)
    chunks: list[ChunkView]
    n_after: int  # tokens after the last chunk (never decoded)
    nll_legend: list[LegendBand]
    kld_legend: list[LegendBand]


def _shown(piece: str) -> str:
    return piece.replace("\n", "↵\n")


def _quoted(piece: str) -> str:
    return repr(piece)


def _chunk_cells(run: PerplexityRun, k: int, has_kld: bool) -> list[Cell]:
    c = run.chunks[k]
    first = run.chunking.first
    cells = []
    p, p_q = c.p, c.p_q
    for j in range(run.chunking.n_ctx):
        piece = run.pieces[c.start + j]
        tok = _quoted(piece)
        if j == 0 and c.start > 0 and run.bos is not None:  # (the text's own BOS starts chunk 1)
            cells.append(Cell(_shown(piece), "bos", _("{tok}: decoded as BOS (each chunk starts "
                                                      "with it); not scored").format(tok=tok)))
            continue
        if j <= first:
            cells.append(Cell(_shown(piece), "context",
                              _("{tok}: context (the chunk's first half); not scored")
                              .format(tok=tok)))
            continue
        r = j - first - 1
        nll = float(c.nll[r])
        title = _("{tok}: log p = {lp:.4f}, p = {p:.2%}, rank {rank}").format(
            tok=tok, lp=-nll, p=float(p[r]), rank=int(c.rank[r]))
        if c.rank[r] > 1:
            title += _("; the most likely was {top}").format(
                top=_quoted(run.top_pieces[int(c.top[r])]))
        kld = ""
        kld_band = -1
        if has_kld and c.kld is not None and c.nll_q is not None and c.rank_q is not None \
                and p_q is not None:
            v = float(c.kld[r])
            kld, kld_band = repr(v), band(v, KLD_EDGES)
            title += "\n" + _("second model: log p = {lp:.4f}, p = {p:.2%}, rank {rank}; "
                              "KLD = {kld:.6f}").format(lp=-float(c.nll_q[r]), p=float(p_q[r]),
                                                        rank=int(c.rank_q[r]), kld=v)
        cells.append(Cell(_shown(piece), "scored", title, repr(nll), kld,
                          band(nll, NLL_EDGES), kld_band))
    return cells


def result_view(spec: RunSpec, run: PerplexityRun) -> ResultView:
    c = run.chunking
    has_kld = bool(spec.kld)
    chunks = [ChunkView(k + 1, ch.start, ch.start + c.n_ctx - 1, ch.start + c.first + 1,
                        ch.running, _chunk_cells(run, k, has_kld))
              for k, ch in enumerate(run.chunks)]
    table = [run.kld_head] + [ch.kld_line for ch in run.chunks if ch.kld_line] \
        if has_kld and run.kld_head else []
    return ResultView(spec, len(run.tokens), c.n_ctx, c.n_chunk, run.n_chunk_max,
                      c.n_chunk * c.n_scored, "".join(ch.running for ch in run.chunks),
                      run.final, table, run.kld_summary, chunks,
                      len(run.tokens) - c.n_chunk * c.n_ctx, legend(NLL_EDGES), legend(KLD_EDGES))
