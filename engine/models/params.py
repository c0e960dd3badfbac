"""The settings a model runs with: llama.cpp's context parameters, its defaults and its refusals.

`ContextParams` is what a user asks for, under the names of llama.cpp's options (llama-cli's
-c, -b, -ub, -t, -fa, -ctk, -ctv, -nr, --swa-full, -lm; the fields of common_params and
llama_context_params they set), with common_params' defaults: the model's own context, batches
of 2048 tokens split into ubatches of 512, flash attention `auto`, an F16 K and V cache, the
weights repacked. Values llama.cpp's argument parser rejects are rejected here with its words
("Unsupported cache type: q3_K").

`ContextParams.resolve(...)` is what llama_init_from_model and the llama_context constructor
make of them for one model (`CParams`, llama.cpp's llama_cparams): the context padded to a
multiple of 256 cells, n_batch at most the context (causal attention), n_ubatch at most n_batch,
`auto` flash attention decided (on: the CPU backend computes FLASH_ATTN_EXT for every K and V
type; llama.cpp turns it off only for Grok, which the engine does not build), and its refusals
with its words: a quantized V cache without flash attention, a quantized cache type whose block
does not divide the head size, n_batch and n_ubatch both zero.
Leaves out: several sequences (n_seq_max), a SWA cache smaller than the context (swa_full off
with a context longer than the window plus a ubatch: `CParams.swa_cells` says how many cells
llama.cpp would give it), GPU offload, the threads of a hybrid CPU's efficiency cores.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from engine.core.types import GGMLType, TYPE_TRAITS

# common/arg.cpp's kv_cache_types: what -ctk and -ctv accept, in its order
KV_CACHE_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q8_0, GGMLType.Q4_0,
                  GGMLType.Q4_1, GGMLType.IQ4_NL, GGMLType.Q5_0, GGMLType.Q5_1)
FLASH_ATTN = ("on", "off", "auto")  # llama_flash_attn_type: ENABLED, DISABLED, AUTO
# what common/arg.cpp's is_truthy / is_falsey / is_autoy read as each (a bool: on or off)
_FA_WORDS = {"on": "on", "enabled": "on", "true": "on", "1": "on",
             "off": "off", "disabled": "off", "false": "off", "0": "off",
             "auto": "auto", "-1": "auto"}
# common/arg.cpp's -lm / --load-mode values the engine runs: `auto` and `mmap` map the file (the CPU
# weights are its pages, a CPU_Mapped buffer), `none` reads the weights into a CPU buffer
LOAD_MODES = ("auto", "none", "mmap")
CTX_PAD = 256  # llama_context pads n_ctx (and n_ctx_seq) to a multiple of this
ROT_MIN = 64  # llama_kv_cache: the Hadamard rotation of a quantized cache, at least 64 wide


class ParamsError(ValueError):
    """Settings llama.cpp refuses: the message is llama.cpp's own where it has one."""


def cache_type(name: str | int) -> GGMLType:
    """kv_cache_type_from_str: a K/V cache type by its ggml name ("q8_0") or number."""
    if isinstance(name, str):
        for t in KV_CACHE_TYPES:
            if TYPE_TRAITS[t].type_name == name:
                return t
        raise ParamsError(f"Unsupported cache type: {name}")
    if int(name) not in {int(t) for t in KV_CACHE_TYPES}:
        raise ParamsError(f"Unsupported cache type: {TYPE_TRAITS[int(name)].type_name}"
                          if 0 <= int(name) < len(TYPE_TRAITS) and TYPE_TRAITS[int(name)]
                          else f"Unsupported cache type: {name}")
    return GGMLType(int(name))


def physical_cores() -> int:
    """common_cpu_get_num_physical_cores on Linux: the sets of thread siblings (one per core);
    the CPU count where /sys does not say."""
    siblings = set()
    cpu = 0
    while True:
        try:
            with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings") as f:
                siblings.add(f.readline().strip())
        except OSError:
            break
        cpu += 1
    return len(siblings) or os.cpu_count() or 4


