"""llama-quantize: a GGUF model rewritten with its tensors in the types of a file type's mix.

Mirrors `llama_model_quantize_impl` (llama.cpp's src/llama-quant.cpp), so that the file written is
the one llama-quantize writes, byte for byte:
  * the tensors in the loader's order (`weights_map`: by layer, "blk.N." read as sscanf reads it,
    tensors outside the layers first, then by name), not the input file's order;
  * the input's key-value pairs in their order, then general.quantization_version (2) and
    general.file_type moved to the end (gguf_set_val removes a key before appending it), the split
    keys removed;
  * each tensor's type from engine/quants/mix.py, its bytes copied when the type is unchanged,
    else its rows converted to float (the type's to_float) and quantized by the engine's
    ggml_quantize_chunk without an importance matrix; data aligned to 32 bytes (llama-quantize's
    gguf_init_empty context keeps 32, whatever general.alignment says).
Errors are llama.cpp's, in its words and order (`QuantizeError`): a type that needs an importance
matrix is refused while planning, before any file is written; so is requantizing without
--allow-requantize, which llama.cpp only finds after it has begun writing.
Leaves out: the importance matrix, --tensor-type, --prune-layers, --keep-split, --override-kv and
split input files. The threads do not change the bytes (every row is quantized alone).
"""

from __future__ import annotations

import collections
import enum
import itertools
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from engine.core.tensor import n_dims_of
from engine.core.types import GGMLType, ggml_is_quantized, traits
from engine.quants import dequantize, quantize
from engine.quants.ftype import LLAMA_FTYPE_GUESSED, LlamaFtype, default_type, requires_imatrix
from engine.quants.mix import (ATTN_V_LIKE, Hparams, MixState, NoFallback, kept_because,
                               name_layer, tensor_category, tensor_type)

from .format import GGUF_DEFAULT_ALIGNMENT, GGUFValueType, pad
from .reader import GGUFReader, TensorInfo
from .writer import GGUFContext

GGML_QNT_VERSION = 2  # ggml.h: bumped when a quantized format changes
SPLIT_KEYS = ("split.no", "split.count", "split.tensors.count")
SLAB_ELEMENTS = 1 << 18  # rows converted at a time by one thread: the memory, the progress steps


class QuantizeError(ValueError):
    """llama-quantize's refusal, in its words."""


@dataclass(frozen=True, slots=True)
class QuantizeParams:
    """llama_model_quantize_params, the options that need no importance matrix."""

    ftype: LlamaFtype
    nthread: int = 0
    output_tensor_type: GGMLType | None = None  # --output-tensor-type
    token_embedding_type: GGMLType | None = None  # --token-embedding-type
    allow_requantize: bool = False  # --allow-requantize
    quantize_output_tensor: bool = True  # False: --leave-output-tensor
    only_copy: bool = False  # the COPY file type
    pure: bool = False  # --pure
    dry_run: bool = False  # --dry-run: plan only; what needs an imatrix is a warning, not an error


@dataclass(frozen=True, slots=True)
class TensorPlan:
    """One tensor of the output: where it comes from, the type it gets and why."""

    info: TensorInfo  # the input's tensor
    new_type: GGMLType
    why: str  # which rule chose the type (or why the tensor is kept)
    warning: str | None  # llama.cpp's fallback warning, when its rows did not fit the blocks
    new_size: int  # bytes in the output

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def converts(self) -> bool:
        """Does llama-quantize convert it (else it copies the bytes)?"""
        return self.info.type != self.new_type


@dataclass(frozen=True, slots=True)
class QuantizePlan:
    """Everything llama-quantize decides before it writes: the keys, the tensors, their types."""

    hparams: Hparams
    ftype: int  # written as general.file_type
    tensors: tuple[TensorPlan, ...]  # in the output's order
    context: GGUFContext  # the output's metadata (tensor infos without data)
    n_fallback: int  # tensors whose rows did not fill whole blocks of their type
    n_elements: int  # of every tensor (for bits per weight)
    needs_imatrix: bool = False  # (a dry run) writing it would need an importance matrix

    @property
    def size_org(self) -> int:
        return sum(t.info.nbytes for t in self.tensors)

    @property
    def size_new(self) -> int:
        return sum(t.new_size for t in self.tensors)


