"""Byte-pair encoding (BPE) as llama.cpp tokenizes with it: GPT-2's, Llama 3's, Qwen's, ...

Mirrors llama.cpp's `llm_tokenizer_bpe` with the vocabulary a GGUF file carries
(`tokenizer.ggml.model` 'gpt2' or 'gemma4'; `.tokens`, `.token_type`, `.merges`, `.pre`):
1. special tokens are cut out of the text first (engine/models/vocab.py's `partition`);
2. each remaining fragment is cut into words by the pre-tokenizer `tokenizer.ggml.pre` names
   (engine/models/pretokenize.py), and each word is spelled in GPT-2's byte characters (or, for
   Gemma 4's SPM-style BPE, kept as UTF-8 with spaces as '▁');
3. a word is split into characters and the adjacent pair with the lowest merge rank is merged,
   again and again (ties: the leftmost pair); where the pre-tokenizer says so (`ignore_merges`,
   Llama 3), a word that is a token as a whole is taken at once;
4. each final symbol is its token; one that is not a token falls back to its bytes, each its
   token when there is one (Gemma 4: '<0xXX>'), else nothing;
5. BOS first and EOS last when the file's add_bos_token / add_eos_token (or llama.cpp's default
   for the pre-tokenizer) say so.
Decoding (`piece`) maps the byte characters back to bytes; control tokens show only when asked.
"""

from __future__ import annotations

import heapq

from . import unicode as uc
from .pretokenize import PRE_NAMES, PreTokenizer, split
from .vocab import Pieces, base_attrs, load_specials, partition, refuse_over, token_texts

PHANTOM = "\u2581"  # '▁'
WORD_CACHE = 4096  # words remembered with their tokens
MAX_MERGES = 1 << 20  # the most merges built (Llama 3 has 280,147): a cap, not llama.cpp's


