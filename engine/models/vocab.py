"""What every llama.cpp tokenizer shares: token attributes, special tokens, the text's partition.

Mirrors the parts of llama.cpp's `llama_vocab` that do not depend on the tokenizer's kind:
- each token's attributes (`LLAMA_TOKEN_ATTR_*`), from its GGUF token type, then the fixes
  llama.cpp applies by the token's text: end-of-generation and fill-in-the-middle tokens become
  CONTROL, control tokens named "unused" UNUSED, gpt-oss's channel tokens USER_DEFINED, and a
  few per-model strip flags (Phi-3's special tokens eat the spaces after them);
- the special ids (BOS, EOS, ...) with their defaults and `tokenizer.ggml.*_token_id` keys, and
  the end-of-generation set;
- `partition` (tokenizer_st_partition): the text cut around special tokens, longest first;
  user-defined tokens always, control and unknown ones only when `parse_special`.
Leaves out: llama.cpp's hash-map order where two candidates tie (which of two fill-in-the-middle
spellings is taken, the order of special tokens of equal length): ids decide here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntFlag

import numpy as np

MAX_TEXT_BYTES = 1 << 20  # longest text tokenized at once (1 MiB): a cap, not llama.cpp's
MAX_TOKENS = 1 << 20  # the largest vocabulary built (Gemma 3's has 262,144): a cap, not llama.cpp's
C_SPACES = b" \t\n\v\f\r"  # isspace() in the C locale


class TokenAttr(IntFlag):
    """llama_token_attr."""
    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# tokenizer.ggml.token_type (llama_token_type) -> attribute
TOKEN_TYPE_ATTR = {0: TokenAttr.UNDEFINED, 1: TokenAttr.NORMAL, 2: TokenAttr.UNKNOWN,
                   3: TokenAttr.CONTROL, 4: TokenAttr.USER_DEFINED, 5: TokenAttr.UNUSED,
                   6: TokenAttr.BYTE}
SPECIAL = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)  # (an int: `attr & SPECIAL`
# runs for every token of a 262k vocabulary, and IntFlag arithmetic costs ~1 µs)

# the special-token roles llama.cpp reads from keys (tokenizer.ggml.<key>), in its order, and the
# texts by which it finds a role's token when the file names none (that token becomes CONTROL)
ROLE_KEYS = (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
             ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
             ("pad", "padding_token_id"), ("mask", "mask_token_id"),
             ("fim_pre", "fim_pre_token_id"), ("fim_suf", "fim_suf_token_id"),
             ("fim_mid", "fim_mid_token_id"), ("fim_pad", "fim_pad_token_id"),
             ("fim_rep", "fim_rep_token_id"), ("fim_sep", "fim_sep_token_id"),
             ("fim_pre", "prefix_token_id"), ("fim_suf", "suffix_token_id"),
             ("fim_mid", "middle_token_id"))
ROLE_TEXTS = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
            "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
            "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
# texts that end generation (and so are control tokens), whatever their GGUF type
EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["))
ALWAYS_SHOWN = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")  # gpt-oss


@dataclass(frozen=True, slots=True)
class Specials:
    """The special ids of a vocabulary (None: the vocabulary has none)."""
    ids: dict  # role ('bos', 'eos', 'eot', 'sep', 'fim_pre', ...) -> token id or None
    eog: frozenset  # the ids that end generation (llama_vocab_is_eog)
    cache: tuple  # ids with CONTROL, USER_DEFINED or UNKNOWN, longest text first


class Pieces:
    """What every tokenizer's token_to_piece shares (SentencePiece, BPE, WordPiece): control and
    unknown tokens (their text only when special pieces are asked for), user-defined tokens, byte
    tokens <0xXX>; a NORMAL token's text as the kind spells it (normal_piece)."""

    tokens: list[str]
    attrs: list[int]
    ids: dict[str, int]  # a token's text -> its id (the last id wins, as llama.cpp's map)

    def normal_piece(self, text: str) -> bytes:
        raise NotImplementedError

    def encode(self, text: str | bytes, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        raise NotImplementedError

    def piece(self, token: int, special: bool = False) -> bytes:
        """token_to_piece: the bytes a token stands for."""
        text, attr = self.tokens[token], self.attrs[token]
        if attr & (TokenAttr.CONTROL | TokenAttr.UNKNOWN):
            return text.encode("utf-8", "surrogateescape") if special else b""
        if attr & TokenAttr.USER_DEFINED:
            return text.encode("utf-8", "surrogateescape")
        if attr & TokenAttr.NORMAL:
            return self.normal_piece(text)
        if attr & TokenAttr.BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def piece_text(self, token: int) -> str:
        """A token as a learner reads it: its text, control tokens included ('<bos>')."""
        return self.piece(token, special=True).decode("utf-8", errors="replace")

    def decode(self, tokens: list[int], special: bool = False) -> str:
        return b"".join(self.piece(t, special) for t in tokens).decode("utf-8", "replace")

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt as a chat's is read: special tokens parsed (`<start_of_turn>` is one token),
        BOS added when the vocabulary asks for it and the text does not start with it already
        (a chat template writes it itself)."""
        bos = getattr(self, "bos_id", None)
        starts = bos is not None and text.startswith(self.tokens[bos])
        return self.encode(text, add_special=not starts, parse_special=True)


def token_texts(f) -> list[str]:
    """tokenizer.ggml.tokens, an empty token spelled '[EMPTY_<id>]' as llama.cpp names it."""
    refuse_over(f, "tokenizer.ggml.tokens", MAX_TOKENS)
    tokens = list(f.key("tokenizer.ggml.tokens"))
    return tokens if all(tokens) else [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]


def refuse_over(f, key: str, cap: int) -> None:
    """An error when the file's array `key` declares more than `cap` elements: checked on the
    count the file declares, before any element is decoded (a file may declare millions)."""
    from .common import ModelError

    i = f.reader.find_key(key)
    n = f.reader.kvs[i].n if i >= 0 else 0
    if n > cap:
        raise ModelError(f"{f.path}: {key} holds {n:,} elements; a vocabulary built here holds "
                         f"at most {cap:,}")


def base_attrs(f, n_tokens: int) -> list[int]:
    """Each token's attribute from tokenizer.ggml.token_type (NORMAL when the file has none)."""
    types = f.reader.get("tokenizer.ggml.token_type")
    if types is None:
        return [int(TokenAttr.NORMAL)] * n_tokens
    return type_attrs(types[:n_tokens])


_TYPE_ATTR = {k: int(v) for k, v in TOKEN_TYPE_ATTR.items()}


def type_attrs(types) -> list[int]:
    """The attribute of each token_type value (UNDEFINED for a value llama.cpp does not know)."""
    return [_TYPE_ATTR.get(t, int(TokenAttr.UNDEFINED)) for t in as_list(types, int)]


def as_list(values, kind: type) -> list:
    """A key's array as a list of Python floats or ints (a file's numpy array converted at once)."""
    if isinstance(values, np.ndarray) and values.dtype.kind in ("f" if kind is float else "iu"):
        return values.tolist()
    return [kind(v) for v in values]


def load_specials(f, tokens: list[str], attrs: list[int], defaults: dict) -> Specials:
    """The special ids (defaults, then the file's keys) and llama.cpp's fixes of `attrs` by token
    text (done in place, as llama_vocab::impl::load does)."""
    n = len(tokens)
    ids: dict = {role: None for role, _ in ROLE_KEYS}
    for role, value in defaults.items():
        ids[role] = value if value is not None and 0 <= value < n else None
    for role, key in ROLE_KEYS:
        value = f.reader.get(f"tokenizer.ggml.{key}")
        if value is not None and 0 <= int(value) < n:
            ids[role] = int(value)
    by_text = dict(zip(tokens, range(n)))  # the last id wins, as token_to_id
    control, user = int(TokenAttr.CONTROL), int(TokenAttr.USER_DEFINED)
    for role, role_texts in ROLE_TEXTS.items():
        if ids[role] is None:
            found = sorted(by_text[t] for t in role_texts if t in by_text)
            if found:
                ids[role] = found[0]
                attrs[found[0]] |= control
    for i, t in enumerate(tokens):
        if attrs[i] & control and "unused" in t:
            attrs[i] |= int(TokenAttr.UNUSED)
    eog = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if ids[r] is not None}
    for t in EOG_TEXTS:
        if t in by_text:
            eog.add(by_text[t])
            attrs[by_text[t]] |= control
    for t in ALWAYS_SHOWN:
        if t in by_text:
            attrs[by_text[t]] = user
    eog |= {ids[r] for r in ("eos", "eot", "eom") if ids[r] is not None}
    texts = {tokens[i]: i for i in eog}
    if "<|end|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts) \
            and ("<|return|>" in texts or "<|flush|>" in texts):  # o200k_harmony, solar-open
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = user
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = int(TokenAttr.NORMAL)
    cache = sorted((i for i in range(n) if attrs[i] & SPECIAL),
                   key=lambda i: -len(tokens[i].encode("utf-8", "surrogateescape")))
    _strip_flags(f, tokens, attrs, by_text, cache)
    return Specials(ids, frozenset(eog), tuple(cache))