class Stage(enum.Enum):
    """Where the writing of a tensor is."""

    START = "start"
    ROWS = "rows"  # some of its rows converted
    DONE = "done"  # written, padding included


@dataclass(frozen=True, slots=True)
class QuantizeProgress:
    """How far the writing is: tensor `index` (from 1) of `count`, `rows_done` of `rows`."""

    stage: Stage
    index: int
    count: int
    tensor: TensorPlan
    rows_done: int
    rows: int


class _Out(GGUFContext):
    """llama-quantize's output context: gguf_init_empty's alignment of 32 stays, as in ggml,
    even when a copied general.alignment says otherwise."""

    alignment = GGUF_DEFAULT_ALIGNMENT


def read_hparams(r: GGUFReader) -> Hparams:
    """What llama_model_base::load_hparams reads that the mix needs (layer 0's heads)."""
    arch = r.get("general.architecture")
    if not isinstance(arch, str):
        raise QuantizeError("key not found in model: general.architecture")
    if arch == "clip":  # llama.cpp reads no hyperparameters of a projector
        return Hparams(arch, 0, 0, 0, False)
    n_layer = r.get(f"{arch}.block_count")
    if n_layer is None:
        raise QuantizeError(f"key not found in model: {arch}.block_count")
    n_layer = int(n_layer)
    n_nextn = int(r.get(f"{arch}.nextn_predict_layers", 0))
    n_expert = int(r.get(f"{arch}.expert_count", 0))
    if arch in ("hunyuan_vl", "hunyuan-dense") and n_expert <= 1:
        n_expert = 0

    def first(key: str, default: int) -> int:
        v = r.get(key)
        if v is None:
            return default
        return int(v[0]) if isinstance(v, (list, np.ndarray)) and len(v) else int(v)

    n_head = first(f"{arch}.attention.head_count", 0)
    n_head_kv = first(f"{arch}.attention.head_count_kv", n_head)
    n_gqa = n_head // n_head_kv if n_head_kv else 0
    return Hparams(arch, n_layer, n_expert, n_gqa, is_70b(arch, n_layer - n_nextn, n_expert,
                                                          n_head, n_head_kv))


# the architectures whose load_hparams calls a model LLM_TYPE_70B, at this many layers
LAYERS_70B = {"llama": 80, "deci": 80, "olmo": 80, "qwen2": 80, "jais2": 68}


def is_70b(arch: str, n_layer: int, n_expert: int, n_head: int, n_head_kv: int) -> bool:
    """llama.cpp's model type LLM_TYPE_70B (a llama of 80 layers only with grouped kv heads and
    not the 8-expert Mixtral table)."""
    if LAYERS_70B.get(arch) != n_layer:
        return False
    return arch != "llama" or (n_expert != 8 and n_head != n_head_kv)


def loader_order(tensors) -> list[TensorInfo]:
    """llama_model_loader's weights_map order: by layer (-1 outside the layers), then by name."""
    return sorted(tensors, key=lambda t: (name_layer(t.name),
                                          t.name.encode("utf-8", "surrogateescape")))


def guessed_ftype(r: GGUFReader, order: list[TensorInfo]) -> int:
    """The loader's ftype (for COPY): general.file_type, else the commonest tensor type's file
    type marked as guessed."""
    stored = r.get("general.file_type")
    if stored is not None:
        return int(stored)
    counts: dict[GGMLType, int] = {}
    best, most = GGMLType.F32, 0
    for t in order:
        counts[t.type] = counts.get(t.type, 0) + 1
        if counts[t.type] > most:
            best, most = t.type, counts[t.type]
    guess = {GGMLType.Q3_K: LlamaFtype.MOSTLY_Q3_K_M, GGMLType.Q4_K: LlamaFtype.MOSTLY_Q4_K_M,
             GGMLType.Q5_K: LlamaFtype.MOSTLY_Q5_K_M}.get(best)
    if guess is None:
        guess = next((f for f in LlamaFtype if f.name in (f"MOSTLY_{best.name}", f"ALL_{best.name}")),
                     LlamaFtype.ALL_F32)
    return int(guess) | LLAMA_FTYPE_GUESSED