class BytePairEncoding(Pieces):
    """The vocabulary, the merge ranks and llama.cpp's BPE encoder and decoder."""

    def __init__(self, tokens: list[str], attrs: list[int], merges: list[str],
                 pre: PreTokenizer, specials, add_bos: bool, add_eos: bool) -> None:
        self.tokens, self.attrs, self.pre, self.specials = tokens, attrs, pre, specials
        self.ids = {t: i for i, t in enumerate(tokens)}  # the last id wins, as token_to_id
        # each merge "left right" by its text: llama.cpp cuts it at its first space past the
        # first character (rank); the first rank wins, as bpe_ranks.emplace (so the dict is made
        # from the last merge to the first)
        self.ranks: dict[str, int] = {m: r for r, m in zip(range(len(merges) - 1, -1, -1),
                                                         reversed(merges))}
        self.bos_id, self.eos_id = specials.ids["bos"], specials.ids["eos"]
        self.add_bos, self.add_eos = add_bos, add_eos
        self._words: dict[str, list[int]] = {}

    @classmethod
    def from_model_file(cls, f) -> "BytePairEncoding":
        """From a ModelFile's (or ModelMeta's) `tokenizer.ggml.*` keys."""
        from .common import ModelError

        model = f.key("tokenizer.ggml.model")
        if model not in ("gpt2", "gemma4"):
            raise ModelError(f"{f.path}: tokenizer '{model}' is not BPE ('gpt2', 'gemma4')")
        name = "gemma4" if model == "gemma4" else str(f.reader.get("tokenizer.ggml.pre") or
                                                      "default")
        pre = PRE_NAMES.get(name)
        if pre is None or pre.kind == "whitespace":
            raise ModelError(f"{f.path}: pre-tokenizer '{name}' (tokenizer.ggml.pre) is not "
                             "built here; known: " + ", ".join(sorted(PRE_NAMES)))
        refuse_over(f, "tokenizer.ggml.merges", MAX_MERGES)  # (a merge costs ~0.5 KB, 1.5 µs)
        merges = f.reader.get("tokenizer.ggml.merges")
        if merges is None:
            raise ModelError(f"{f.path}: a BPE vocabulary needs key 'tokenizer.ggml.merges'")
        tokens = token_texts(f)
        attrs = base_attrs(f, len(tokens))
        defaults = {"bos": None, "eos": None} if model == "gemma4" else \
            {"bos": None if pre.no_bos else 11, "eos": 11}
        specials = load_specials(f, tokens, attrs, defaults)
        add_bos, add_eos = pre.add_bos, False
        if f.reader.get("tokenizer.ggml.add_bos_token") is not None:
            add_bos = bool(f.reader.get("tokenizer.ggml.add_bos_token"))
        if f.reader.get("tokenizer.ggml.add_eos_token") is not None:
            add_eos = bool(f.reader.get("tokenizer.ggml.add_eos_token"))
        if pre.kind == "gemma4":
            add_bos = True  # llama.cpp overrides Gemma 4's add_bos_token
        return cls(tokens, attrs, list(merges), pre, specials, add_bos, add_eos)

    # --- encoding -----------------------------------------------------------------------------

    def encode(self, text: str | bytes, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        """Token ids of `text` (llama_tokenize(vocab, text, add_special, parse_special))."""
        data = text.encode() if isinstance(text, str) else bytes(text)
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(_need(self.bos_id, "BOS"))
        for frag in partition(data, self.specials.cache, self.tokens, self.attrs, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                continue
            if self.pre.escape_whitespaces:
                frag = frag.replace(b" ", PHANTOM.encode())
            for word in split(uc.cpts_from_utf8(frag), self.pre.patterns):
                out += self._word(word)
        if add_special and self.add_eos:
            out.append(_need(self.eos_id, "EOS"))
        return out

    def _word(self, cpts: list[int]) -> list[int]:
        """The tokens of one pre-tokenized word (remembered: texts repeat their words)."""
        utf8 = uc.cpts_to_utf8(cpts)
        word = uc.byte_encode(utf8) if self.pre.byte_level else \
            utf8.decode("utf-8", "surrogatepass")
        ids = self._words.get(word)
        if ids is None:
            ids = [i for sym in self.merge(word) for i in self._symbol(sym)]
            if len(self._words) >= WORD_CACHE:
                self._words.clear()
            self._words[word] = ids
        return ids

    def merge(self, word: str) -> list[str]:
        """llm_tokenizer_bpe_session::tokenize for one word: its symbols after the merges."""
        whole = self.ids.get(word)
        if whole is not None and (self.pre.ignore_merges or
                                  (self.pre.kind == "gemma4" and not word.strip("\n"))):
            return [word]
        sym = list(word)  # one character each; '' once merged into its left neighbour
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        queue: list[tuple[int, int, int, str]] = []  # (rank, left, right, merged text)

        def push(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            first = sym[left]
            rank = self.ranks.get(first + " " + sym[right])
            if rank is not None and first and first.find(" ", 1) < 0:  # (else its text cuts elsewhere)
                heapq.heappush(queue, (rank, left, right, sym[left] + sym[right]))

        for k in range(1, len(sym)):
            push(k - 1, k)
        while queue:
            _, left, right, text = heapq.heappop(queue)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
                continue  # one side has changed since the pair was queued
            sym[left], sym[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            push(prv[left], left)
            push(left, nxt[left])
        return [s for s in sym if s]

    def _symbol(self, sym: str) -> list[int]:
        """A final symbol's token, or its bytes' tokens where it is none."""
        tok = self.ids.get(sym)
        if tok is not None:
            return [tok]
        out = []
        for b in sym.encode("utf-8", "surrogatepass"):
            key = chr(b) if b < 0x80 else None
            if self.pre.byte_level:
                tok = self.ids.get(key) if key is not None else None
            else:
                tok = self.ids.get(f"<0x{b:02X}>")
            if tok is not None:
                out.append(tok)
        return out

    # --- decoding -----------------------------------------------------------------------------

    def normal_piece(self, text: str) -> bytes:
        if self.pre.escape_whitespaces:
            return text.replace(PHANTOM, " ").encode("utf-8", "surrogateescape")
        return decode_text(text)


def decode_text(text: str) -> bytes:
    """llama_decode_text: each GPT-2 byte character back to its byte; any other character
    as llama.cpp spells it, '[UNK_BYTE_0x..<the token>]'."""
    out = bytearray()
    for ch in text:
        b = uc.CHAR_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8 = ch.encode("utf-8", "surrogatepass")
            out += b"[UNK_BYTE_0x" + utf8.hex().encode() + text.encode("utf-8", "surrogatepass") \
                + b"]"
    return bytes(out)


def _need(token: int | None, what: str) -> int:
    if token is None:
        raise ValueError(f"the vocabulary asks for a {what} token but names none")
    return token
