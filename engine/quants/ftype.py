"""llama.cpp's file types (`llama_ftype`) as llama-quantize names them, and their fixed facts.

A file type names a quantization *mix*: `Q4_K_M` means "mostly Q4_K", with some tensors in more
bits (engine/quants/mix.py decides which, tensor by tensor, as src/llama-quant.cpp does). Here:
the `llama_ftype` enum (include/llama.h), llama-quantize's list of the names it accepts
(`QUANT_OPTIONS` in tools/quantize/quantize.cpp, in its order, with its descriptions), each
file type's default tensor type (`llama_ftype_get_default_type`), the fallback a tensor takes when
its rows do not fill whole blocks of its type (`tensor_type_fallback`), and which tensor types
llama-quantize refuses to write without an importance matrix (`tensor_requires_imatrix`).
Leaves out: Q2_0 (ggml type 42), which the engine's type table does not have yet.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

from engine.core.types import GGMLType, traits


class LlamaFtype(enum.IntEnum):
    """enum llama_ftype: the value a file stores as general.file_type."""

    ALL_F32 = 0
    MOSTLY_F16 = 1
    MOSTLY_Q4_0 = 2
    MOSTLY_Q4_1 = 3
    MOSTLY_Q8_0 = 7
    MOSTLY_Q5_0 = 8
    MOSTLY_Q5_1 = 9
    MOSTLY_Q2_K = 10
    MOSTLY_Q3_K_S = 11
    MOSTLY_Q3_K_M = 12
    MOSTLY_Q3_K_L = 13
    MOSTLY_Q4_K_S = 14
    MOSTLY_Q4_K_M = 15
    MOSTLY_Q5_K_S = 16
    MOSTLY_Q5_K_M = 17
    MOSTLY_Q6_K = 18
    MOSTLY_IQ2_XXS = 19
    MOSTLY_IQ2_XS = 20
    MOSTLY_Q2_K_S = 21
    MOSTLY_IQ3_XS = 22
    MOSTLY_IQ3_XXS = 23
    MOSTLY_IQ1_S = 24
    MOSTLY_IQ4_NL = 25
    MOSTLY_IQ3_S = 26
    MOSTLY_IQ3_M = 27
    MOSTLY_IQ2_S = 28
    MOSTLY_IQ2_M = 29
    MOSTLY_IQ4_XS = 30
    MOSTLY_IQ1_M = 31
    MOSTLY_BF16 = 32
    MOSTLY_TQ1_0 = 36
    MOSTLY_TQ2_0 = 37
    MOSTLY_MXFP4_MOE = 38
    MOSTLY_NVFP4 = 39
    MOSTLY_Q1_0 = 40
    MOSTLY_Q2_0 = 41


LLAMA_FTYPE_GUESSED = 1024  # or'ed into a file type the loader guessed from the tensors' types

F = LlamaFtype
T = GGMLType


@dataclass(frozen=True, slots=True)
class QuantOption:
    """One entry of llama-quantize's list: the name it accepts, its file type, its description."""

    name: str
    ftype: LlamaFtype
    desc: str