def plan_quantize(r: GGUFReader, params: QuantizeParams,
                  warn: Callable[[str], object] | None = None) -> QuantizePlan:
    """llama_model_quantize_impl up to its main loop: the output's keys and tensor infos, each
    tensor's type (the preliminary loop), and llama.cpp's refusals. `warn` gets llama.cpp's
    fallback warnings as it prints them, in the loop (text with its line ends)."""
    hp = read_hparams(r)
    n_split = int(r.get("split.count", 1) or 1)
    if n_split > 1:
        raise QuantizeError(f"a file split in {n_split} (split.count): the engine reads one file; "
                            "join them first (llama-gguf-split --merge)")
    order = loader_order(r.tensors)
    default_type(params.ftype)  # an unknown file type is refused first
    ftype = guessed_ftype(r, order) if params.only_copy else int(params.ftype)
    out = _Out()
    out.kv.extend(GGUFContext.from_reader(r).kv)  # gguf_set_kv: the input's pairs, in order
    out.set_val("general.quantization_version", GGUFValueType.UINT32, GGML_QNT_VERSION)
    out.set_val("general.file_type", GGUFValueType.UINT32, ftype & 0xFFFFFFFF)
    for key in SPLIT_KEYS:
        out.remove_key(key)

    state = MixState(n_layer=hp.n_layer)
    for t in order:  # init_quantize_state_counters
        state.n_attention_wv += tensor_category(t.name) in ATTN_V_LIKE
        state.tied &= t.name != "output.weight"
    plans, needs_imatrix = [], False
    for t in order:
        kept = kept_because(t.name, n_dims_of(t.ne), hp.arch, only_copy=params.only_copy,
                            quantize_output_tensor=params.quantize_output_tensor)
        if kept is not None:
            new_type, why, warning = t.type, f"kept: {kept}", None
        else:
            try:
                choice = tensor_type(state, LlamaFtype(params.ftype), hp, t.name, t.ne,
                                     pure=params.pure, output_type=params.output_tensor_type,
                                     token_embedding_type=params.token_embedding_type)
            except NoFallback as e:
                if warn:
                    warn(e.warning)  # the line llama.cpp had begun
                raise QuantizeError(str(e)) from None
            new_type, why, warning = choice.type, choice.why, choice.fallback
            if warning and warn:
                warn(warning + "\n")
            needs = requires_imatrix(t.name, new_type, params.ftype)
            needs_imatrix |= needs
            if needs and not params.dry_run:
                raise QuantizeError(
                    "this quantization requires an importance matrix!\n"
                    f"        - offending tensor: {t.name}\n"
                    f"        - target type: {traits(new_type).type_name}")
        tr = traits(new_type)
        if t.ne[0] % tr.blck_size:
            raise QuantizeError(f"{t.name}: rows of {t.ne[0]} do not fill {tr.type_name}'s blocks "
                                f"of {tr.blck_size} (llama-quantize aborts in ggml_quantize_chunk)")
        out.add_tensor(t.name, new_type, t.ne, None)
        new_size = t.nbytes if new_type == t.type else out.info[-1].nbytes
        plans.append(TensorPlan(t, new_type, why, warning, new_size))
    for p in () if params.dry_run else plans:  # what llama.cpp's main loop finds, writing
        if p.converts and ggml_is_quantized(p.info.type) and not params.allow_requantize:
            raise QuantizeError(f"requantizing from type {traits(p.info.type).type_name} is "
                                "disabled")
        if p.converts and p.info.type not in (GGMLType.F32, GGMLType.F16, GGMLType.BF16) \
                and not ggml_is_quantized(p.info.type):
            raise QuantizeError(f"cannot dequantize/convert tensor type "
                                f"{traits(p.info.type).type_name}")
    return QuantizePlan(hp, ftype, tuple(plans), out, state.n_fallback,
                        sum(t.n_elements for t in r.tensors), needs_imatrix)


