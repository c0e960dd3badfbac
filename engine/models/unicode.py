"""llama.cpp's unicode.cpp: what its tokenizers know about characters.

- `cpts_from_utf8`: bytes to code points as llama.cpp decodes them (no check for overlong forms or
  surrogates; a byte that starts no valid sequence becomes U+FFFD on its own);
- `flags`: a code point's general category as one bit (\\p{N}, \\p{L}, \\p{Z}, \\p{M}, \\p{P},
  \\p{S}, \\p{C}, unassigned), plus White_Space. llama.cpp's tables are Unicode 15.1, so they come
  from `unicodedata2` 15.1 rather than this Python's `unicodedata` (Unicode 14 in Python 3.11);
- GPT-2's byte <-> character map, with which byte-level BPE vocabularies spell their tokens;
- `collapse`: every code point as one character for the regex engine: ASCII as itself, other
  whitespace as '\\v', others as the byte llama.cpp gives their category (0xD1 numbers, 0xD2
  letters, ...), so a pattern's \\p{L} becomes a plain character class.
Leaves out: the upper-case map (no tokenizer here needs it).
"""

from __future__ import annotations

import unicodedata2 as ucd

# unicode_cpt_flags: one bit per category, then the helper bit
UNDEFINED, NUMBER, LETTER, SEPARATOR = 0x0001, 0x0002, 0x0004, 0x0008
ACCENT_MARK, PUNCTUATION, SYMBOL, CONTROL = 0x0010, 0x0020, 0x0040, 0x0080
WHITESPACE = 0x0100

# general category (its first letter; Cn apart) -> flag
CATEGORY_FLAG = {"N": NUMBER, "L": LETTER, "Z": SEPARATOR, "M": ACCENT_MARK,
                 "P": PUNCTUATION, "S": SYMBOL, "C": CONTROL}
# Unicode's White_Space property (llama.cpp's unicode_set_whitespace)
WHITESPACE_CPTS = frozenset([0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680,
                             *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
MAX_CODEPOINT = 0x10FFFF
REPLACEMENT = 0xFFFD

_flags_cache: dict[int, int] = {}


def flags(cpt: int) -> int:
    """unicode_cpt_flags_from_cpt: the category bit (and WHITESPACE) of a code point."""
    f = _flags_cache.get(cpt)
    if f is None:
        if cpt > MAX_CODEPOINT:
            f = UNDEFINED
        else:
            cat = ucd.category(chr(cpt))
            f = UNDEFINED if cat == "Cn" else CATEGORY_FLAG[cat[0]]
            if cpt in WHITESPACE_CPTS:
                f |= WHITESPACE
        _flags_cache[cpt] = f
    return f


def cpts_from_utf8(data: bytes) -> list[int]:
    """unicode_cpts_from_utf8: the lead byte says the length; the continuation bytes must be
    10xxxxxx and present, else the lead byte alone becomes U+FFFD and decoding goes on after it."""
    try:
        return [ord(c) for c in data.decode("utf-8")]  # valid UTF-8 decodes the same
    except UnicodeDecodeError:
        pass
    out: list[int] = []
    n, i = len(data), 0
    while i < n:
        b = data[i]
        if b < 0x80:
            out.append(b)
            i += 1
            continue
        size = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 0
        if size and i + size <= n and all(data[i + k] & 0xC0 == 0x80 for k in range(1, size)):
            cpt = b & (0x7F >> size)
            for k in range(1, size):
                cpt = (cpt << 6) | (data[i + k] & 0x3F)
            out.append(cpt)
            i += size
        else:
            out.append(REPLACEMENT)
            i += 1
    return out


def cpt_to_utf8(cpt: int) -> bytes:
    """unicode_cpt_to_utf8 (surrogates are written as they are, as C++ does)."""
    if cpt < 0x80:
        return bytes([cpt])
    if cpt < 0x800:
        return bytes([0xC0 | cpt >> 6, 0x80 | cpt & 0x3F])
    if cpt < 0x10000:
        return bytes([0xE0 | cpt >> 12, 0x80 | (cpt >> 6) & 0x3F, 0x80 | cpt & 0x3F])
    if cpt <= MAX_CODEPOINT:
        return bytes([0xF0 | cpt >> 18, 0x80 | (cpt >> 12) & 0x3F, 0x80 | (cpt >> 6) & 0x3F,
                      0x80 | cpt & 0x3F])
    raise ValueError(f"invalid codepoint 0x{cpt:X} (over U+10FFFF) in the text")


def cpts_to_utf8(cpts: list[int]) -> bytes:
    return b"".join(cpt_to_utf8(c) for c in cpts)


def tolower(cpt: int) -> int:
    """unicode_tolower: the simple lower-case mapping (one code point), else the code point."""
    if cpt > MAX_CODEPOINT or 0xD800 <= cpt <= 0xDFFF:
        return cpt
    return ord(chr(cpt).lower()[0])  # 'İ' -> 'i' (the first of 'i̇'), as llama.cpp's table


def nfd_first(cpt: int) -> int:
    """unicode_cpts_normalize_nfd for one code point: the first of its canonical decomposition
    (so 'Ä' -> 'A', a Hangul syllable -> its first jamo)."""
    if cpt > MAX_CODEPOINT or 0xD800 <= cpt <= 0xDFFF:
        return cpt
    return ord(ucd.normalize("NFD", chr(cpt))[0])


def is_han(cpt: int) -> bool:
    """unicode_cpt_is_han: the CJK ideograph blocks."""
    return any(lo <= cpt <= hi for lo, hi in _HAN)


_HAN = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0x2CEB0, 0x2EBEF), (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F))


def _gpt2_bytes() -> list[str]:
    """GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68
    bytes for U+0100 onwards, in byte order."""
    own = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    out, extra = [""] * 256, 0
    for b in range(256):
        if b in own:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


BYTE_TO_CHAR = _gpt2_bytes()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}
_BYTE_ENCODE = {b: c for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(data: bytes) -> str:
    """unicode_byte_encoding_process for one word: each byte as its GPT-2 character."""
    return "".join(map(_BYTE_ENCODE.__getitem__, data))


# the character each category collapses to (unicode_regex_split's k_ucat_cpt)
COLLAPSED = {NUMBER: "\xd1", LETTER: "\xd2", PUNCTUATION: "\xd3", ACCENT_MARK: "\xd4",
             SYMBOL: "\xd5"}
COLLAPSED_OTHER = "\xd0"


def collapse(cpts: list[int]) -> str:
    """The text with one character per code point, for patterns that use \\p{...}."""
    out = []
    for c in cpts:
        if c < 0x80:
            out.append(chr(c))
            continue
        f = flags(c)
        out.append("\x0b" if f & WHITESPACE else COLLAPSED.get(f & 0xFF, COLLAPSED_OTHER))
    return "".join(out)


def widen(cpts: list[int]) -> str:
    """The text for patterns without \\p{...} (llama.cpp's std::wregex path): every code point as
    itself, but non-ASCII whitespace as '\\v', which ECMAScript's \\s matches."""
    return "".join("\x0b" if c > 0x7F and flags(c) & WHITESPACE else chr(min(c, MAX_CODEPOINT))
                   for c in cpts)