# llama-quantize's QUANT_OPTIONS, in its order (COPY after F32: a number finds F32 first)
QUANT_OPTIONS: tuple[QuantOption, ...] = tuple(QuantOption(n, f, d) for n, f, d in (
    ("Q1_0", F.MOSTLY_Q1_0, " 1.125 bpw quantization"),
    ("Q2_0", F.MOSTLY_Q2_0, " 2.25 bpw quantization (group 64)"),
    ("Q4_0", F.MOSTLY_Q4_0, " 4.34G, +0.4685 ppl @ Llama-3-8B"),
    ("Q4_1", F.MOSTLY_Q4_1, " 4.78G, +0.4511 ppl @ Llama-3-8B"),
    ("MXFP4_MOE", F.MOSTLY_MXFP4_MOE, " MXFP4 MoE"),
    ("Q5_0", F.MOSTLY_Q5_0, " 5.21G, +0.1316 ppl @ Llama-3-8B"),
    ("Q5_1", F.MOSTLY_Q5_1, " 5.65G, +0.1062 ppl @ Llama-3-8B"),
    ("IQ2_XXS", F.MOSTLY_IQ2_XXS, " 2.06 bpw quantization"),
    ("IQ2_XS", F.MOSTLY_IQ2_XS, " 2.31 bpw quantization"),
    ("IQ2_S", F.MOSTLY_IQ2_S, " 2.5  bpw quantization"),
    ("IQ2_M", F.MOSTLY_IQ2_M, " 2.7  bpw quantization"),
    ("IQ1_S", F.MOSTLY_IQ1_S, " 1.56 bpw quantization"),
    ("IQ1_M", F.MOSTLY_IQ1_M, " 1.75 bpw quantization"),
    ("TQ1_0", F.MOSTLY_TQ1_0, " 1.69 bpw ternarization"),
    ("TQ2_0", F.MOSTLY_TQ2_0, " 2.06 bpw ternarization"),
    ("Q2_K", F.MOSTLY_Q2_K, " 2.96G, +3.5199 ppl @ Llama-3-8B"),
    ("Q2_K_S", F.MOSTLY_Q2_K_S, " 2.96G, +3.1836 ppl @ Llama-3-8B"),
    ("IQ3_XXS", F.MOSTLY_IQ3_XXS, " 3.06 bpw quantization"),
    ("IQ3_S", F.MOSTLY_IQ3_S, " 3.44 bpw quantization"),
    ("IQ3_M", F.MOSTLY_IQ3_M, " 3.66 bpw quantization mix"),
    ("Q3_K", F.MOSTLY_Q3_K_M, "alias for Q3_K_M"),
    ("IQ3_XS", F.MOSTLY_IQ3_XS, " 3.3 bpw quantization"),
    ("Q3_K_S", F.MOSTLY_Q3_K_S, " 3.41G, +1.6321 ppl @ Llama-3-8B"),
    ("Q3_K_M", F.MOSTLY_Q3_K_M, " 3.74G, +0.6569 ppl @ Llama-3-8B"),
    ("Q3_K_L", F.MOSTLY_Q3_K_L, " 4.03G, +0.5562 ppl @ Llama-3-8B"),
    ("IQ4_NL", F.MOSTLY_IQ4_NL, " 4.50 bpw non-linear quantization"),
    ("IQ4_XS", F.MOSTLY_IQ4_XS, " 4.25 bpw non-linear quantization"),
    ("Q4_K", F.MOSTLY_Q4_K_M, "alias for Q4_K_M"),
    ("Q4_K_S", F.MOSTLY_Q4_K_S, " 4.37G, +0.2689 ppl @ Llama-3-8B"),
    ("Q4_K_M", F.MOSTLY_Q4_K_M, " 4.58G, +0.1754 ppl @ Llama-3-8B"),
    ("Q5_K", F.MOSTLY_Q5_K_M, "alias for Q5_K_M"),
    ("Q5_K_S", F.MOSTLY_Q5_K_S, " 5.21G, +0.1049 ppl @ Llama-3-8B"),
    ("Q5_K_M", F.MOSTLY_Q5_K_M, " 5.33G, +0.0569 ppl @ Llama-3-8B"),
    ("Q6_K", F.MOSTLY_Q6_K, " 6.14G, +0.0217 ppl @ Llama-3-8B"),
    ("Q8_0", F.MOSTLY_Q8_0, " 7.96G, +0.0026 ppl @ Llama-3-8B"),
    ("F16", F.MOSTLY_F16, "14.00G, +0.0020 ppl @ Mistral-7B"),
    ("BF16", F.MOSTLY_BF16, "14.00G, -0.0050 ppl @ Mistral-7B"),
    ("F32", F.ALL_F32, "26.00G              @ 7B"),
    ("COPY", F.ALL_F32, "only copy tensors, no quantizing"),
))

COPY = "COPY"  # the option that copies every tensor as it is

# llama_ftype_get_default_type: the type a file type gives every tensor its mix leaves alone
DEFAULT_TYPE: dict[LlamaFtype, GGMLType] = {
    F.MOSTLY_Q4_0: T.Q4_0, F.MOSTLY_Q4_1: T.Q4_1, F.MOSTLY_Q5_0: T.Q5_0, F.MOSTLY_Q5_1: T.Q5_1,
    F.MOSTLY_Q8_0: T.Q8_0, F.MOSTLY_F16: T.F16, F.MOSTLY_BF16: T.BF16, F.ALL_F32: T.F32,
    F.MOSTLY_Q1_0: T.Q1_0, F.MOSTLY_MXFP4_MOE: T.MXFP4,
    F.MOSTLY_Q2_K_S: T.Q2_K, F.MOSTLY_Q2_K: T.Q2_K, F.MOSTLY_IQ3_XS: T.IQ3_S,
    F.MOSTLY_Q3_K_S: T.Q3_K, F.MOSTLY_Q3_K_M: T.Q3_K, F.MOSTLY_Q3_K_L: T.Q3_K,
    F.MOSTLY_Q4_K_S: T.Q4_K, F.MOSTLY_Q4_K_M: T.Q4_K, F.MOSTLY_Q5_K_S: T.Q5_K,
    F.MOSTLY_Q5_K_M: T.Q5_K, F.MOSTLY_Q6_K: T.Q6_K, F.MOSTLY_TQ1_0: T.TQ1_0,
    F.MOSTLY_TQ2_0: T.TQ2_0, F.MOSTLY_IQ2_XXS: T.IQ2_XXS, F.MOSTLY_IQ2_XS: T.IQ2_XS,
    F.MOSTLY_IQ2_S: T.IQ2_XS, F.MOSTLY_IQ2_M: T.IQ2_S, F.MOSTLY_IQ3_XXS: T.IQ3_XXS,
    F.MOSTLY_IQ1_S: T.IQ1_S, F.MOSTLY_IQ1_M: T.IQ1_M, F.MOSTLY_IQ4_NL: T.IQ4_NL,
    F.MOSTLY_IQ4_XS: T.IQ4_XS, F.MOSTLY_IQ3_S: T.IQ3_S, F.MOSTLY_IQ3_M: T.IQ3_S,
}