def _strip_flags(f, tokens, attrs, by_text, cache) -> None:
    """The per-model LSTRIP/RSTRIP flags llama.cpp sets by model, tokenizer or architecture."""
    name = str(f.reader.get("general.name") or "").lower()
    pre = str(f.reader.get("tokenizer.ggml.pre") or "")
    arch = str(f.reader.get("general.architecture") or "")
    lstrip, rstrip = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) \
            or any(s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        if "<mask>" in by_text:
            attrs[by_text["<mask>"]] |= lstrip
    elif "phi-3" in name or "phi3" in name:
        for i in cache:
            attrs[i] |= rstrip
        if "</s>" in by_text:
            attrs[by_text["</s>"]] |= rstrip
        for t in ("<unk>", "<s>", "<|endoftext|>"):
            if t in by_text:
                attrs[by_text[t]] &= ~rstrip
    elif "modern-bert" in name and "[MASK]" in by_text:
        attrs[by_text["[MASK]"]] |= lstrip


def check_length(text: bytes) -> None:
    if len(text) > MAX_TEXT_BYTES:
        raise ValueError(f"the text has {len(text)} bytes; ggml-lens tokenizes at most "
                         f"{MAX_TEXT_BYTES} at once")


def partition(text: bytes, cache, tokens: list[str], attrs: list[int],
              parse_special: bool) -> list[bytes | int]:
    """tokenizer_st_partition: the text as fragments of raw bytes and special token ids."""
    check_length(text)
    frags: list[bytes | int] = [text] if text else []
    skip = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)
    for tok in cache:
        attr = attrs[tok]
        if not parse_special and attr & skip:
            continue
        needle = tokens[tok].encode("utf-8", "surrogateescape")
        out: list[bytes | int] = []
        for frag in frags:
            if isinstance(frag, int) or needle not in frag:
                out.append(frag)
                continue
            rest = frag
            while True:
                at = rest.find(needle)
                if at < 0:
                    if rest:
                        out.append(rest)
                    break
                left, rest = rest[:at], rest[at + len(needle):]
                if attr & TokenAttr.LSTRIP:
                    left = left.rstrip(C_SPACES)
                if left:
                    out.append(left)
                out.append(tok)
                if attr & TokenAttr.RSTRIP:
                    rest = rest.lstrip(C_SPACES)
        frags = out
    return frags
