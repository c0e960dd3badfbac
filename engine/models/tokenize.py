"""Which tokenizer a GGUF file's vocabulary asks for, and llama-tokenize's view of a text.

`tokenizer.ggml.model` names the kind, as llama.cpp reads it: 'llama' is SentencePiece
(engine/models/spm.py), 'gpt2' and 'gemma4' byte-pair encoding (engine/models/bpe.py), 'bert'
WordPiece (engine/models/tokenizer.py). `tokenize` gives the ids and pieces llama.cpp's
`llama-tokenize` prints.
Leaves out: 't5' (Unigram), 'rwkv', 'plamo2' and the other kinds llama.cpp has.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from threading import Lock
from typing import Any, Callable

from cachetools import LRUCache, cached

from .bpe import BytePairEncoding
from .spm import SentencePiece
from .tokenizer import WordPiece

Tokenizer = SentencePiece | BytePairEncoding | WordPiece

# tokenizer.ggml.model -> the class that reads it
TOKENIZERS: dict[str, type[Tokenizer]] = {"llama": SentencePiece, "gpt2": BytePairEncoding, "gemma4": BytePairEncoding,
              "bert": WordPiece}


def tokenizer_of(f, required: bool = False) -> Tokenizer | None:
    """The tokenizer of a model file's vocabulary (built once per file: file_tokenizer); None for
    a kind not built here (a decoder then takes its prompt as token ids), or an error naming it
    when `required`; None for a file opened for a plan (no_alloc: it tokenizes nothing)."""
    from .common import ModelError

    if getattr(f, "no_alloc", False) and not required:
        return None
    model = f.reader.get("tokenizer.ggml.model")
    cls = TOKENIZERS.get(model)
    if cls is None:
        if required:
            raise ModelError(f"{f.path}: tokenizer '{model or 'none'}' (tokenizer.ggml.model) "
                             "is not built here; ggml-lens builds "
                             + ", ".join(f"'{k}'" for k in TOKENIZERS))
        return None
    return file_tokenizer(f.path, cls.from_model_file, f)


BUILT_ENTRIES = 1 << 21  # tokens and merges the kept tokenizers may hold together (~1 GB)


def _entries(tokenizer) -> int:
    """What a built tokenizer weighs in the cache: its tokens and (BPE's) merges."""
    return len(tokenizer.tokens) + len(getattr(tokenizer, "ranks", ()))


# the tokenizers of the last files read, by builder and file identity (one heavier than all the
# cache holds is built and not kept)
_BUILT: LRUCache = LRUCache(BUILT_ENTRIES, getsizeof=_entries)


def _file_key(path: str | os.PathLike, build: Callable[[Any], Any], meta: Any = None) -> tuple:
    """The file by its identity (device, inode, size, modification time) and the builder."""
    st = os.stat(path)
    return build, os.path.realpath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


@cached(_BUILT, key=_file_key, lock=Lock())
def file_tokenizer(path: str | os.PathLike, build: Callable[[Any], Any], meta: Any = None) -> Any:
    """build(ModelMeta(path)), made once per file: a model's vocabulary (Gemma's 262,144 tokens)
    is slow to read and convert, and a new prompt for a model read before need not read it
    again. The file is known by its identity, so a file replaced at the same path is read anew.
    The tokenizer must not change once built (SentencePiece, BPE and WordPiece do not: BPE's
    remembered words are a memo). What it costs to build is capped by the vocabulary's caps
    (vocab.MAX_TOKENS, bpe.MAX_MERGES); what the kept ones hold together by BUILT_ENTRIES.
    `meta`: the file's ModelMeta (or ModelFile) when the caller has it open already."""
    from .common import ModelMeta

    return build(meta if meta is not None else ModelMeta(path))


@dataclass(frozen=True, slots=True)
class Tokenized:
    """A text as llama-tokenize shows it."""
    ids: list  # token ids
    pieces: list  # each token's bytes (token_to_piece with special tokens shown)


def tokenize(tok, text: str | bytes, add_bos: bool = True,
             parse_special: bool = False) -> Tokenized:
    """llama-tokenize: add_special when the vocabulary adds BOS and `add_bos`, then the pieces."""
    ids = tok.encode(text, add_special=bool(tok.add_bos and add_bos), parse_special=parse_special)
    return Tokenized(ids, [tok.piece(i, special=True) for i in ids])
