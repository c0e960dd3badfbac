"""The memory plan page's settings: llama.cpp's flags read from a query, checked and capped.

A plan page's query holds llama.cpp's flags without their dashes (c, b, ub, ctk, ctv, fa, nr,
swa-full, lm) and the --fit inverse (fit: the memory there is, 8G or 1536M; fitt: the MiB
llama-fit-params leaves free). Every value arrives as text from a stranger: it is read here,
each count checked against a cap before plan() is asked anything, and what llama.cpp refuses
(ContextParams: "Unsupported cache type: q3_K") comes back in its words. The caps: a context up
to the model's own (context_length, or --fit's least context if that is more; CTX_NO_TRAIN for
a file without one; CTX_HARD at most),
batches no larger, and files of at most LAYERS_MAX layers and TENSORS_MAX tensors -- a plan's
time grows with the layers (its graphs are built node by node), not with the context (they are
planned, never allocated).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from enum import Enum
from urllib.parse import urlencode

from app.cli_plan import size_arg
from app.i18n import N_, _
from app.views.format import human_bytes, visible_text
from engine.core.types import TYPE_TRAITS
from engine.gguf import GGUFReader
from engine.models.params import FLASH_ATTN, KV_CACHE_TYPES, LOAD_MODES, ContextParams, \
    ParamsError, cache_type
from engine.models.plan import FIT_MARGIN, FIT_MIN_CTX

MIB = 1 << 20
CTX_HARD = 1 << 24  # the most cells any file is planned with, whatever context it declares
CTX_NO_TRAIN = 1 << 17  # the most for a file that declares no context_length
LAYERS_MAX = 256  # a file's layers (block_count) a plan is built for
TENSORS_MAX = 8192  # a file's tensors
FIT_LAYERS_MAX = 128  # --fit makes a plan per halving of the context (8 to 20): files this deep
FIT_MAX = 1 << 50  # the most memory --fit is asked about (1 PiB)
FITT_MAX = 1 << 20  # the most MiB --fit leaves free
TEXT_MAX = 32  # characters of a value read (and shown back)
_DEFAULTS = ContextParams()


class InputKind(Enum):
    COUNT = "count"  # a whole number (-c 4096)
    WORD = "word"  # one of llama.cpp's words (-fa on, -ctk q8_0)
    SWITCH = "switch"  # given or not (-nr): a checkbox
    SIZE = "size"  # bytes, with a binary unit (--fit 8G)


@dataclass(frozen=True, slots=True)
class PlanSetting:
    key: str  # its name in the query: the flag without its dashes
    flag: str  # llama.cpp's
    kind: InputKind
    default: str  # as the query writes it ("": not given)
    choices: tuple[str, ...]  # a WORD's
    help: str  # what it changes (N_: translated when shown)


SETTINGS: tuple[PlanSetting, ...] = (
    PlanSetting("c", "-c", InputKind.COUNT, "", (), N_(
        "the cells the KV cache holds; empty or 0: the model's own context, llama.cpp's default")),
    PlanSetting("b", "-b", InputKind.COUNT, str(_DEFAULTS.n_batch), (), N_(
        "the most tokens one llama_decode takes")),
    PlanSetting("ub", "-ub", InputKind.COUNT, str(_DEFAULTS.n_ubatch), (), N_(
        "the most tokens one graph computes: the worst-case graph's tokens")),
    PlanSetting("ctk", "-ctk", InputKind.WORD, TYPE_TRAITS[_DEFAULTS.type_k].type_name,
                tuple(TYPE_TRAITS[t].type_name for t in KV_CACHE_TYPES), N_("the K cache's type")),
    PlanSetting("ctv", "-ctv", InputKind.WORD, TYPE_TRAITS[_DEFAULTS.type_v].type_name,
                tuple(TYPE_TRAITS[t].type_name for t in KV_CACHE_TYPES),
                N_("the V cache's type (a quantized one only with flash attention)")),
    PlanSetting("fa", "-fa", InputKind.WORD, _DEFAULTS.flash_attn, FLASH_ATTN, N_(
        "flash attention: auto is on, as llama.cpp decides on the CPU")),
    PlanSetting("nr", "-nr", InputKind.SWITCH, "", (), N_(
        "no repacking: the weights stay in the file's layout, no CPU_REPACK buffer")),
    PlanSetting("swa-full", "--swa-full", InputKind.SWITCH, "", (), N_(
        "the sliding-window layers' cache as large as the context")),
    PlanSetting("lm", "-lm", InputKind.WORD, _DEFAULTS.load_mode, LOAD_MODES, N_(
        "load mode: auto or mmap, the weights are the file's mapped pages (CPU_Mapped); none, "
        "they are read into a CPU buffer")),
    PlanSetting("fit", "--fit", InputKind.SIZE, "", (), N_(
        "the memory there is (8G, 1536M...): the largest context that fits it")),
    PlanSetting("fitt", "-fitt", InputKind.COUNT, str(FIT_MARGIN // MIB), (), N_(
        "with --fit, the MiB llama-fit-params leaves free")),
)
BY_KEY = {s.key: s for s in SETTINGS}
_SWITCH_WORDS = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False,
                 "": False}


@dataclass(frozen=True, slots=True)
class FileFacts:
    """What the form needs of a file before any plan: its architecture, its own context and
    its size in layers and tensors (the caps are checked on them)."""

    arch: str
    n_ctx_train: int  # context_length (0: not declared)
    n_layer: int  # block_count (0: not declared)
    n_tensors: int

    @property
    def ctx_cap(self) -> int:
        """The most cells this page plans the file with: its own context (never less than
        the least context --fit goes down to), at most CTX_HARD."""
        return min(max(self.n_ctx_train, FIT_MIN_CTX) if self.n_ctx_train else CTX_NO_TRAIN,
                   CTX_HARD)

    @property
    def batch_cap(self) -> int:
        return max(self.ctx_cap, _DEFAULTS.n_batch)


def file_facts(r: GGUFReader) -> FileFacts:
    arch = r.get("general.architecture")
    arch = arch if isinstance(arch, str) else ""

    def number(key: str) -> int:
        v = r.get(f"{arch}.{key}")
        return int(v) if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    return FileFacts(arch, number("context_length"), number("block_count"), r.n_tensors)


def too_large(facts: FileFacts) -> str:
    """Why this file is not planned here ("" when it is)."""
    if facts.n_layer > LAYERS_MAX:
        return _("This file has {n} layers; this page plans files of at most {most} (a plan's time "
                 "grows with the layers).").format(n=f"{facts.n_layer:,}", most=LAYERS_MAX)
    if facts.n_tensors > TENSORS_MAX:
        return _("This file has {n} tensors; this page plans files of at most {most}.").format(
            n=f"{facts.n_tensors:,}", most=f"{TENSORS_MAX:,}")
    return ""


def fit_too_large(facts: FileFacts) -> str:
    """Why --fit is not answered for this file here ("" when it is)."""
    if facts.n_layer > FIT_LAYERS_MAX:
        return _("--fit makes a plan for each halving of the context: this page answers it for files of at most "
                 "{most} layers (this one has {n}); ggml-lens plan FILE --fit answers it for any.").format(
            most=FIT_LAYERS_MAX, n=f"{facts.n_layer:,}")
    return too_large(facts)


@dataclass(frozen=True, slots=True)
class Asked:
    """A plan page's query, read: the values as given (for the form), the settings made of
    them, and every reason they were refused."""

    values: dict[str, str]  # key -> text as given (cut to TEXT_MAX), "" when not given
    params: ContextParams | None  # None: refused (errors says why)
    mmap: bool  # the weights are the file's mapped pages (-lm auto or mmap: params.use_mmap)
    fit: int | None  # --fit's bytes (None: not asked)
    margin: int  # bytes --fit leaves free
    errors: tuple[str, ...]

    def query(self) -> str:
        """The query that names this plan: the values given that are not the defaults."""
        pairs = [(s.key, self.values[s.key]) for s in SETTINGS
                 if self.values[s.key] not in ("", s.default)
                 and not (s.kind == InputKind.SWITCH and not _SWITCH_WORDS.get(self.values[s.key].lower(), True))]
        return urlencode(pairs)

    def on(self, key: str) -> bool:
        """A switch's state as the form shows it."""
        return _SWITCH_WORDS.get(self.values[key].lower(), True)


