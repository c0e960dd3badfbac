"""Which type llama-quantize gives each tensor of a model for a file type: the quantization mix.

Mirrors src/llama-quant.cpp: `tensor_allows_quantization` (which tensors are never touched: 1-D
ones, norms, routers, small tables; `KEEP` below), `tensor_get_category` (a tensor's role from its
name), `llama_tensor_get_type` with its `_impl` (the mix: Q4_K_M gives half the attention values
and feed-forward outputs Q6_K, by layer; the output head Q6_K; the IQ mixes their own), and
`tensor_type_fallback`. The mix is a table of rules (`RULES`, one ordered chain per role, the first
rule that holds decides, as llama.cpp's else-if chains do), and every choice says which rule made
it (`Choice.why`), so the command line can print why each tensor got its type.
State carries over between tensors as in llama.cpp: the attention-value and feed-forward counters
(`MixState`) count the tensors seen so far in the loader's order (engine/gguf/quantize.py).
Leaves out: the importance matrix (these rules are llama.cpp's with no imatrix: `has_imatrix`
false) and `--tensor-type` overrides.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Callable

from engine.core.types import GGMLType, ggml_is_quantized, traits
from engine.quants.ftype import LlamaFtype, default_type, fallback_type, ftype_label

F = LlamaFtype
T = GGMLType


class Category(enum.Enum):
    """tensor_category: a tensor's role, from its name (broader than llama.cpp's tensor names)."""

    TOKEN_EMBD = "token_embd"
    ATTENTION_Q = "attn_q"
    ATTENTION_V = "attn_v"
    ATTENTION_K = "attn_k"
    ATTENTION_QKV = "attn_qkv"
    ATTENTION_KV_B = "attn_kv_b"
    ATTENTION_OUTPUT = "attn_output"
    FFN_UP = "ffn_up"
    FFN_GATE = "ffn_gate"
    FFN_DOWN = "ffn_down"
    OUTPUT = "output"
    OTHER = "other"


C = Category
# tensor_get_category's tests in its order: an exact name, else the first substring found
_CATEGORY_BY_NAME = {"output.weight": C.OUTPUT, "token_embd.weight": C.TOKEN_EMBD,
                     "per_layer_token_embd.weight": C.TOKEN_EMBD}
_CATEGORY_BY_PART = (("attn_qkv.weight", C.ATTENTION_QKV), ("attn_kv_b.weight", C.ATTENTION_KV_B),
                     ("attn_v.weight", C.ATTENTION_V), ("attn_k.weight", C.ATTENTION_K),
                     ("attn_q.weight", C.ATTENTION_Q), ("attn_output.weight", C.ATTENTION_OUTPUT),
                     ("ffn_up", C.FFN_UP), ("ffn_gate", C.FFN_GATE), ("ffn_down", C.FFN_DOWN))
# category_is_attn_v: the attention-value-like tensors, more sensitive to quantization (a fused
# QKV counts as one, so llama.cpp's separate branch for attn_qkv is never reached)
ATTN_V_LIKE = frozenset({C.ATTENTION_V, C.ATTENTION_QKV, C.ATTENTION_KV_B})


def tensor_category(name: str) -> Category:
    """tensor_get_category."""
    if name in _CATEGORY_BY_NAME:
        return _CATEGORY_BY_NAME[name]
    return next((c for part, c in _CATEGORY_BY_PART if part in name), C.OTHER)


# tensor_allows_quantization: the 2-D+ "...weight" tensors kept as they are, by a part of their
# name (every architecture), and the reason
KEEP = (
    ("_norm.weight", "a norm's weight"),
    ("ffn_gate_inp.weight", "the experts' router"),
    ("ffn_gate_tid2eid.weight", "the token-to-expert routing table"),
    ("altup", "altup's small matrices"), ("laurel", "laurel's small matrices"),
    ("per_layer_model_proj", "the per-layer projection (small)"),
    ("ssm_conv1d", "the SSM's small conv1d"), ("shortconv.conv.weight", "the small short conv"),
    ("indexer.k_proj.weight", "the indexer's small projection"),
    ("indexer.q_proj.weight", "the indexer's small projection"),
    *((f"time_mix_{p}.weight", "RWKV's small 2-D weights") for p in (
        "first", "w0", "w1", "w2", "v0", "v1", "v2", "a0", "a1", "a2", "g1", "g2", "decay_w1",
        "decay_w2", "lerp_fused")),
    ("attn_rel_b.weight", "T5's relative position bias"),
    *((p, "a multimodal tensor kept as it is") for p in (
        ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd",
        ".patch_merger")),
    ("a.rvq.codebook", "an audio codebook"), ("mm.a.code_embd", "an audio codebook"),
)
KEEP_NAMES = {"position_embd.weight": "positional embeddings",
              "token_types.weight": "BERT's token types"}
KEEP_BY_ARCH = {"glm5-next": tuple((p, "glm5-next keeps it") for p in (
    "hc_", "indexer.attn_q_b", "indexer.attn_k", "indexer.proj", "indexer_compressor_gate",
    "indexer_compressor_ape", "ssm_f_a.weight", "ssm_f_b.weight", "ssm_g_a.weight",
    "ssm_g_b.weight", "ssm_beta.weight", "attn_kv_a_mqa.weight", "attn_k_b.weight",
    "attn_v_b.weight"))}


def kept_because(name: str, n_dims: int, arch: str, *, only_copy: bool = False,
                 quantize_output_tensor: bool = True) -> str | None:
    """tensor_allows_quantization, inverted: why the tensor keeps its type, or None if it may
    be quantized."""
    if only_copy:
        return "COPY: every tensor is copied"
    if n_dims < 2:
        return "a 1-D tensor"
    # llama.cpp asks whether the last "weight" is at size - 6; for a name of 5 characters that
    # unsigned difference is npos, which is also what rfind returns when there is none
    if not (name.endswith("weight") or len(name) == 5):
        return "not a weight"
    if not quantize_output_tensor and name == "output.weight":
        return "--leave-output-tensor"
    for part, why in KEEP + KEEP_BY_ARCH.get(arch, ()):
        if part in name:
            return why
    return KEEP_NAMES.get(name)


@dataclass(frozen=True, slots=True)
class Hparams:
    """What the mix reads of a model's hyperparameters (llama.cpp's llama_hparams, layer 0)."""

    arch: str
    n_layer: int  # n_layer_all: the blocks, next-token-prediction layers included
    n_expert: int
    n_gqa: int  # n_head / n_head_kv of layer 0 (0 without kv heads)
    is_70b: bool  # llama.cpp's LLM_TYPE_70B (8 heads share each attn_v: it gets more bits)


@dataclass(slots=True)
class MixState:
    """quantize_state_impl's counters: they advance as the loader's order reaches tensors."""

    n_attention_wv: int = 0  # attention-value-like tensors in the file
    n_layer: int = 0  # n_ffn_down = n_ffn_gate = n_ffn_up
    tied: bool = True  # no output.weight: the token embeddings are the output head too
    i_attention_wv: int = 0
    i_ffn_down: int = 0
    i_ffn_gate: int = 0
    i_ffn_up: int = 0
    n_fallback: int = 0


@dataclass(frozen=True, slots=True)
class RuleInput:
    """What a rule may look at: the file type, the model, the tensor, its layer in the count."""

    ftype: LlamaFtype
    hp: Hparams
    category: Category
    nx: int  # ne[0]: the elements of a row
    ne2: int  # ne[2]: the experts of a 3-D tensor
    default: GGMLType  # the file type's default type
    i: int  # the tensor's layer (or the count of its kind so far)
    n: int  # the layers (or the count of its kind in the file)


@dataclass(frozen=True, slots=True)
class Rule:
    """One arm of llama.cpp's else-if chains: for these file types (None: any), when `when`
    holds, the tensor gets `type`."""

    ftypes: frozenset[LlamaFtype] | None
    type: GGMLType
    why: str  # told as: why.format(i=, n=, arch=)
    when: Callable[[RuleInput], bool] | None = None

    def holds(self, w: RuleInput) -> bool:
        return (self.ftypes is None or w.ftype in self.ftypes) and (self.when is None or self.when(w))


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _r(ftypes: LlamaFtype | set[LlamaFtype] | None, type_: GGMLType, why: str,
       when: Callable[[RuleInput], bool] | None = None) -> Rule:
    """A rule; `ftypes` one file type, a set of them, or None for any."""
    if isinstance(ftypes, LlamaFtype):
        ftypes = {ftypes}
    return Rule(None if ftypes is None else frozenset(ftypes), type_, why, when)


IQ1_IQ2 = {F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M,
           F.MOSTLY_IQ1_M}
IQ2_SM = {F.MOSTLY_IQ2_S, F.MOSTLY_IQ2_M}
FALCON = "falcon"


# the conditions the rules share
def gqa4(w: RuleInput) -> bool:
    """4 or more query heads per kv head (n_gqa >= 4)."""
    return w.hp.n_gqa >= 4


def eighth(w: RuleInput) -> bool:
    """In the first eighth of the layers."""
    return w.i < w.n // 8


def middle(w: RuleInput) -> bool:
    """Past the first eighth of the layers and before the last."""
    return w.n // 8 <= w.i < 7 * w.n // 8


def more_bits(w: RuleInput) -> bool:
    return use_more_bits(w.i, w.n)


def falcon(w: RuleInput) -> bool:
    return w.hp.arch == FALCON


def x8(w: RuleInput) -> bool:
    """Mixtral's 8 experts."""
    return w.hp.n_expert == 8