@dataclass(frozen=True, slots=True)
class ContextParams:
    """What a run asks llama.cpp's context for, with llama.cpp's (common_params') defaults."""

    n_ctx: int = 0  # -c: the KV cache's cells; 0: the model's context_length (n_ctx_train)
    n_batch: int = 2048  # -b: the most tokens one llama_decode takes (a prompt goes in such batches)
    n_ubatch: int = 512  # -ub: the most tokens one graph computes (a batch splits into these)
    n_threads: int = -1  # -t: compute threads; -1: one per physical core (cpu_get_num_math)
    flash_attn: str = "auto"  # -fa: "on", "off" or "auto" (llama_flash_attn_type; its other words too)
    type_k: GGMLType = GGMLType.F16  # -ctk (cache_type_k): the K cache's type, one of KV_CACHE_TYPES
    type_v: GGMLType = GGMLType.F16  # -ctv (cache_type_v): the V cache's; quantized only with FA
    no_repack: bool = False  # -nr (no_extra_bufts): weights stay as the file has them
    swa_full: bool = False  # --swa-full: the sliding-window layers' cache as large as the context
    load_mode: str = "auto"  # -lm: "auto" or "mmap" map the file, "none" reads it (LOAD_MODES)

    def __post_init__(self) -> None:
        if self.load_mode not in LOAD_MODES:
            raise ParamsError(f"error: invalid argument: {self.load_mode} (-lm: ggml-lens runs "
                              + ", ".join(LOAD_MODES) + ")")
        fa = {True: "on", False: "off"}.get(self.flash_attn) if isinstance(self.flash_attn, bool) \
            else _FA_WORDS.get(str(self.flash_attn))
        if fa is None:
            raise ParamsError(f"error: unknown value for --flash-attn: '{self.flash_attn}'")
        object.__setattr__(self, "flash_attn", fa)
        object.__setattr__(self, "type_k", cache_type(self.type_k))
        object.__setattr__(self, "type_v", cache_type(self.type_v))
        for name in ("n_ctx", "n_batch", "n_ubatch"):
            if int(getattr(self, name)) < 0:
                raise ParamsError(f"{name} must not be negative (got {getattr(self, name)})")
        if self.n_batch == 0 and self.n_ubatch == 0:
            raise ParamsError("n_batch and n_ubatch cannot both be zero")
        if self.n_threads == 0 or self.n_threads < -1:
            raise ParamsError(f"n_threads must be at least 1, or -1 for one per physical core "
                              f"(got {self.n_threads})")

    def with_(self, **changes) -> "ContextParams":
        """A copy with some fields changed (checked again)."""
        return replace(self, **changes)

    @property
    def use_mmap(self) -> bool:
        """llama_model_loader's use_mmap: the CPU weights are the file's mapped pages."""
        return self.load_mode != "none"

    def threads(self) -> int:
        """n_threads, -1 resolved as postprocess_cpu_params does (cpu_get_num_math)."""
        return physical_cores() if self.n_threads < 0 else self.n_threads

    def resolve_flash_attn(self, arch: str) -> bool:
        """`auto` decided as llama.cpp decides it on the CPU backend: the context builds a
        reserve graph with flash attention and keeps it if the FLASH_ATTN_EXT nodes land on the
        layers' device, which the CPU's always do; a quantized V cache asks for it anyway
        ("enabling flash_attn since it is required for quantized V cache"). Grok is the one
        architecture llama.cpp turns it off for."""
        if self.flash_attn == "off":
            return False
        return arch != "grok"

    def resolve(self, arch: str, n_ctx_train: int, head_k: int, head_v: int) -> "CParams":
        """llama_init_from_model's checks and llama_context's settings for a model of this
        architecture, training context and K/V head sizes (every layer's, here one each)."""
        if self.n_ctx == 0 and n_ctx_train == 0:
            raise ParamsError("n_ctx and model->hparams.n_ctx_train cannot both be zero")
        flash = self.resolve_flash_attn(arch)
        for what, t, head in (("K", self.type_k, head_k), ("V", self.type_v, head_v)):
            tr = TYPE_TRAITS[t]
            if flash and tr.is_quantized and head % tr.blck_size:
                raise ParamsError(f"{what} cache type {tr.type_name} with block size "
                                  f"{tr.blck_size} does not divide n_embd_head_{what.lower()}"
                                  f"={head}")
        if TYPE_TRAITS[self.type_v].is_quantized and not flash:
            raise ParamsError("quantized V cache requires flash_attn to be enabled")
        asked = self.n_ctx or n_ctx_train
        n_ctx = -(-asked // CTX_PAD) * CTX_PAD
        n_batch = min(asked, self.n_batch)  # causal attention: no more than the context asked
        n_ubatch = min(n_batch, self.n_ubatch or self.n_batch)
        return CParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch, n_threads=self.threads(),
                       flash_attn=flash, type_k=self.type_k, type_v=self.type_v,
                       no_repack=self.no_repack, swa_full=self.swa_full, tiled=tiled_mm())


