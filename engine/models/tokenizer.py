"""WordPiece: BERT's tokenizer, built from the vocabulary a GGUF file carries.

Mirrors the Hugging Face BERT tokenizer (the basic tokenizer, then WordPiece), which llama.cpp's
`llm_tokenizer_wpm` reproduces:
1. clean: drop NUL, U+FFFD and control characters; every kind of whitespace becomes a space;
2. put spaces around CJK ideographs, so each is a word of its own;
3. lower-case, then strip accents (NFD, drop the combining marks) when the file asks for it
   (`tokenizer.ggml.normalizer.lowercase`, `...strip_accents`, which defaults to lowercase);
4. split on whitespace, then split every punctuation character off as a word of its own;
5. WordPiece each word: the longest vocabulary entry from the start, then the longest
   continuation, and so on; a word that cannot be covered (or is over 100 characters) is [UNK].
llama.cpp's converter stores the vocabulary with a "phantom space": a word-initial piece `the` is
the string '▁the', a continuation `##ing` is 'ing'; vocabularies in the '##' style work too.
Leaves out: special-token parsing inside the text ("[SEP]" in the input is ordinary text, as in
llama.cpp's default), the SentencePiece and BPE tokenizers of other models.
"""

from __future__ import annotations

import unicodedata

PHANTOM = "\u2581"  # '▁'
MAX_WORD_CHARS = 100  # Hugging Face's max_input_chars_per_word

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK)


def is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def is_punctuation(ch: str) -> bool:
    """All ASCII non-alphanumerics count (BERT's rule), plus Unicode's P* categories."""
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(ch).startswith("P")


def basic_split(text: str, lowercase: bool = True, strip_accents: bool = True) -> list[str]:
    """Steps 1-4: the words WordPiece then cuts into pieces."""
    chars = []
    for ch in text:
        if ch in ("\0", "\ufffd") or is_control(ch):
            continue
        if is_whitespace(ch):
            chars.append(" ")
        elif is_cjk(ch):
            chars.append(f" {ch} ")
        else:
            chars.append(ch)
    text = "".join(chars)
    if lowercase:
        text = text.lower()
    if strip_accents:
        text = "".join(c for c in unicodedata.normalize("NFD", text)
                       if unicodedata.category(c) != "Mn")
    words = []
    for word in text.split():
        current = ""
        for ch in word:
            if is_punctuation(ch):
                if current:
                    words.append(current)
                words.append(ch)
                current = ""
            else:
                current += ch
        if current:
            words.append(current)
    return words


class WordPiece:
    """The vocabulary (id <-> string) and the encoder."""

    def __init__(self, tokens: list[str], unk_id: int, bos_id: int | None = None,
                 eos_id: int | None = None, lowercase: bool = True,
                 strip_accents: bool | None = None) -> None:
        self.tokens = tokens
        self.ids = {}
        for i, t in enumerate(tokens):
            self.ids.setdefault(t, i)  # the first id wins, as in llama.cpp's map
        self.phantom = any(t.startswith(PHANTOM) for t in tokens[:2000])
        self.unk_id, self.bos_id, self.eos_id = unk_id, bos_id, eos_id
        self.lowercase = lowercase
        self.strip_accents = lowercase if strip_accents is None else strip_accents
        self.max_len = max(len(t) for t in tokens) if tokens else 1

    @classmethod
    def from_model_file(cls, f) -> "WordPiece":
        """From a ModelFile's `tokenizer.ggml.*` keys (it must be a 'bert' vocabulary)."""
        from .common import ModelError

        model = f.key("tokenizer.ggml.model")
        if model != "bert":
            raise ModelError(f"{f.path}: tokenizer '{model}' is not WordPiece ('bert')")
        tokens = f.key("tokenizer.ggml.tokens")
        add_bos = bool(f.key("tokenizer.ggml.add_bos_token", True))
        add_eos = bool(f.key("tokenizer.ggml.add_eos_token", True))
        lowercase = bool(f.key("tokenizer.ggml.normalizer.lowercase", False))
        strip = f.reader.get("tokenizer.ggml.normalizer.strip_accents")
        return cls(list(tokens), int(f.key("tokenizer.ggml.unknown_token_id", 100)),
                   int(f.key("tokenizer.ggml.bos_token_id", 101)) if add_bos else None,
                   int(f.key("tokenizer.ggml.eos_token_id", 102)) if add_eos else None,
                   lowercase, None if strip is None else bool(strip))

    def token_text(self, i: int) -> str:
        return self.tokens[i]

    def word_pieces(self, word: str) -> list[int]:
        """Step 5 for one word: greedy longest match; [UNK] if any part cannot be matched."""
        if len(word) > MAX_WORD_CHARS:
            return [self.unk_id]
        out, start = [], 0
        while start < len(word):
            for end in range(min(len(word), start + self.max_len), start, -1):
                piece = word[start:end]
                if start == 0:
                    key = PHANTOM + piece if self.phantom else piece
                else:
                    key = piece if self.phantom else "##" + piece
                i = self.ids.get(key)
                if i is not None:
                    out.append(i)
                    start = end
                    break
            else:
                return [self.unk_id]
        return out

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Token ids of text, with [CLS] ... [SEP] around them as the file says."""
        ids = [i for w in basic_split(text, self.lowercase, self.strip_accents)
               for i in self.word_pieces(w)]
        if add_special:
            ids = ([self.bos_id] if self.bos_id is not None else []) + ids + \
                  ([self.eos_id] if self.eos_id is not None else [])
        return ids

    def decode_pieces(self, ids: list[int]) -> list[str]:
        return [self.tokens[i] for i in ids]
