"""WordPiece: BERT's tokenizer as llama.cpp's `llm_tokenizer_wpm` runs it on a GGUF vocabulary.

1. special tokens are cut out of the text first (engine/models/vocab.py's `partition`);
2. each fragment's code points: with `strip_accents`, each becomes the first code point of its
   canonical decomposition and combining marks are dropped; NUL, U+FFFD and control characters
   are dropped; with `lowercase`, each is lower-cased (`tokenizer.ggml.normalizer.lowercase`,
   default true; strip_accents defaults to it);
3. whitespace ends a word; punctuation, ASCII symbols and CJK ideographs are words of their own;
4. WordPiece each word, as bytes: '▁' + word, then from each position the longest vocabulary
   entry (at most the longest token's length); a word any part of which matches nothing is [UNK];
5. [CLS] first and [SEP] last when asked (add_special).
llama.cpp's converter stores the vocabulary with a "phantom space": a word-initial piece `the` is
the string '▁the', a continuation `##ing` is 'ing'.
"""

from __future__ import annotations

from . import unicode as uc
from .vocab import Pieces, TokenAttr, base_attrs, load_specials, partition, token_texts

PHANTOM = "\u2581"  # '▁'

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))
# (0x2B920, not 0x2B820: Hugging Face's Rust code, which llama.cpp follows)


def is_cjk(cpt: int) -> bool:
    return any(lo <= cpt <= hi for lo, hi in _CJK)


def basic_split(text: str | bytes, lowercase: bool = True,
                strip_accents: bool = True) -> list[str]:
    """Steps 2-3 (llm_tokenizer_wpm_session::preprocess): the words WordPiece then cuts."""
    data = text.encode() if isinstance(text, str) else text
    words: list[str] = []
    word: list[str] = []
    for cpt in uc.cpts_from_utf8(data):
        if strip_accents:
            cpt = uc.nfd_first(cpt)
        f = uc.flags(cpt)
        if f & uc.WHITESPACE:
            if word:
                words.append("".join(word))
                word = []
            continue
        if cpt in (0, 0xFFFD) or f & uc.CONTROL or (strip_accents and f & uc.ACCENT_MARK):
            continue
        ch = chr(uc.tolower(cpt) if lowercase else cpt)
        if f & uc.PUNCTUATION or (cpt < 0x7F and f & uc.SYMBOL) or is_cjk(cpt):
            if word:
                words.append("".join(word))
                word = []
            words.append(ch)
        else:
            word.append(ch)
    if word:
        words.append("".join(word))
    return words


class WordPiece(Pieces):
    """The vocabulary (id <-> string) and llama.cpp's WPM encoder and decoder."""

    def __init__(self, tokens: list[str], unk_id: int, bos_id: int | None = None,
                 eos_id: int | None = None, lowercase: bool = True,
                 strip_accents: bool | None = None, attrs: list[int] | None = None,
                 specials=None) -> None:
        self.tokens = tokens
        self.ids = {t: i for i, t in enumerate(tokens)}  # the last id wins, as token_to_id
        self.unk_id, self.bos_id, self.eos_id = unk_id, bos_id, eos_id  # eos: [SEP]
        self.add_bos = True
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.attrs = attrs if attrs is not None else [int(TokenAttr.NORMAL)] * len(tokens)
        self.cache = specials.cache if specials is not None else ()
        self.max_len = max(len(t.encode("utf-8", "surrogateescape")) for t in tokens) \
            if tokens else 1
        self._bytes = {t.encode("utf-8", "surrogateescape"): i for i, t in enumerate(tokens)}

    @classmethod
    def from_model_file(cls, f) -> "WordPiece":
        """From a ModelFile's `tokenizer.ggml.*` keys (it must be a 'bert' vocabulary)."""
        from .common import ModelError

        model = f.key("tokenizer.ggml.model")
        if model != "bert":
            raise ModelError(f"{f.path}: tokenizer '{model}' is not WordPiece ('bert')")
        tokens = token_texts(f)
        attrs = base_attrs(f, len(tokens))
        specials = load_specials(f, tokens, attrs, {"bos": 101, "unk": 100, "sep": 102,
                                                    "pad": 0, "mask": 103})
        lowercase = f.reader.get("tokenizer.ggml.normalizer.lowercase")
        lowercase = True if lowercase is None else bool(lowercase)
        strip = f.reader.get("tokenizer.ggml.normalizer.strip_accents")
        ids = specials.ids
        wp = cls(tokens, ids["unk"], ids["bos"], ids["sep"], lowercase,
                 None if strip is None else bool(strip), attrs, specials)
        add_bos = f.reader.get("tokenizer.ggml.add_bos_token")
        wp.add_bos = True if add_bos is None else bool(add_bos)  # what llama-tokenize asks
        return wp

    def token_text(self, i: int) -> str:
        return self.tokens[i]

    def word_pieces(self, word: str) -> list[int]:
        """Step 4 for one word: greedy longest match over its bytes; [UNK] if a part fails."""
        data = (PHANTOM + word).encode("utf-8", "surrogatepass")
        out, i, n = [], 0, len(data)
        while i < n:
            for j in range(min(n, i + self.max_len + 1), i, -1):
                tok = self._bytes.get(data[i:j])
                if tok is not None:
                    out.append(tok)
                    i = j
                    break
            else:
                return [self.unk_id]
        return out or [self.unk_id]

    def encode(self, text: str | bytes, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        """Token ids of text, with [CLS] ... [SEP] around them as the file says."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        ids: list[int] = []
        for frag in partition(data, self.cache, self.tokens, self.attrs, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
                continue
            ids += [i for w in basic_split(frag, self.lowercase, self.strip_accents)
                    for i in self.word_pieces(w)]
        if add_special:
            ids = ([self.bos_id] if self.bos_id is not None else []) + ids + \
                  ([self.eos_id] if self.eos_id is not None else [])
        return ids

    def normal_piece(self, text: str) -> bytes:
        """A word piece with its phantom space as a space."""
        return text.replace(PHANTOM, " ").encode("utf-8", "surrogateescape")

    def decode_pieces(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]