@dataclass(frozen=True, slots=True)
class CParams:
    """llama_cparams (in part): the settings a model's context runs with, resolved."""

    n_ctx: int  # the KV cache's cells (a multiple of 256), the most tokens a sequence holds
    n_batch: int  # tokens per llama_decode
    n_ubatch: int  # tokens per graph
    n_threads: int
    flash_attn: bool  # FLASH_ATTN_EXT (V cache not transposed, F16 mask) or KQ, softmax, KQV
    type_k: GGMLType
    type_v: GGMLType
    no_repack: bool
    swa_full: bool
    tiled: bool = False  # ggml-cpu's tiled K-quant products (GGML_CPU_TILED_MM: tiled_mm())

    @classmethod
    def plain(cls, n_ctx: int) -> "CParams":
        """The engine's own settings for a model opened without ContextParams: n_ctx cells as
        given, no flash attention, an F16 cache, the whole prompt in one graph, one thread."""
        return cls(n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=1, flash_attn=False,
                   type_k=GGMLType.F16, type_v=GGMLType.F16, no_repack=True, swa_full=True)

    @property
    def v_trans(self) -> bool:
        """Is the V cache transposed (each head element a row of cells)? Without flash attention."""
        return not self.flash_attn

    def swa_cells(self, n_swa: int) -> int:
        """llama_kv_cache_iswa's SWA cache size: the window plus a ubatch, padded to 256, at most
        the context; the whole context with swa_full."""
        if self.swa_full:
            return self.n_ctx
        return -(-min(self.n_ctx, n_swa + self.n_ubatch) // CTX_PAD) * CTX_PAD

    def batches(self, n: int) -> list[tuple[int, int]]:
        """The ubatches of n tokens, as [start, end): batches of n_batch (as llama-cli hands a
        prompt to llama_decode), each split by llama_batch_allocr::split_simple into n_ubatch."""
        out = []
        for b0 in range(0, n, self.n_batch):
            b1 = min(n, b0 + self.n_batch)
            out += [(u, min(b1, u + self.n_ubatch)) for u in range(b0, b1, self.n_ubatch)]
        return out


def tiled_mm() -> bool:
    """GGML_CPU_TILED_MM as llama.cpp's ggml-cpu reads it: on unless set to a number that is 0
    (ggml reads it once a process; the engine when a model's context is made, so that a test
    or a learner can flip it between runs)."""
    env = os.environ.get("GGML_CPU_TILED_MM")
    if env is None:
        return True
    digits = env.strip()
    sign = digits[:1] if digits[:1] in "+-" else ""
    digits = digits[len(sign):]
    n = len(digits) - len(digits.lstrip("0123456789"))
    return bool(int(digits[:n] or "0"))  # atoi: the leading digits, 0 when there are none


def rotation(type_: int, head: int, k: bool) -> int:
    """The width of llama_kv_cache's Hadamard rotation (attn_rot_k / attn_rot_v) of a cache of
    this type and head size, 0 for none: a quantized cache whose heads are a multiple of 64 is
    rotated, K by the largest power of two dividing the head (64 at least), V by 64."""
    if not TYPE_TRAITS[type_].is_quantized or head % ROT_MIN:
        return 0
    if not k:
        return ROT_MIN
    n = ROT_MIN
    while head % (2 * n) == 0:
        n *= 2
    return n
