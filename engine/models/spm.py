"""SentencePiece (SPM) as llama.cpp tokenizes with it: LLaMA's, Gemma's vocabularies.

Mirrors llama.cpp's `llm_tokenizer_spm` with the vocabulary a GGUF file carries
(`tokenizer.ggml.tokens`, `.scores`, `.token_type`):
1. special tokens are cut out of the text first (engine/models/vocab.py's `partition`):
   user-defined tokens always, control and unknown ones only when `parse_special` (a chat
   template's `<start_of_turn>`);
2. each remaining piece gets a leading space if the file asks (`add_space_prefix`) and the piece
   follows a special token or starts the text; spaces become '▁';
3. the piece is split into UTF-8 characters, and the adjacent pair whose concatenation is the
   highest-scoring vocabulary entry is merged, again and again (ties: the leftmost pair);
4. each final symbol is its token, or the pair it was merged from, recursively; a symbol that was
   never a token becomes its bytes, `<0xXX>` each (byte fallback);
5. the BOS token goes first when the file says `add_bos_token` (EOS last for `add_eos_token`).
Decoding (`piece`) turns '▁' back into spaces, byte tokens into their byte, and shows control
tokens only when asked.
"""

from __future__ import annotations

import heapq

from .vocab import SPECIAL, Pieces, as_list, base_attrs, load_specials, partition, token_texts, type_attrs

PHANTOM = "\u2581"  # '▁'
# token_type values (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


class SentencePiece(Pieces):
    """The vocabulary and llama.cpp's SPM encoder and decoder."""

    eog: frozenset[int]  # llama_vocab_is_eog's ids (from_model_file sets them)

    def __init__(self, tokens: list[str], scores: list[float], types: list[int], bos_id: int,
                 eos_id: int, unk_id: int, add_bos: bool = True, add_eos: bool = False,
                 add_space_prefix: bool = True, attrs: list[int] | None = None) -> None:
        self.tokens, self.scores, self.types = tokens, as_list(scores, float), as_list(types, int)
        self.ids = dict(zip(tokens, range(len(tokens))))  # the last id wins, as llama.cpp's map
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self.add_bos, self.add_eos, self.add_space_prefix = add_bos, add_eos, add_space_prefix
        self.attrs = attrs if attrs is not None else type_attrs(self.types)
        special = [i for i, a in enumerate(self.attrs) if a & SPECIAL]
        self.special = sorted(special, key=lambda i: -len(tokens[i].encode()))  # longest first

    @classmethod
    def from_model_file(cls, f) -> "SentencePiece":
        """From a ModelFile's `tokenizer.ggml.*` keys (a 'llama' SentencePiece vocabulary)."""
        from .common import ModelError

        model = f.key("tokenizer.ggml.model")
        if model != "llama":
            raise ModelError(f"{f.path}: tokenizer '{model}' is not SentencePiece ('llama')")
        tokens = token_texts(f)
        scores = f.key("tokenizer.ggml.scores", [0.0] * len(tokens))
        types = f.key("tokenizer.ggml.token_type", [NORMAL] * len(tokens))
        attrs = base_attrs(f, len(tokens))
        specials = load_specials(f, tokens, attrs, {"bos": 1, "eos": 2, "unk": 0})
        ids = specials.ids
        spm = cls(tokens, scores, types, ids["bos"], ids["eos"], ids["unk"],
                  bool(f.key("tokenizer.ggml.add_bos_token", True)),
                  bool(f.key("tokenizer.ggml.add_eos_token", False)),
                  bool(f.key("tokenizer.ggml.add_space_prefix", True)), attrs)
        spm.special, spm.eog = list(specials.cache), specials.eog
        return spm

    # --- encoding -----------------------------------------------------------------------------

    def encode(self, text: str | bytes, add_special: bool = True,
               parse_special: bool = False) -> list[int]:
        """Token ids of `text` (llama_tokenize(vocab, text, add_special, parse_special))."""
        out: list[int] = [self.bos_id] if add_special and self.add_bos else []
        prev_special = True
        data = text.encode() if isinstance(text, str) else bytes(text)
        for frag in partition(data, self.special, self.tokens, self.attrs, parse_special):
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            piece = (b" " if self.add_space_prefix and prev_special else b"") + frag
            out += self._spm(piece.replace(b" ", PHANTOM.encode()))
            prev_special = False
        if add_special and self.add_eos:
            out.append(self.eos_id)
        return out

    def _spm(self, text: bytes) -> list[int]:
        """llm_tokenizer_spm_session::tokenize on escaped text."""
        # the UTF-8 characters as symbols: [start, length, prev, next]
        starts, i = [], 0
        while i < len(text):
            starts.append(i)
            i += min(_utf8_len(text[i]), len(text) - i)
        n = len(starts)
        if n == 0:
            return []
        start = starts
        length = [(starts[k + 1] if k + 1 < n else len(text)) - starts[k] for k in range(n)]
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n)) + [-1]
        queue: list[tuple[float, int, int, int]] = []  # (-score, left, right, size)
        rev_merge: dict[bytes, tuple[int, int]] = {}

        def try_add(left: int, right: int) -> None:
            if left == -1 or right == -1:
                return
            s = text[start[left]:start[left] + length[left] + length[right]]
            tok = self.ids.get(s.decode("utf-8", "surrogateescape"))
            if tok is None:
                return
            heapq.heappush(queue, (-self.scores[tok], left, right, len(s)))
            rev_merge[s] = (left, right)

        for k in range(1, n):
            try_add(k - 1, k)
        while queue:
            _, left, right, size = heapq.heappop(queue)
            if length[left] == 0 or length[right] == 0 or length[left] + length[right] != size:
                continue  # one of them was merged since
            length[left] += length[right]
            length[right] = 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            try_add(prev[left], left)
            try_add(left, nxt[left])

        out: list[int] = []

        def resegment(k: int) -> None:
            s = text[start[k]:start[k] + length[k]]
            tok = self.ids.get(s.decode("utf-8", "surrogateescape"))
            if tok is not None:
                out.append(tok)
                return
            pair = rev_merge.get(s)
            if pair is None:  # byte fallback
                out.extend(self._byte_token(b) for b in s)
                return
            resegment(pair[0])
            resegment(pair[1])

        k = 0
        while k != -1:
            resegment(k)
            k = nxt[k]
        return out

    def _byte_token(self, b: int) -> int:
        tok = self.ids.get(f"<0x{b:02X}>")
        return tok if tok is not None else self.ids[bytes([b]).decode("latin-1")]

    # --- decoding -----------------------------------------------------------------------------

    def normal_piece(self, text: str) -> bytes:
        return text.replace(PHANTOM, " ").encode("utf-8", "surrogateescape")


def _utf8_len(first: int) -> int:
    """unicode_len_utf8: how many bytes a UTF-8 sequence starting with this byte has."""
    return (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4)[first >> 4]