def _count(s: PlanSetting, text: str, most: int, why: str, errors: list[str]) -> int:
    if not re.fullmatch(r"\d{1,19}", text):
        errors.append(_("{flag} '{value}': not a whole number").format(flag=s.flag, value=text))
        return 0
    n = int(text)
    if n > most:
        errors.append(_("{flag} {n}: at most {most} here ({why})").format(
            flag=s.flag, n=f"{n:,}", most=f"{most:,}", why=why))
    return n


def read_asked(query, facts: FileFacts) -> Asked:
    """The settings of a plan page's query (a mapping of text values), checked for this file."""
    values = {s.key: visible_text(str(query.get(s.key, "")).strip(), TEXT_MAX) for s in SETTINGS}
    errors: list[str] = []
    v = {k: (x or BY_KEY[k].default) for k, x in values.items()}
    own = _("the model's own context") if facts.ctx_cap == facts.n_ctx_train \
        else _("this page's cap")
    n_ctx = _count(BY_KEY["c"], v["c"], facts.ctx_cap, own, errors) if v["c"] else 0
    batch_why = _("the context's cap")
    n_batch = _count(BY_KEY["b"], v["b"], facts.batch_cap, batch_why, errors)
    n_ubatch = _count(BY_KEY["ub"], v["ub"], facts.batch_cap, batch_why, errors)
    switches = {}
    for key in ("nr", "swa-full"):
        word = _SWITCH_WORDS.get(v[key].lower())
        if word is None:
            errors.append(_("{flag} is a switch: 1 (given) or 0, not '{value}'").format(
                flag=BY_KEY[key].flag, value=v[key]))
        switches[key] = bool(word)
    fit, margin = None, FIT_MARGIN
    if v["fit"]:
        try:
            fit = size_arg(v["fit"])
        except argparse.ArgumentTypeError:
            errors.append(_("--fit '{value}': not a size (bytes, or 512M, 8G, 8GiB)").format(
                value=v["fit"]))
        else:
            if fit > FIT_MAX:
                errors.append(_("--fit {value}: at most {most} here").format(
                    value=v["fit"], most=human_bytes(FIT_MAX)))
    margin = _count(BY_KEY["fitt"], v["fitt"], FITT_MAX, human_bytes(FITT_MAX * MIB), errors) * MIB
    params = None
    if not errors:
        try:
            params = ContextParams(n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_ubatch,
                                   flash_attn=v["fa"], type_k=cache_type(v["ctk"]),
                                   type_v=cache_type(v["ctv"]),
                                   no_repack=switches["nr"], swa_full=switches["swa-full"],
                                   load_mode=v["lm"])
        except ParamsError as e:
            errors.append(str(e))
    return Asked(values, params, params is None or params.use_mmap, fit if not errors else None, margin,
                 tuple(errors))


def plan_url(key: str, asked: Asked, **change: str) -> str:
    """The page of the plan of file `key` with these settings (and some changed)."""
    if change:
        asked = Asked({**asked.values, **change}, asked.params, asked.mmap, asked.fit,
                      asked.margin, asked.errors)
    q = asked.query()
    return f"/plan/{key}" + (f"?{q}" if q else "")
