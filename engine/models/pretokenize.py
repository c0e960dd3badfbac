"""BPE pre-tokenizers as llama.cpp has them: `tokenizer.ggml.pre` -> the regexes that cut a text
into words before merges (llm_tokenizer_bpe's regex_exprs and unicode_regex_split).

Each pre-tokenizer is a list of patterns applied one after the other, each cutting the pieces the
previous one left (text between matches stays a piece of its own). A pattern is run the way
llama.cpp runs it:
- a few well-known patterns (GPT-2's, Llama 3's, Qwen 2's, Qwen 3.5's, Kimi K2's, AFMoE's digits,
  the newline runs) by a hand-written splitter, whose results differ from the regex's in corners
  (a lone trailing space, an apostrophe at a piece's end), as llama.cpp's own do;
- a pattern with \\p{...} on the "collapsed" text (engine/models/unicode.py: one character per code
  point, \\p{L} turned into a class of the letters' character and A-Za-z), so \\p{Lu} means any
  letter, as in llama.cpp;
- any other pattern on the code points, non-ASCII whitespace seen as '\\v'.
Python's `re` stands in for C++'s std::regex (ECMAScript): both backtrack, try alternatives left
to right, and with re.ASCII agree on \\s, \\d and \\w; `$` is translated to \\Z.
Leaves out: the "whitespace" and "hybriddna" tokenizer models' own sessions.
"""

from __future__ import annotations

import functools
import re
import warnings
from dataclasses import dataclass

from . import unicode as uc
from .unicode import ACCENT_MARK, LETTER, NUMBER, WHITESPACE

# --- the patterns, as llama-vocab.cpp writes them -----------------------------------------------

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_ORIGINAL = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                   r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN35 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
KIMI_K2 = r"\p{Han}+"
AFMOE_DIGITS = r"\p{AFMoE_digits}"
DIGITS_BY_THREE = r"\d{1,3}(?=(?:\d{3})*\b)"
NEWLINE_RUNS = r"[^\n]+|[\n]+"
THOUSANDS = r"(?=(\d{3})+(?!\d))"

_DEEPSEEK_LETTERS = (  # Latin, Greek, Cyrillic, ... letters (DeepSeek LLM's tokenizer.json)
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0"
    "-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-"
    "\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b"
    "\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-"
    "\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113"
    "\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f"
    "\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3"
    "\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00"
    "-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
    "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
    "\U000118df\U0001e900-\U0001e943]+")
_CJK_DEEPSEEK = "[一-龥ࠀ-一가-\ud7ff]+"
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_PUNCT_WORDS = (r"[!" + '"' + r"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+")
_FINNISH = " ?[^(\\s|.,!?…。，、।۔،)]+"
_NOT_WORD = r"[^\r\n\p{L}\p{N}]?"
_UP, _LO = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"  # a letter not lower / not upper
_UP_M, _LO_M = r"((?=[\p{L}\p{M}])([^a-z]))", r"((?=[\p{L}\p{M}])([^A-Z]))"
_CASED_TAIL = r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"


def _cased(up: str, low: str, suffix: str) -> str:
    return (_NOT_WORD + up + "*" + low + "+" + suffix + "|" + _NOT_WORD + up + "+" + low + "*"
            + suffix)


_UNICASE = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
            + _CONTRACTIONS + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+"
            r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS + "?")
