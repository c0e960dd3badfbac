"""Two model files run over one prompt and held side by side, node by node (llama.cpp #2783's
request: where in the layers does a quantization's error come from?).

`collect_run` runs a model's forward pass over a short prompt with an eval callback (ggml's
cb_eval shape, the compute observer) that copies each computed node's values out of the compute
buffer as it is made (the graph allocator reuses the memory of a node no later node reads). Two
files of the same architecture and shapes build the same graph, so their nodes pair up by
index; `check_same_shape` refuses a pair whose tensors differ and `pair_runs` one whose graphs do.
`node_diff` measures a pair of node values (max abs, relative RMS, cosine, in double);
`token_diffs` compares the next-token distributions position by position with llama-perplexity's
own KLD arithmetic (engine/models/perplexity.py: the base's log-probabilities stored in 16 bits,
then `kld_rows`); `weight_errors` dequantizes each weight of both files (the engine's to_float)
and measures the second against the first.
What is kept of a node is capped (`MAX_VALUES`): its last rows (the last tokens, for a
[n_embd, n_tokens] activation), so a long prompt or a vocabulary-wide node costs no more than a
few hundred kilobytes; the metrics are over the values kept, and a node says which rows those are.
Leaves out: several sequences, a prompt in several graphs (one ubatch: `MAX_TOKENS`).
"""

from __future__ import annotations

import enum
import math
import os
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.compute.threadpool import COMPUTE_OBSERVER
from engine.core.tensor import Tensor, dims4
from engine.core.tensor_data import to_numpy
from engine.core.types import TYPE_TRAITS, GGMLType, bf16_bits_to_fp32
from engine.gguf import GGUFReader
from engine.quants import dequantize
from engine.trace.evaldump import op_desc

from . import load_model
from .perplexity import KLDSums, base_rows, kld_rows

MAX_TOKENS = 32  # the prompt's tokens: one graph, a few seconds
N_CTX = 256  # the cache's cells (the fewest a pass attends to: llama.cpp pads n_kv to 256)
MAX_VALUES = 1 << 15  # values kept per node: its last rows that fit (at most a row's first ones)
TOP_K = 5  # candidates shown per position
WEIGHT_ROWS = 1 << 18  # elements dequantized at a time when weights are compared


class Mismatch(enum.Enum):
    """Why two files cannot be stepped side by side."""

    ARCH = "arch"  # args: a, b (general.architecture)
    MISSING = "missing"  # args: name, side ("A" or "B"): a tensor only one file has
    SHAPE = "shape"  # args: name, a, b (the ne of each)
    GRAPH = "graph"  # args: index, a, b (node names, or counts when one graph is longer)
    NO_TOKENIZER = "no_tokenizer"  # args: path
    TOO_LONG = "too_long"  # args: n, limit
    EMPTY = "empty"  # the prompt gives no tokens
    NOT_DECODER = "not_decoder"  # args: arch (an encoder, or an architecture not built here)


class CompareError(ValueError):
    """A pair or a prompt that cannot be compared: its kind and the values that fill its words
    (the app says it in the learner's language)."""

    def __init__(self, kind: Mismatch, **args: object) -> None:
        super().__init__(f"{kind.value}: " + ", ".join(f"{k}={v}" for k, v in args.items()))
        self.kind, self.values = kind, args


@dataclass(frozen=True, slots=True)
class NodeValues:
    """One computed node of a run and the values kept of it."""

    index: int  # its place in the graph's computed nodes
    name: str
    op: str  # ggml_op_desc
    type: str  # the tensor's type name
    ne: tuple[int, int, int, int]
    first_row: int  # the first of the rows kept (rows: ne[1]*ne[2]*ne[3] of ne[0] values)
    values: np.ndarray  # float32 [rows kept, values kept per row]; empty for a quantized node

    @property
    def n_rows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]


@dataclass(frozen=True, slots=True)
class ModelRun:
    """A model's pass over a prompt: its nodes in the order computed and every position's logits."""

    arch: str
    n_layer: int
    tokens: tuple[int, ...]
    pieces: dict[int, str]  # the text of each prompt token and of each position's top tokens
    nodes: tuple[NodeValues, ...]
    logits: np.ndarray  # float32 [n_tokens, n_vocab]

    @property
    def nbytes(self) -> int:
        return self.logits.nbytes + sum(n.values.nbytes for n in self.nodes)