# tensor_type_fallback: the type a tensor takes when its rows (ne[0]) do not fill whole blocks
# of the one chosen; a 256-block type steps down to a 32-block type of about as many bits
FALLBACK: dict[GGMLType, GGMLType] = {
    T.IQ1_S: T.IQ4_NL, T.IQ1_M: T.IQ4_NL, T.IQ2_XXS: T.IQ4_NL, T.IQ2_XS: T.IQ4_NL,
    T.IQ2_S: T.IQ4_NL, T.IQ3_XXS: T.IQ4_NL, T.IQ3_S: T.IQ4_NL, T.IQ4_XS: T.IQ4_NL,
    T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.TQ1_0: T.Q4_0, T.TQ2_0: T.Q4_0,
    T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0,
}

# tensor_requires_imatrix: the types llama-quantize writes only with an importance matrix (but
# never for the token embeddings or the output head); Q2_K only in a Q2_K_S file
NEEDS_IMATRIX = frozenset({T.IQ3_XXS, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ1_M, T.IQ1_S})


def parse_ftype(text: str) -> QuantOption | None:
    """try_parse_ftype: an option by its name (any case), or by its file type's number."""
    upper = text.upper()
    for opt in QUANT_OPTIONS:
        if opt.name == upper:
            return opt
    m = re.match(r"\s*[+-]?\d+", text)  # std::stoi: blanks, a sign, digits; the rest ignored
    if m is None:
        return None
    number = int(m.group())
    return next((opt for opt in QUANT_OPTIONS if opt.ftype == number), None)


def parse_ggml_type(text: str) -> GGMLType | None:
    """parse_ggml_type: a ggml type by its ggml_type_name, any case (q4_k, Q8_0, f16...)."""
    low = text.lower()
    return next((t for t in GGMLType if traits(t).type_name.lower() == low), None)


def default_type(ftype: int) -> GGMLType:
    """llama_ftype_get_default_type; a file type without one is refused as llama.cpp does."""
    if ftype == F.MOSTLY_Q2_0:
        raise ValueError("Q2_0: ggml's type q2_0 is not in the engine's type table yet")
    try:
        return DEFAULT_TYPE[LlamaFtype(ftype)]
    except (ValueError, KeyError):
        raise ValueError(f"invalid output file type {int(ftype)}") from None


def requires_imatrix(name: str, type_: GGMLType, ftype: int) -> bool:
    """tensor_requires_imatrix: would llama-quantize need an importance matrix to write this
    tensor in this type?"""
    if name in ("token_embd.weight", "per_layer_token_embd.weight", "output.weight"):
        return False
    if type_ == T.Q2_K:
        return ftype == F.MOSTLY_Q2_K_S
    return type_ in NEEDS_IMATRIX


def fallback_type(type_: GGMLType, ncols: int) -> tuple[GGMLType, bool]:
    """tensor_type_fallback's choice for rows of `ncols` elements that `type_`'s blocks do not
    fill: its FALLBACK type, or F16 when that does not fit either (True: F16 was forced)."""
    out = FALLBACK.get(type_)
    if out is None:
        if traits(type_).blck_size > 32:
            raise ValueError(f"no tensor type fallback is defined for type "
                             f"{traits(type_).type_name}")
        out = type_  # already a 32-block type: there is no smaller block to step down to
    return (out, False) if ncols % traits(out).blck_size == 0 else (T.F16, True)


def ftype_label(ftype: int) -> str:
    """A file type's name as llama-quantize lists it (Q4_K_M, F16, ...)."""
    return next((o.name for o in QUANT_OPTIONS if o.ftype == ftype and "alias" not in o.desc),
                str(int(ftype)))