def dense_not_falcon(w: RuleInput) -> bool:
    """Not falcon, and not 8 experts."""
    return w.hp.arch != FALCON and w.hp.n_expert != 8


class Arm(enum.Enum):
    """The branches of llama_tensor_get_type_impl: each has its chain of rules in RULES."""

    OUTPUT = "output"  # the output head, or the token embeddings when they are also the head
    MXFP4_MOE = "mxfp4_moe"
    TOKEN_EMBD = "token_embd"
    IQ_ATTN_V = "iq_attn_v"  # (the low-bit IQ mixes' own branch)
    IQ_ATTN_K = "iq_attn_k"
    IQ_FFN_DOWN = "iq_ffn_down"
    IQ_ATTN_OUTPUT = "iq_attn_output"
    ATTN_V = "attn_v"
    ATTN_K = "attn_k"
    ATTN_Q = "attn_q"
    FFN_DOWN = "ffn_down"
    ATTN_OUTPUT = "attn_output"
    FFN_GATE = "ffn_gate"
    FFN_UP = "ffn_up"


A = Arm

# The chains, by which branch of llama_tensor_get_type_impl a tensor takes (see `branch`)
RULES: dict[Arm, tuple[Rule, ...]] = {
    A.OUTPUT: (
        _r(F.MOSTLY_MXFP4_MOE, T.Q8_0, "MXFP4_MOE keeps the output head in Q8_0"),
        _r(None, T.Q8_0, "falcon's output head is Q8_0", falcon),
        _r(None, T.Q8_0, "the output head's rows do not fill whole blocks of the default type",
           lambda w: w.nx % traits(w.default).blck_size != 0),
        _r({F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ3_XXS, F.MOSTLY_IQ1_S, *IQ2_SM,
            F.MOSTLY_IQ1_M}, T.Q5_K, "the low-bit IQ mixes give the output head Q5_K"),
        _r(None, T.Q6_K, "the output head gets Q6_K", lambda w: w.default != T.Q8_0),
    ),
    A.MXFP4_MOE: (
        _r(None, T.MXFP4, "MXFP4_MOE: an expert tensor is MXFP4",
           lambda w: w.ne2 > 1 and (w.hp.arch != "bailingmoe3"
                                    or w.category in (C.FFN_UP, C.FFN_GATE, C.FFN_DOWN))),
        _r(None, T.Q8_0, "MXFP4_MOE: every tensor but the experts is Q8_0"),
    ),
    A.TOKEN_EMBD: (
        _r({F.MOSTLY_IQ2_XXS, F.MOSTLY_IQ2_XS, F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M}, T.Q2_K,
           "the lowest IQ mixes give the token embeddings Q2_K"),
        _r(IQ2_SM | {F.MOSTLY_IQ3_XXS}, T.IQ3_S, "this IQ mix gives the token embeddings IQ3_S"),
        _r({F.MOSTLY_TQ1_0, F.MOSTLY_TQ2_0, F.MOSTLY_Q2_0}, T.Q4_K,
           "the ternary mixes give the token embeddings Q4_K"),
    ),
    A.IQ_ATTN_V: (
        _r(None, T.Q4_K, "attention values in a low-bit IQ mix: Q4_K with 4+ query heads per kv "
           "head or 4+ experts", lambda w: w.hp.n_gqa >= 4 or w.hp.n_expert >= 4),
        _r(IQ2_SM, T.IQ3_S, "attention values in IQ2_S/IQ2_M: IQ3_S"),
        _r(None, T.Q2_K, "attention values in a low-bit IQ mix: Q2_K"),
    ),
    A.IQ_ATTN_K: (_r(None, T.Q4_K, "8 experts: attention keys Q4_K", x8),),
    A.IQ_FFN_DOWN: (
        _r(IQ2_SM, T.IQ3_S, "ffn_down {i} of {n}: the first eighth gets IQ3_S", eighth),
        _r(None, T.Q2_K, "ffn_down {i} of {n}: the first eighth gets Q2_K", eighth),
    ),
    A.IQ_ATTN_OUTPUT: (
        _r(None, T.Q5_K, "8 experts: attention output Q5_K", x8),
        _r({F.MOSTLY_IQ1_S, F.MOSTLY_IQ1_M}, T.IQ2_XXS, "IQ1 mixes: attention output IQ2_XXS"),
        _r(IQ2_SM, T.IQ3_S, "IQ2_S/IQ2_M: attention output IQ3_S"),
    ),
    A.ATTN_V: (
        _r(F.MOSTLY_Q2_K, T.Q4_K, "Q2_K, 4+ query heads per kv head: attention values Q4_K", gqa4),
        _r(F.MOSTLY_Q2_K, T.Q3_K, "Q2_K: attention values Q3_K"),
        _r(F.MOSTLY_Q2_K_S, T.Q4_K, "Q2_K_S, 4+ query heads per kv head: attention values Q4_K",
           gqa4),
        _r(F.MOSTLY_IQ3_XXS, T.Q4_K, "IQ3_XXS, 4+ query heads per kv head: attention values Q4_K",
           gqa4),
        _r(F.MOSTLY_IQ3_XXS, T.IQ3_S, "IQ3_XXS without an imatrix: attention values IQ3_S"),
        _r({F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_S}, T.Q4_K,
           "4+ query heads per kv head: attention values Q4_K", gqa4),
        _r(F.MOSTLY_IQ3_M, T.Q4_K, "IQ3_M: attention values Q4_K"),
        _r(F.MOSTLY_Q3_K_M, T.Q5_K, "Q3_K_M: the first two attention values get Q5_K",
           lambda w: w.i < 2),
        _r(F.MOSTLY_Q3_K_M, T.Q4_K, "Q3_K_M: attention values Q4_K"),
        _r(F.MOSTLY_Q3_K_L, T.Q5_K, "Q3_K_L: attention values Q5_K"),
        _r({F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS}, T.Q5_K,
           "4+ query heads per kv head: attention values Q5_K", gqa4),
        _r({F.MOSTLY_Q4_K_M, F.MOSTLY_Q5_K_M}, T.Q6_K,
           "attention values {i} of {n}: use_more_bits (first and last eighth, every third "
           "between) gives Q6_K", more_bits),
        _r(F.MOSTLY_Q4_K_S, T.Q5_K, "Q4_K_S: the first four attention values get Q5_K",
           lambda w: w.i < 4),
    ),
    A.ATTN_K: (
        _r(None, T.Q8_0, "8 experts: attention keys Q8_0", x8),
        _r(F.MOSTLY_IQ3_XS, T.IQ3_XXS, "IQ3_XS: attention keys IQ3_XXS"),
        _r(F.MOSTLY_IQ3_XXS, T.IQ2_S, "IQ3_XXS: attention keys IQ2_S"),
    ),
    A.ATTN_Q: (
        _r(F.MOSTLY_IQ3_XS, T.IQ3_XXS, "IQ3_XS: attention queries IQ3_XXS"),
        _r(F.MOSTLY_IQ3_XXS, T.IQ2_S, "IQ3_XXS: attention queries IQ2_S"),
    ),
    A.FFN_DOWN: (
        _r(F.MOSTLY_Q2_K, T.Q3_K, "Q2_K: ffn_down Q3_K"),
        _r(F.MOSTLY_Q2_K_S, T.Q4_K, "Q2_K_S: ffn_down {i} of {n}, in the first eighth: Q4_K",
           eighth),
        _r(F.MOSTLY_Q2_K_S, T.Q2_K, "Q2_K_S: ffn_down past the first eighth keeps the default"),
        _r(F.MOSTLY_IQ3_XXS, T.Q4_K, "IQ3_XXS: ffn_down {i} of {n}, in the first eighth: Q4_K",
           eighth),
        _r(F.MOSTLY_IQ3_XXS, T.Q3_K, "IQ3_XXS without an imatrix: ffn_down Q3_K"),
        _r(F.MOSTLY_Q3_K_M, T.Q5_K, "Q3_K_M: ffn_down {i} of {n}, in the first sixteenth: Q5_K",
           lambda w: w.i < w.n // 16),
        _r(F.MOSTLY_Q3_K_M, T.Q4_K, "Q3_K_M: ffn_down Q4_K",
           lambda w: w.hp.arch != FALCON or use_more_bits(w.i, w.n)),
        _r(F.MOSTLY_Q3_K_M, T.Q3_K, "Q3_K_M, falcon: ffn_down {i} of {n} keeps Q3_K"),
        _r(F.MOSTLY_IQ3_M, T.Q4_K, "IQ3_M: ffn_down {i} of {n} gets Q4_K",
           lambda w: w.i < w.n // 8 or (w.hp.n_expert == 8 and use_more_bits(w.i, w.n))),
        _r(F.MOSTLY_Q3_K_L, T.Q4_K, "Q3_K_L, falcon: ffn_down Q4_K", falcon),
        _r(F.MOSTLY_Q3_K_L, T.Q5_K, "Q3_K_L: ffn_down Q5_K"),
        _r(F.MOSTLY_Q4_K_M, T.Q6_K, "Q4_K_M, falcon: ffn_down {i} of {n}, in the first "
           "sixteenth: Q6_K", lambda w: w.hp.arch == FALCON and w.i < w.n // 16),
        _r(F.MOSTLY_Q4_K_M, T.Q5_K, "Q4_K_M, falcon: ffn_down {i} of {n}: use_more_bits gives Q5_K",
           lambda w: w.hp.arch == FALCON and use_more_bits(w.i, w.n)),
        _r(F.MOSTLY_Q4_K_M, T.Q4_K, "Q4_K_M, falcon: ffn_down {i} of {n} keeps Q4_K", falcon),
        _r(F.MOSTLY_Q4_K_M, T.Q6_K, "ffn_down {i} of {n}: use_more_bits (first and last eighth, "
           "every third between) gives Q6_K", more_bits),
        _r(F.MOSTLY_Q4_K_M, T.Q4_K, "Q4_K_M: ffn_down {i} of {n} keeps Q4_K"),
        _r({F.MOSTLY_IQ4_NL, F.MOSTLY_IQ4_XS}, T.Q5_K,
           "ffn_down {i} of {n}, in the first eighth, without an imatrix: Q5_K", eighth),
        _r(F.MOSTLY_Q5_K_M, T.Q6_K, "ffn_down {i} of {n}: use_more_bits gives Q6_K", more_bits),
        _r(F.MOSTLY_Q4_K_S, T.Q5_K, "Q4_K_S: ffn_down {i} of {n}, in the first eighth: Q5_K",
           lambda w: w.hp.arch != FALCON and w.i < w.n // 8),
    ),
    A.ATTN_OUTPUT: (
        _r({F.MOSTLY_Q2_K, F.MOSTLY_IQ3_XS, F.MOSTLY_IQ3_XXS, F.MOSTLY_Q3_K_S, F.MOSTLY_Q3_K_M,
            F.MOSTLY_IQ4_NL, F.MOSTLY_Q4_K_S, F.MOSTLY_Q4_K_M, F.MOSTLY_IQ3_S, F.MOSTLY_IQ3_M,
            F.MOSTLY_IQ4_XS}, T.Q5_K, "8 experts: attention output Q5_K",
           lambda w: w.hp.arch != FALCON and w.hp.n_expert == 8),
        _r(F.MOSTLY_Q2_K, T.Q3_K, "Q2_K: attention output Q3_K", dense_not_falcon),
        _r(F.MOSTLY_IQ3_XXS, T.IQ3_S, "IQ3_XXS: attention output IQ3_S",
           dense_not_falcon),
        _r(F.MOSTLY_Q3_K_M, T.Q4_K, "Q3_K_M: attention output Q4_K",
           dense_not_falcon),
        _r(F.MOSTLY_Q3_K_L, T.Q5_K, "Q3_K_L: attention output Q5_K",
           dense_not_falcon),
        _r(F.MOSTLY_IQ3_M, T.Q4_K, "IQ3_M: attention output Q4_K",
           dense_not_falcon),
        _r(F.MOSTLY_Q3_K_L, T.Q4_K, "Q3_K_L, falcon: attention output Q4_K", falcon),
    ),
    A.FFN_GATE: (_r(F.MOSTLY_IQ3_XS, T.IQ3_XXS, "IQ3_XS: ffn_gate {i} of {n}, between the first "
                    "and last eighth: IQ3_XXS", middle),),
    A.FFN_UP: (_r(F.MOSTLY_IQ3_XS, T.IQ3_XXS, "IQ3_XS: ffn_up {i} of {n}, between the first "
                  "and last eighth: IQ3_XXS", middle),),
}
# the chains whose tensors advance a counter (llama.cpp's ++qs.i_...), and which one
COUNTS = {A.IQ_ATTN_V: "i_attention_wv", A.ATTN_V: "i_attention_wv", A.IQ_FFN_DOWN: "i_ffn_down",
          A.FFN_DOWN: "i_ffn_down", A.FFN_GATE: "i_ffn_gate", A.FFN_UP: "i_ffn_up"}
_BLK = re.compile(r"blk\.\s*([+-]?\d+)")  # sscanf(name, "blk.%d.", &il) == 1


def name_layer(name: str) -> int:
    """The layer a tensor's name gives ("blk.12.attn_v.weight": 12), or -1 (llama.cpp's sscanf)."""
    m = _BLK.match(name)
    return int(m.group(1)) if m else -1


class NoFallback(ValueError):
    """A tensor whose rows fill no block of its type or of any type it could fall back to
    (llama.cpp throws after its warning's first half: `warning` holds it)."""

    def __init__(self, message: str, warning: str) -> None:
        super().__init__(message)
        self.warning = warning


@dataclass(frozen=True, slots=True)
class Choice:
    """The type a tensor gets, and why (the rule's words, filled)."""

    type: GGMLType
    why: str
    fallback: str | None = None  # llama.cpp's warning when the rows did not fit the blocks


_ARM_BY_CATEGORY = {C.ATTENTION_K: A.ATTN_K, C.ATTENTION_Q: A.ATTN_Q, C.FFN_DOWN: A.FFN_DOWN,
                    C.ATTENTION_OUTPUT: A.ATTN_OUTPUT, C.FFN_GATE: A.FFN_GATE, C.FFN_UP: A.FFN_UP}


def branch(ftype: LlamaFtype, hp: Hparams, category: Category, tied: bool) -> Arm | None:
    """The arm of llama_tensor_get_type_impl a tensor takes (None: no rule touches it)."""
    if category == C.OUTPUT or (tied and category == C.TOKEN_EMBD):
        return A.OUTPUT
    if ftype == F.MOSTLY_MXFP4_MOE:
        return A.MXFP4_MOE
    if category == C.TOKEN_EMBD:
        return A.TOKEN_EMBD
    if ftype in IQ1_IQ2:
        if category in ATTN_V_LIKE:
            return A.IQ_ATTN_V
        if hp.n_expert == 8 and category == C.ATTENTION_K:
            return A.IQ_ATTN_K
        return {C.FFN_DOWN: A.IQ_FFN_DOWN, C.ATTENTION_OUTPUT: A.IQ_ATTN_OUTPUT}.get(category)
    if category in ATTN_V_LIKE:
        return A.ATTN_V
    return _ARM_BY_CATEGORY.get(category)


def _layer(state: MixState, arm: Arm, hp: Hparams, name: str) -> tuple[int, int]:
    """layer_info: (i, n) for a rule; with experts the layer is read from the name (Mixtral's
    experts are not in layer order), else it is the count of the tensor's kind so far."""
    if arm in (A.ATTN_V, A.IQ_ATTN_V):
        return state.i_attention_wv, state.n_attention_wv
    if arm == A.IQ_FFN_DOWN:
        return state.i_ffn_down, state.n_layer
    counter = COUNTS.get(arm)
    i = getattr(state, counter) if counter else 0
    if counter and hp.n_expert > 1:
        if _BLK.match(name) is None:
            raise ValueError(f"Failed to determine layer for tensor {name}")
        i = name_layer(name)
        if not 0 <= i < state.n_layer:
            raise ValueError(f"Bad layer {i} for tensor {name}. Must be in [0, {state.n_layer})")
    return i, state.n_layer


def _mix(state: MixState, ftype: LlamaFtype, hp: Hparams, name: str, ne: tuple[int, ...],
         category: Category, default: GGMLType, output_type: GGMLType | None) -> Choice:
    """llama_tensor_get_type_impl."""
    if hp.arch == "glm5-next" and any(p in name for p in ("attn_q_a", "attn_q_b", "nextn.eh_proj")) \
            and default not in (T.F32, T.BF16, T.F16):
        return Choice(T.Q8_0, "glm5-next keeps this projection in Q8_0 at least")
    arm = branch(ftype, hp, category, state.tied)
    if arm == A.OUTPUT and output_type is not None:
        return Choice(output_type, "--output-tensor-type (the token embeddings are the output "
                                   "head)")
    if arm is None:
        return Choice(default, f"the default type of {ftype_label(ftype)} (no rule for "
                               f"{category.value} tensors)")
    i, n = _layer(state, arm, hp, name)
    w = RuleInput(ftype, hp, category, ne[0], ne[2] if len(ne) > 2 else 1, default, i, n)
    rule = next((r for r in RULES[arm] if r.holds(w)), None)
    choice = Choice(rule.type, rule.why.format(i=i, n=n, arch=hp.arch)) if rule else \
        Choice(default, f"the default type of {ftype_label(ftype)} (no {arm.value} rule applies)")
    if arm == A.ATTN_V:  # after the chain: a 70B's attn_v and an 8-expert model's
        if hp.is_70b and choice.type in (T.Q3_K, T.Q4_K):
            choice = Choice(T.Q5_K, "a 70B model (8 heads share each attn_v): Q5_K")
        if hp.n_expert == 8:
            choice = Choice(T.Q8_0, "8 experts: attention values Q8_0")
    if arm in COUNTS:
        setattr(state, COUNTS[arm], getattr(state, COUNTS[arm]) + 1)
    return choice


def tensor_type(state: MixState, ftype: LlamaFtype, hp: Hparams, name: str, ne: tuple[int, ...],
                *, pure: bool = False, output_type: GGMLType | None = None,
                token_embedding_type: GGMLType | None = None) -> Choice:
    """llama_tensor_get_type for a tensor that may be quantized: the options, then (unless
    --pure) the mix, then the fallback for rows that do not fill whole blocks."""
    category = tensor_category(name)
    if token_embedding_type is not None and category == C.TOKEN_EMBD:
        return Choice(token_embedding_type, "--token-embedding-type")
    if output_type is not None and category == C.OUTPUT:
        return Choice(output_type, "--output-tensor-type")
    default = default_type(ftype)
    if not ggml_is_quantized(default):
        return Choice(default, f"{traits(default).type_name}: every weight matrix in this type")
    if pure:
        choice = Choice(default, "--pure: every weight matrix in the default type")
    else:
        choice = _mix(state, ftype, hp, name, ne, category, default, output_type)
    ncols, blck = ne[0], traits(choice.type).blck_size
    if ncols % blck == 0:
        return choice
    state.n_fallback += 1
    name_from = traits(choice.type).type_name
    warn = (f"warning: {name:<36} - ncols {ncols:6} not divisible by {blck:3} (required for type "
            f"{name_from:>7}) ")
    try:
        to, forced = fallback_type(choice.type, ncols)
    except ValueError as e:
        raise NoFallback(str(e), warn) from None
    name_to = traits(to).type_name
    warn += ("(WARNING: must use F16 due to unusual shape) " if forced else "") + \
        f"-> falling back to {name_to:>7}"
    return Choice(to, f"{choice.why}; rows of {ncols} do not fill {name_from}'s blocks of {blck}: "
                      f"{name_to}", warn)