def kept_values(t: Tensor, limit: int = MAX_VALUES) -> tuple[int, np.ndarray]:
    """(first row kept, values) of a computed node: as float32 rows of ne[0], the last rows that
    fit `limit` values (of a row longer than `limit`, the last row's first `limit` values)."""
    ne = dims4(t.ne)
    if TYPE_TRAITS[t.type].is_quantized or t.data is None:
        return 0, np.zeros((0, 0), np.float32)
    # the buffer's values as rows of ne[0] (a view; a permuted node's rows gathered in order)
    rows = to_numpy(t).reshape(-1, ne[0])
    n_rows = ne[1] * ne[2] * ne[3]
    keep = max(1, min(n_rows, limit // max(ne[0], 1)))
    first = n_rows - keep
    part = rows[first:, :min(ne[0], limit)]
    if t.type == GGMLType.BF16:  # (to_numpy gives its bit patterns)
        return first, bf16_bits_to_fp32(part).astype(np.float32)
    return first, np.array(part, np.float32)  # (F16 widens exactly)


def collect_run(path: str | os.PathLike, prompt: str,
                on_node: Callable[[int], None] | None = None) -> ModelRun:
    """Run the model in `path` over `prompt` (one graph, every position's logits), keeping each
    computed node's values (`kept_values`); `on_node(count)` after each node. The model is closed
    before this returns."""
    with GGUFReader(path) as r:
        arch = str(r.get("general.architecture"))
    if not is_decoder(arch):
        raise CompareError(Mismatch.NOT_DECODER, arch=arch)
    model = load_model(path, n_ctx=N_CTX)
    try:
        if model.tokenizer is None:
            raise CompareError(Mismatch.NO_TOKENIZER, path=str(path))
        ids = [int(i) for i in model.tokenizer.encode_prompt(prompt)]
        if not ids:
            raise CompareError(Mismatch.EMPTY)
        if len(ids) > MAX_TOKENS:
            raise CompareError(Mismatch.TOO_LONG, n=len(ids), limit=MAX_TOKENS)
        nodes: list[NodeValues] = []

        def observe(node: Tensor, ask: bool, shares=None) -> bool:
            if not ask:
                first, values = kept_values(node)
                nodes.append(NodeValues(len(nodes), node.name, op_desc(node),
                                        TYPE_TRAITS[node.type].type_name, dims4(node.ne), first, values))
                if on_node is not None:
                    on_node(len(nodes))
            return True

        token = COMPUTE_OBSERVER.set(observe)
        try:
            logits = np.array(model.decode(ids, n_threads=1, all_logits=True).logits, np.float32)
        finally:
            COMPUTE_OBSERVER.reset(token)
        shown = {*ids, *np.argsort(-logits, axis=1, kind="stable")[:, :TOP_K].reshape(-1).tolist()}
        pieces = {int(i): str(model.tokenizer.piece_text(int(i))) for i in sorted(shown)}
        return ModelRun(model.file.arch, int(getattr(model.hp, "n_layer", 0)), tuple(ids), pieces,
                   tuple(nodes), logits)
    finally:
        model.close()


def is_decoder(arch: str) -> bool:
    """Does the engine build `arch` as a decoder (next-token logits over a prompt)?"""
    import importlib

    from . import BUILDERS
    from .decoder import Decoder

    if arch not in BUILDERS:
        return False
    module, cls = BUILDERS[arch]
    return issubclass(getattr(importlib.import_module(f"engine.models.{module}"), cls), Decoder)


def check_same_shape(path_a: str | os.PathLike, path_b: str | os.PathLike) -> None:
    """Refuse (CompareError) two files that do not build the same graph: another architecture,
    a tensor only one has, or a tensor of another shape (types may differ: that is the point)."""
    with GGUFReader(path_a) as a, GGUFReader(path_b) as b:
        arch_a, arch_b = a.get("general.architecture"), b.get("general.architecture")
        if arch_a != arch_b:
            raise CompareError(Mismatch.ARCH, a=str(arch_a), b=str(arch_b))
        ta = {t.name: t for t in a.tensors}
        tb = {t.name: t for t in b.tensors}
        for name, t in ta.items():
            if name not in tb:
                raise CompareError(Mismatch.MISSING, name=name, side="B")
            if tb[name].ne != t.ne:
                raise CompareError(Mismatch.SHAPE, name=name, a=t.shape, b=tb[name].shape)
        for name in tb:
            if name not in ta:
                raise CompareError(Mismatch.MISSING, name=name, side="A")


def pair_runs(a: ModelRun, b: ModelRun) -> None:
    """Refuse (CompareError) two runs whose graphs are not the same node for node (name and
    shape), or that read other tokens."""
    if len(a.nodes) != len(b.nodes):
        raise CompareError(Mismatch.GRAPH, index=min(len(a.nodes), len(b.nodes)),
                           a=f"{len(a.nodes)} nodes", b=f"{len(b.nodes)} nodes")
    for x, y in zip(a.nodes, b.nodes):
        if x.name != y.name or x.ne != y.ne:
            raise CompareError(Mismatch.GRAPH, index=x.index, a=f"{x.name} {x.ne}", b=f"{y.name} {y.ne}")
    if a.tokens != b.tokens:
        raise CompareError(Mismatch.GRAPH, index=0, a=f"tokens {a.tokens}", b=f"tokens {b.tokens}")


@dataclass(frozen=True, slots=True)
class Diff:
    """B's values against A's (in double): the largest |b - a|, the relative RMS
    sqrt(sum (b-a)^2 / sum a^2) and the cosine similarity a.b / (|a| |b|) (None where a norm is
    0: no direction to compare; the relative RMS is then inf unless both are 0)."""

    max_abs: float
    rel_rms: float
    cosine: float | None
    n: int  # the values compared


def node_diff(a: np.ndarray, b: np.ndarray) -> Diff:
    """The difference of two nodes' kept values (same shape)."""
    x = np.asarray(a, np.float64).reshape(-1)
    y = np.asarray(b, np.float64).reshape(-1)
    if x.size == 0:
        return Diff(0.0, 0.0, None, 0)
    d = y - x
    max_abs = float(np.max(np.abs(d)))
    err2, ref2 = float(np.dot(d, d)), float(np.dot(x, x))
    rel = math.sqrt(err2 / ref2) if ref2 > 0 else (0.0 if err2 == 0 else math.inf)
    nx, ny = math.sqrt(ref2), math.sqrt(float(np.dot(y, y)))
    cos = float(np.dot(x, y)) / (nx * ny) if nx > 0 and ny > 0 else None
    return Diff(max_abs, rel, cos, int(x.size))


def node_diffs(a: ModelRun, b: ModelRun) -> tuple[Diff, ...]:
    """Every node pair's difference, in graph order (the runs paired: pair_runs)."""
    return tuple(node_diff(x.values, y.values) for x, y in zip(a.nodes, b.nodes))


@dataclass(frozen=True, slots=True)
class NextToken:
    token: int
    piece: str
    p: float  # its probability (softmax of the logits, in double)


@dataclass(frozen=True, slots=True)
class TokenDiff:
    """Position i: what each model predicts after the prompt's first i+1 tokens."""

    position: int
    target: int  # the next token of the prompt (the last position: A's most likely)
    top_a: tuple[NextToken, ...]
    top_b: tuple[NextToken, ...]
    kld: float  # KL(A || B), llama-perplexity's arithmetic (A's log-probs in 16 bits)
    same_top: bool  # both put their largest probability on the same token (the tool's count)
    p_diff: float  # p_B(target) - p_A(target), as the tool computes it


def probabilities(logits: np.ndarray) -> np.ndarray:
    """softmax in double (for showing the odds: not a ggml result), with the C library's exp
    (numpy's picks a SIMD path by CPU: the same logits would show other odds elsewhere)."""
    z = np.asarray(logits, np.float64)
    e = np.fromiter(map(math.exp, (z - z.max()).tolist()), np.float64, z.size)
    return e / e.sum()


def top_candidates(logits: np.ndarray, piece: Callable[[int], str], k: int = TOP_K) -> tuple[NextToken, ...]:
    p = probabilities(logits)
    top = np.argsort(-p, kind="stable")[:k]
    return tuple(NextToken(int(i), piece(int(i)), float(p[i])) for i in top)


def token_diffs(a: ModelRun, b: ModelRun, piece: Callable[[int], str]) -> tuple[TokenDiff, ...]:
    """Each position's two distributions and llama-perplexity's KLD of B against A (A as the
    base: its rows written as the base logits file holds them, `base_rows`, then `kld_rows`)."""
    n = len(a.tokens)
    targets = np.array([*a.tokens[1:], int(np.argmax(a.logits[-1]))], np.int64)
    rows = base_rows(a.logits, targets)[1]
    out = []
    for i in range(n):
        s = KLDSums()
        kld_rows(b.logits[i:i + 1], rows[i:i + 1], targets[i:i + 1], s)
        out.append(TokenDiff(i, int(targets[i]), top_candidates(a.logits[i], piece),
                             top_candidates(b.logits[i], piece), float(s.kld_values[0]),
                             s.n_same_top == 1, float(s.p_diff_values[0])))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class WeightError:
    """One weight of B dequantized against A's, dequantized."""

    name: str
    ne: tuple[int, ...]
    type_a: str
    type_b: str
    max_abs: float
    rel_rms: float  # sqrt(sum (b-a)^2 / sum a^2)
    same_bytes: bool  # B holds A's bytes as they are


def weight_errors(path_a: str | os.PathLike, path_b: str | os.PathLike,
                  on_tensor: Callable[[int, int], None] | None = None) -> tuple[WeightError, ...]:
    """Every tensor of A (its order) against B's of the same name: both dequantized by the
    engine's to_float a slab of rows at a time (the memory stays a few MB), the error summed in
    double. `on_tensor(done, count)` after each."""
    out = []
    with GGUFReader(path_a) as a, GGUFReader(path_b) as b:
        tb = {t.name: t for t in b.tensors}
        for k, t in enumerate(a.tensors):
            u = tb[t.name]
            raw_a, raw_b = a.tensor_bytes(t), b.tensor_bytes(u)
            same = t.type == u.type and np.array_equal(raw_a, raw_b)
            max_abs, err2, ref2 = 0.0, 0.0, 0.0
            n_per_row, rows = t.ne[0], t.ne[1] * t.ne[2] * t.ne[3]
            step = max(1, WEIGHT_ROWS // max(n_per_row, 1))
            for first in range(0 if not same else rows, rows, step):  # (the same bytes: no error)
                n = min(step, rows - first)
                x = dequantize(t.type, raw_a[first * t.nb[1]:(first + n) * t.nb[1]], n * n_per_row)
                y = dequantize(u.type, raw_b[first * u.nb[1]:(first + n) * u.nb[1]], n * n_per_row)
                x64 = x.astype(np.float64)
                d = y.astype(np.float64) - x64
                max_abs = max(max_abs, float(np.max(np.abs(d))) if d.size else 0.0)
                err2 += float(np.dot(d, d))
                ref2 += float(np.dot(x64, x64))
            rel = math.sqrt(err2 / ref2) if ref2 > 0 else 0.0 if err2 == 0 else math.inf
            out.append(WeightError(t.name, t.shape, TYPE_TRAITS[t.type].type_name,
                                   TYPE_TRAITS[u.type].type_name, max_abs, rel, same))
            if on_tensor is not None:
                on_tensor(k + 1, len(a.tensors))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Comparison:
    """Two runs of one prompt, paired node by node, with their differences."""

    a: ModelRun
    b: ModelRun
    diffs: tuple[Diff, ...]  # per node
    tokens: tuple[TokenDiff, ...]  # per position
    weights: tuple[WeightError, ...]

    @property
    def nbytes(self) -> int:
        return self.a.nbytes + self.b.nbytes


class CompareStage(enum.Enum):
    """Where a comparison is (for its progress)."""

    RUN_A = "run_a"  # done: nodes computed by the first model
    RUN_B = "run_b"  # done: nodes computed by the second
    WEIGHTS = "weights"  # done: tensors compared, of total


def compare_files(path_a: str | os.PathLike, path_b: str | os.PathLike, prompt: str,
                  on_progress: Callable[[CompareStage, int, int], None] | None = None) -> Comparison:
    """Check the pair, run both (one after the other: one model in memory at a time), pair
    their nodes and measure everything; `on_progress(stage, done, total)` as it goes (total 0:
    not known)."""
    say = on_progress or (lambda stage, done, total: None)
    check_same_shape(path_a, path_b)
    a = collect_run(path_a, prompt, lambda k: say(CompareStage.RUN_A, k, 0))
    b = collect_run(path_b, prompt, lambda k: say(CompareStage.RUN_B, k, len(a.nodes)))
    pair_runs(a, b)
    pieces = {**b.pieces, **a.pieces}
    tokens = token_diffs(a, b, lambda i: pieces.get(i, str(i)))
    weights = weight_errors(path_a, path_b, lambda k, n: say(CompareStage.WEIGHTS, k, n))
    return Comparison(a, b, node_diffs(a, b), tokens, weights)


def node_layer(name: str) -> int | None:
    """The layer a node's name says (llama.cpp's cb names: 'l_out-5' -> 5), or None."""
    head, sep, tail = name.rpartition("-")
    return int(tail) if sep and head and tail.isdigit() else None


def run_layers(run: ModelRun, output: str = "l_out") -> tuple[int | None, ...]:
    """Each node's layer: the one its name says, else that of the node before it (a layer's
    unnamed nodes and cache writes sit among its named ones); None before the first layer and
    after a layer's output node (`output`-il) until the next layer's first named node."""
    out: list[int | None] = []
    current: int | None = None
    for node in run.nodes:
        il = node_layer(node.name)
        out.append(current if il is None else il)
        current = None if il is not None and node.name == f"{output}-{il}" else out[-1]
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LayerPoint:
    """The error at one layer's output (its last node named `layer_output`-il)."""

    layer: int
    node: int  # the node's index
    rel_rms: float


def layer_errors(c: Comparison, output: str = "l_out") -> tuple[LayerPoint, ...]:
    """The relative RMS of each layer's output node (the last of that name), layer by layer."""
    found: dict[int, int] = {}
    for node in c.a.nodes:
        il = node_layer(node.name)
        if il is not None and node.name == f"{output}-{il}":
            found[il] = node.index
    return tuple(LayerPoint(il, i, c.diffs[i].rel_rms) for il, i in sorted(found.items()))