def write_quantized(r: GGUFReader, plan: QuantizePlan, fname_out: str | os.PathLike,
                    progress: Callable[[QuantizeProgress], None] | None = None,
                    nthread: int = 0) -> None:
    """llama-quantize's main loop: the metadata, then each tensor's bytes (copied, or converted
    slab by slab of rows on `nthread` threads, 0: one per CPU), each padded with zeros to 32."""
    align = GGUF_DEFAULT_ALIGNMENT
    count = len(plan.tensors)
    nthread = nthread if nthread > 0 else os.cpu_count() or 1
    with open(fname_out, "wb") as f, ThreadPoolExecutor(nthread) as pool:
        try:
            f.write(plan.context.to_bytes(only_meta=True))
            for index, p in enumerate(plan.tensors, 1):
                t = p.info
                rows = t.ne[1] * t.ne[2] * t.ne[3]
                if progress:
                    progress(QuantizeProgress(Stage.START, index, count, p, 0, rows))
                raw = r.tensor_bytes(t)
                if not p.converts:
                    f.write(raw.data)
                else:
                    for done, chunk in converted_rows(t, p.new_type, raw, pool, 2 * nthread):
                        f.write(chunk)
                        if progress and done < rows:
                            progress(QuantizeProgress(Stage.ROWS, index, count, p, done, rows))
                f.write(bytes(pad(p.new_size, align) - p.new_size))
                if progress:
                    progress(QuantizeProgress(Stage.DONE, index, count, p, rows, rows))
        except BaseException:
            f.close()
            os.unlink(fname_out)
            raise


def converted_rows(t: TensorInfo, new_type: GGMLType, raw: np.ndarray, pool: ThreadPoolExecutor,
                   depth: int = 4):
    """A tensor's rows in `new_type`, a slab at a time, in order: (rows done, bytes) for each slab.
    Each row goes to float32 by its type's to_float, then through ggml_quantize_chunk's quantizer;
    the pool's threads take slabs (numpy lets go of the GIL in its loops; rows are independent, so
    the bytes do not depend on the threads), `depth` slabs ahead of the writer."""
    n_per_row = t.ne[0]
    rows = t.ne[1] * t.ne[2] * t.ne[3]
    row_size = t.nb[1]
    step = max(1, SLAB_ELEMENTS // max(n_per_row, 1))

    def slab(first: int) -> bytes:
        n = min(step, rows - first)
        src = raw[first * row_size:(first + n) * row_size]
        x = dequantize(t.type, src, n * n_per_row).reshape(n, n_per_row)
        return quantize(new_type, x).tobytes()

    firsts = iter(range(0, rows, step))
    ahead: collections.deque[tuple[int, Future[bytes]]] = collections.deque()
    for first in itertools.islice(firsts, depth):
        ahead.append((first, pool.submit(slab, first)))
    while ahead:
        first, job = ahead.popleft()
        nxt = next(firsts, None)
        if nxt is not None:
            ahead.append((nxt, pool.submit(slab, nxt)))
        yield min(first + step, rows), job.result()


def llama_model_quantize(fname_inp: str | os.PathLike, fname_out: str | os.PathLike,
                         params: QuantizeParams,
                         progress: Callable[[QuantizeProgress], None] | None = None) -> QuantizePlan:
    """llama_model_quantize: plan, then write `fname_out`; returns the plan (types, sizes, why)."""
    with GGUFReader(fname_inp) as r:
        plan = plan_quantize(r, params)
        write_quantized(r, plan, fname_out, progress, params.nthread)
    return plan


__all__ = ["QuantizeError", "QuantizeParams", "QuantizePlan", "TensorPlan", "QuantizeProgress", "Stage",
           "llama_model_quantize", "plan_quantize", "write_quantized", "read_hparams"]