_DS3 = (_PUNCT_WORDS + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*"
        r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# pre-tokenizer type -> (patterns, byte-level): llm_tokenizer_bpe's constructor, case by case
PRE_TYPES: dict[str, tuple[tuple[str, ...], bool]] = {
    "default": ((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"), True),
    "llama3": ((LLAMA3,), True),
    "jais2": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+" + "".join(rf"|\s{{{k}}}(?!\S)" for k in (512, 256, 128, 64, 32,
                                                                       16, 8, 4))
               + r"|\s{1,2}(?!\S)|\s{1}",), True),
    "dbrx": ((LLAMA3,), True),
    "deepseek-llm": (("[\r\n]",
                      _DEEPSEEK_LETTERS,
                      r"\s?[!-/:-~！-／：-～‘-‟" + "\u3000" + r"-。]+",
                      r"\s+$", _CJK_DEEPSEEK, r"\p{N}+"), True),
    "deepseek3-llm": ((r"\p{N}{1,3}", _CJK_KANA, _DS3), True),
    "spark2_5": ((r"\p{N}{1,3}", _CJK_KANA,
                  _PUNCT_WORDS + r"|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+|[\r\n]"
                  r"|\s+(?!\S)|\s+", r"\p{N}"), True),
    "youtu": (("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA,
               _UNICASE + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True),
    "deepseek-coder": (("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_DEEPSEEK, r"\p{N}"), True),
    "falcon": ((r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"), True),
    "starcoder": ((r"\p{N}", GPT2), True),
    "gpt2": ((GPT2,), True),
    "qwen2": ((QWEN2,), True),
    "qwen35": ((QWEN35,), True),
    "poro": ((_FINNISH,), True),
    "chatglm4": ((LLAMA3,), True),
    "viking": ((_FINNISH, r"\p{N}"), True),
    "tekken": ((_cased(_UP, _LO, "") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+"
                r"|\s+(?!\S)|\s+",), True),
    "chameleon": (("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
                   "([\\t\\n]|    |  )", r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", GPT2), True),
    "gpt4o": ((_cased(_UP, _LO, _CONTRACTIONS + "?") + _CASED_TAIL,), True),
    "granite-emb-multi": ((_cased(_UP_M, _LO_M, _CONTRACTIONS + "?") + _CASED_TAIL,), True),
    "tiny-aya": ((DIGITS_BY_THREE, _UNICASE + _CASED_TAIL), True),
    "kimi-k2": ((KIMI_K2,), True),
    "superbpe": ((r"\p{N}+", THOUSANDS), True),
    "bailingmoe": ((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    "seed-coder": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                    r"|\s*[\r\n]+|\s+(?!\S)|\s+",), True),
    "ufakzeka": ((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
                  r"|\s+(?!\S)|\s+",), True),
    "afmoe": ((AFMOE_DIGITS,
               "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff"
               "가-\ud7afᄀ-ᇿ]+", _DS3), True),
    "laguna": ((NEWLINE_RUNS, QWEN2), True),
    "exaone-moe": ((_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                    r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",), True),
    "gemma4": ((NEWLINE_RUNS,), False),
    "minicpm5": ((r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"), True),
    "whitespace": ((r"\S+",), False),
}


@dataclass(frozen=True, slots=True)
class PreTokenizer:
    """What a `tokenizer.ggml.pre` value selects (llama_vocab::impl::load's BPE branch)."""
    kind: str  # a key of PRE_TYPES
    ignore_merges: bool = False  # a word that is a token as a whole is taken as it is
    clean_spaces: bool = True  # clean_up_tokenization_spaces (detokenizing only)
    add_bos: bool = False  # the default of tokenizer.ggml.add_bos_token
    escape_whitespaces: bool = False  # spaces become '▁' first (SPM-style BPE)
    no_bos: bool = False  # the BOS id defaults to none
    add_sep: bool = False

    @property
    def patterns(self) -> tuple[str, ...]:
        return PRE_TYPES[self.kind][0]

    @property
    def byte_level(self) -> bool:
        return PRE_TYPES[self.kind][1]


def _pre(kind: str, *names: str, **options) -> dict[str, PreTokenizer]:
    return {name: PreTokenizer(kind, **options) for name in names}


_KEEP = dict(clean_spaces=False)
# tokenizer.ggml.pre -> its pre-tokenizer and options, as llama.cpp reads them
PRE_NAMES: dict[str, PreTokenizer] = {
    **_pre("default", "default"),
    **_pre("minicpm5", "minicpm5", ignore_merges=True),
    **_pre("llama3", "llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
           "midm-2.0", "lfm2", "jina-v5-nano", ignore_merges=True, add_bos=True),
    **_pre("deepseek-llm", "deepseek-llm", **_KEEP),
    **_pre("deepseek-coder", "deepseek-coder", **_KEEP),
    **_pre("deepseek3-llm", "deepseek-v3", "hunyuan-dense", "hy_v4", "joyai-llm", **_KEEP),
    **_pre("spark2_5", "spark2_5", **_KEEP),
    **_pre("youtu", "youtu", ignore_merges=True, **_KEEP),
    **_pre("falcon", "falcon"),
    **_pre("gpt2", "mpt", "gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es",
           "jina-v2-de", "a.x-4.0", "mellum", "modern-bert", "olmo", "jais", "exaone4"),
    **_pre("jais2", "jais-2"),
    **_pre("gemma4", "gemma4", "granite-embed-multi-311m", escape_whitespaces=True),
    **_pre("gemma4", "sarvam-moe", escape_whitespaces=True, **_KEEP),
    **_pre("gpt2", "jina-v1-en", "jina-v2-code", "roberta-bpe", add_sep=True),
    **_pre("whitespace", "whitespace"),
    **_pre("starcoder", "starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"),
    **_pre("starcoder", "command-r", "smollm", **_KEEP),
    **_pre("qwen2", "qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open",
           "grok-2", **_KEEP),
    **_pre("qwen2", "megrez", "stablelm2"),
    **_pre("qwen35", "qwen35", **_KEEP),
    **_pre("dbrx", "dbrx", "smaug-bpe"),
    **_pre("poro", "poro-chat", **_KEEP),
    **_pre("poro", "bloom", "gpt3-finnish"),
    **_pre("chatglm4", "chatglm-bpe", no_bos=True),
    **_pre("chatglm4", "glm4", "glm5", no_bos=True, ignore_merges=True),
    **_pre("viking", "viking", **_KEEP),
    **_pre("tekken", "tekken", ignore_merges=True, add_bos=True, **_KEEP),
    **_pre("chameleon", "chameleon", add_bos=True, **_KEEP),
    **_pre("gpt4o", "gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2", **_KEEP),
    **_pre("granite-emb-multi", "granite-embed-multi-97m", ignore_merges=True, **_KEEP),
    **_pre("tiny-aya", "tiny_aya", "cohere2moe", **_KEEP),
    **_pre("superbpe", "superbpe", **_KEEP),
    **_pre("gpt2", "trillion", "granite-docling", **_KEEP),
    **_pre("bailingmoe", "bailingmoe", "bailingmoe2", "llada-moe", **_KEEP),
    **_pre("seed-coder", "seed-coder", **_KEEP),
    **_pre("kimi-k2", "kimi-k2", **_KEEP),
    **_pre("ufakzeka", "ufakzeka", **_KEEP),
    **_pre("afmoe", "afmoe", **_KEEP),
    **_pre("laguna", "laguna", **_KEEP),
    **_pre("exaone-moe", "exaone-moe"),
}


# --- the hand-written splitters (unicode.cpp's unicode_regex_split_custom_*) ---------------------
# Each takes the code points and the lengths of the pieces so far, and returns the new lengths.

CR, LF, APOS = 0x0D, 0x0A, 0x27
_ONE = frozenset(map(ord, "stmd"))
_TWO = frozenset(((ord("r"), ord("e")), (ord("v"), ord("e")), (ord("l"), ord("l"))))


def _ranges(offsets: list[int]):
    start = 0
    for n in offsets:
        yield start, start + n
        start += n


class _Cursor:
    """One piece [ini, end) being cut: code points and flags, 0 / OUT past its ends."""
    OUT = -1

    def __init__(self, cpts: list[int], ini: int, end: int, out: list[int]) -> None:
        self.cpts, self.ini, self.end, self.out, self.prev = cpts, ini, end, out, ini

    def cpt(self, pos: int) -> int:
        return self.cpts[pos] if self.ini <= pos < self.end else self.OUT

    def flags(self, pos: int) -> int:
        return uc.flags(self.cpts[pos]) if self.ini <= pos < self.end else 0

    def add(self, end: int) -> int:
        """End the current word at `end` (nothing when empty); its length."""
        n = end - self.prev
        if n > 0:
            self.out.append(n)
        self.prev = end
        return n

    def contraction(self, pos: int, lower) -> int:
        """The length of 's, 't, 're, 've, 'm, 'll or 'd at pos (0 when none)."""
        if self.cpt(pos) != APOS or pos + 1 >= self.end:
            return 0
        a = lower(self.cpt(pos + 1))
        if a in _ONE:
            return 2
        if pos + 2 < self.end and (a, lower(self.cpt(pos + 2))) in _TWO:
            return 3
        return 0

    def whitespace(self, pos: int) -> int:
        r"""The \s*[\r\n]+ | \s+(?!\S) | \s+ tail shared by the splitters: the next end."""
        n, last_newline = 0, 0
        while self.flags(pos + n) & WHITESPACE:
            if self.cpt(pos + n) in (CR, LF):
                last_newline = pos + n + 1
            n += 1
        if last_newline:
            return last_newline
        if n > 1 and self.cpt(pos + n) != self.OUT:
            return pos + n - 1
        return pos + max(n, 1)


def _same(c: int) -> int:
    return c


def split_gpt2(cpts: list[int], offsets: list[int]) -> list[int]:
    out: list[int] = []
    for ini, end in _ranges(offsets):
        cur = _Cursor(cpts, ini, end, out)
        pos = ini
        while pos < end:
            c, f = cur.cpt(pos), cur.flags(pos)
            n = cur.contraction(pos, _same)
            if n:
                pos += cur.add(pos + n)
                continue
            f2 = cur.flags(pos + 1) if c == 0x20 else f
            for kind in (LETTER, NUMBER):
                if f2 & kind:
                    pos += c == 0x20
                    while cur.flags(pos) & kind:
                        pos += 1
                    cur.add(pos)
                    break
            else:
                if f2 and not f2 & (WHITESPACE | LETTER | NUMBER):
                    pos += c == 0x20
                    while (g := cur.flags(pos)) and not g & (WHITESPACE | LETTER | NUMBER):
                        pos += 1
                    cur.add(pos)
                    continue
                n = 0
                while cur.flags(pos + n) & WHITESPACE:
                    n += 1
                if n > 1 and cur.cpt(pos + n) != cur.OUT:
                    pos += n - 1
                else:
                    pos += max(n, 1)
                cur.add(pos)
    return out


def _split_llama3_like(cpts: list[int], offsets: list[int], max_digits: int,
                       marks: bool) -> list[int]:
    """Llama 3's splitter (max_digits 3), Qwen 2's (1) and Qwen 3.5's (1, marks join letters)."""
    word = LETTER | ACCENT_MARK if marks else LETTER
    out: list[int] = []
    for ini, end in _ranges(offsets):
        cur = _Cursor(cpts, ini, end, out)
        pos = ini
        while pos < end:
            c, f = cur.cpt(pos), cur.flags(pos)
            n = cur.contraction(pos, uc.tolower)
            if n:
                pos += cur.add(pos + n)
                continue
            if c not in (CR, LF) and not f & NUMBER and (f & word or cur.flags(pos + 1) & word):
                pos += 1
                while cur.flags(pos) & word:
                    pos += 1
                cur.add(pos)
                continue
            if f & NUMBER:
                first = pos
                while cur.flags(pos) & NUMBER:
                    pos += 1
                    if pos - first >= max_digits:
                        cur.add(pos)
                        first = pos
                cur.add(pos)
                continue
            f2 = cur.flags(pos + 1) if c == 0x20 else f
            if not f2 & (WHITESPACE | word | NUMBER) and f:
                pos += c == 0x20
                while (g := cur.flags(pos)) and not g & (WHITESPACE | word | NUMBER):
                    pos += 1
                while cur.cpt(pos) in (CR, LF):
                    pos += 1
                cur.add(pos)
                continue
            pos = cur.whitespace(pos)
            cur.add(pos)
    return out


def split_llama3(cpts, offsets):
    return _split_llama3_like(cpts, offsets, 3, False)


def split_qwen2(cpts, offsets):
    return _split_llama3_like(cpts, offsets, 1, False)


def split_qwen35(cpts, offsets):
    return _split_llama3_like(cpts, offsets, 1, True)


def split_kimi_k2(cpts: list[int], offsets: list[int]) -> list[int]:
    """Han runs; cased words without Han (with a contraction); digits by three; the rest."""
    out: list[int] = []

    def letter(cur, pos):  # a letter, not Han
        return cur.flags(pos) & LETTER and not uc.is_han(cur.cpt(pos))

    for ini, end in _ranges(offsets):
        cur = _Cursor(cpts, ini, end, out)
        pos = ini
        while pos < end:
            c, f = cur.cpt(pos), cur.flags(pos)
            if uc.is_han(c):
                while uc.is_han(cur.cpt(pos)):
                    pos += 1
                cur.add(pos)
                continue
            lead = not (c in (CR, LF) or f & (LETTER | NUMBER))
            if letter(cur, pos) or (lead and letter(cur, pos + 1)):
                pos += lead
                while letter(cur, pos):
                    pos += 1
                pos += cur.contraction(pos, uc.tolower)
                cur.add(pos)
                continue
            if f & NUMBER:
                first = pos
                while cur.flags(pos) & NUMBER:
                    pos += 1
                    if pos - first >= 3:
                        cur.add(pos)
                        first = pos
                cur.add(pos)
                continue
            f2 = cur.flags(pos + 1) if c == 0x20 else f
            if f2 and not f2 & (WHITESPACE | LETTER | NUMBER):
                pos += c == 0x20
                while (g := cur.flags(pos)) and not g & (WHITESPACE | LETTER | NUMBER):
                    pos += 1
                while cur.cpt(pos) in (CR, LF):
                    pos += 1
                cur.add(pos)
                continue
            pos = cur.whitespace(pos)
            cur.add(pos)
    return out


def split_digit_groups(cpts: list[int], offsets: list[int]) -> list[int]:
    """AFMoE's digits: a run of digits as its leading len % 3 digits, then threes. The leading
    group takes whatever came before it in the piece along (as llama.cpp's splitter does)."""
    out: list[int] = []
    for ini, end in _ranges(offsets):
        cur = _Cursor(cpts, ini, end, out)
        pos = ini
        while pos < end:
            if not cur.flags(pos) & NUMBER:
                pos += 1
                continue
            first = pos
            while pos < end and cur.flags(pos) & NUMBER:
                pos += 1
            at = first + (pos - first) % 3
            if at > first:
                cur.add(at)
            while at < pos:
                at += 3
                cur.add(at)
        if cur.prev < end:
            cur.add(end)
    return out


def split_newline_runs(cpts: list[int], offsets: list[int]) -> list[int]:
    out: list[int] = []
    for ini, end in _ranges(offsets):
        pos = ini
        while pos < end:
            start, newline = pos, cpts[pos] == LF
            while pos < end and (cpts[pos] == LF) == newline:
                pos += 1
            out.append(pos - start)
    return out


_ASCII_DIGITS = range(0x30, 0x3A)


def split_thousands(cpts: list[int], offsets: list[int]) -> list[int]:
    r"""SuperBPE's (?=(\d{3})+(?!\d)) without the regex's quadratic time on long digit runs:
    a cut before every ASCII digit that has a multiple of three digits from it to the run's
    end (llama.cpp runs the regex; `test_thousands_as_the_regex` holds the two equal)."""
    out: list[int] = []
    for ini, end in _ranges(offsets):
        cuts, pos = [ini], ini
        while pos < end:
            if cpts[pos] not in _ASCII_DIGITS:
                pos += 1
                continue
            first = pos
            while pos < end and cpts[pos] in _ASCII_DIGITS:
                pos += 1
            cuts += range(first + (pos - first) % 3, pos - 2, 3)
        cuts.append(end)
        out += [b - a for a, b in zip(cuts, cuts[1:]) if b > a]
    return out


# unicode_regex_split_custom: the patterns with a hand-written splitter
CUSTOM = {GPT2: split_gpt2, LLAMA3: split_llama3, LLAMA3_ORIGINAL: split_llama3,
          QWEN2: split_qwen2, QWEN35: split_qwen35, KIMI_K2: split_kimi_k2,
          AFMOE_DIGITS: split_digit_groups, NEWLINE_RUNS: split_newline_runs,
          DIGITS_BY_THREE: split_digit_groups}
# ... and those run here by a faster twin of the regex llama.cpp runs
FAST = {THOUSANDS: split_thousands}


# --- the general path: a regex on the collapsed text or the code points ----------------------

# \p{...} -> (the collapsed character, the ASCII members) (unicode_regex_split's tables)
_CATEGORY_CLASS = {
    r"\p{N}": (uc.COLLAPSED[NUMBER], "0-9"),
    r"\p{L}": (uc.COLLAPSED[LETTER], "A-Za-z"),
    r"\p{P}": (uc.COLLAPSED[uc.PUNCTUATION], r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
    r"\p{M}": (uc.COLLAPSED[ACCENT_MARK], ""),
    r"\p{S}": (uc.COLLAPSED[uc.SYMBOL], r"\$\+<->^`\|\~"),
    **{rf"\p{{{k}}}": (uc.COLLAPSED[LETTER], "A-Za-z") for k in ("Lu", "Ll", "Lt", "Lm", "Lo")},
}


def uses_categories(pattern: str) -> bool:
    return any(k in pattern for k in _CATEGORY_CLASS)


def collapse_pattern(pattern: str) -> str:
    """The pattern for the collapsed text: each \\p{X} as a class (or inside the class it is
    in) of X's collapsed character and X's ASCII members."""
    if any(ord(ch) > 0x7F for ch in pattern):
        raise ValueError(f"pattern {pattern!r} mixes \\p{{...}} and non-ASCII characters")
    out, inside, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "[" and (i == 0 or pattern[i - 1] != "\\"):
            inside = True
        elif ch == "]" and inside and pattern[i - 1] != "\\":
            inside = False
        elif pattern.startswith("\\p{", i):
            close = pattern.find("}", i + 3)
            cls = _CATEGORY_CLASS.get(pattern[i:close + 1]) if 0 <= close <= i + 10 else None
            if cls is not None:
                body = cls[0] + cls[1]
                out.append(body if inside else f"[{body}]")
                i = close + 1
                continue
        out.append(ch)
        i += 1
    return "".join(out)


@functools.lru_cache(maxsize=128)
def compiled_pattern(pattern: str) -> tuple[re.Pattern, bool]:
    """The Python regex standing in for llama.cpp's std::regex, and whether it runs on the
    collapsed text."""
    collapsed = uses_categories(pattern)
    source = collapse_pattern(pattern) if collapsed else pattern
    if source.endswith("$") and not source.endswith("\\$"):
        source = source[:-1] + r"\Z"  # ECMAScript's $ is the end of the input only
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return re.compile(source, re.ASCII), collapsed


def _regex_split(rx: re.Pattern, text: str, offsets: list[int]) -> list[int]:
    """unicode_regex_split_stl: within each piece, every match a piece, and so is what lies
    between matches."""
    out: list[int] = []
    for ini, end in _ranges(offsets):
        piece, at = text[ini:end], 0
        for m in rx.finditer(piece):
            if m.start() > at:
                out.append(m.start() - at)
            out.append(m.end() - m.start())
            at = m.end()
        if at < len(piece):
            out.append(len(piece) - at)
    return out


def split(cpts: list[int], patterns: tuple[str, ...]) -> list[list[int]]:
    """unicode_regex_split (without the byte encoding): the words, as lists of code points."""
    offsets = [len(cpts)] if cpts else []
    texts: dict[bool, str] = {}
    for pattern in patterns:
        custom = CUSTOM.get(pattern) or FAST.get(pattern)
        if custom is not None:
            offsets = custom(cpts, offsets)
            continue
        rx, collapsed = compiled_pattern(pattern)
        if collapsed not in texts:
            texts[collapsed] = uc.collapse(cpts) if collapsed else uc.widen(cpts)
        offsets = _regex_split(rx, texts[collapsed], offsets)
    words, start = [], 0
    for n in offsets:
        if n:
            words.append(cpts[start:start + n])
        start += n
    return words
