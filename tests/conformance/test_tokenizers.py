"""The tokenizers against llama.cpp: its own test vectors, and real llama.cpp on generated texts.

The vectors are llama.cpp's `models/ggml-vocab-*.gguf.inp/.out` (tests/support/vocab.py sets them
up from the llama-cpp-python sdist; missing, these tests fail): each text tokenized with
add_special and parse_special off, as llama.cpp's test-tokenizer-0 does. Then every vocabulary is
held against llama-cpp-python's `llama_tokenize` and `llama_token_to_piece` on texts made from a
seed: Unicode letters and marks, whitespace runs, digits, emoji, CJK, code, special tokens.
"""

from __future__ import annotations

import random
import re

import pytest

from engine.models import unicode as uc
from engine.models.common import ModelMeta
from engine.models.tokenize import tokenize, tokenizer_of
from tests.support.vocab import UNICODE_DATA, read_vectors, vector_files, vocab_files

# every vocabulary of llama.cpp 's tests that comes with vectors (a new one must be added here)
WITH_VECTORS = ("bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gemma-4",
                "gpt-2", "llama-bpe", "llama-spm", "mpt", "phi-3", "qwen2", "qwen35", "refact",
                "starcoder")
NOT_BUILT = ("nomic-bert-moe",)  # 't5' (Unigram)


def _name(path) -> str:
    return path.name.removeprefix("ggml-vocab-").removesuffix(".gguf")


_tokenizers: dict = {}


def _tokenizer(name: str):
    if name not in _tokenizers:
        path = next(p for p in vocab_files() if _name(p) == name)
        _tokenizers[name] = tokenizer_of(ModelMeta(path), required=True)
    return _tokenizers[name]


def test_every_vocabulary_with_vectors_is_tested():
    assert sorted(_name(p) for p, _, _ in vector_files()) == sorted(WITH_VECTORS)


@pytest.mark.parametrize("name", WITH_VECTORS)
def test_llama_cpp_vectors(name):
    path, inp, out = next(t for t in vector_files() if _name(t[0]) == name)
    tok = _tokenizer(name)
    cases = read_vectors(inp, out)
    assert len(cases) >= 40
    wrong = [(text, got, want) for text, want in cases
             if (got := tok.encode(text, add_special=False, parse_special=False)) != want]
    assert not wrong, f"{len(wrong)} of {len(cases)} differ; first: {wrong[0]}"


def test_unicode_flags_are_llama_cpps():
    """Every code point's category and White_Space bit as llama.cpp's unicode-data.cpp has them
    (Unicode 15.1: why engine/models/unicode.py reads unicodedata2, not unicodedata)."""
    source = UNICODE_DATA.read_text()
    table = source[source.index("unicode_ranges_flags"):source.index("unicode_set_whitespace")]
    ranges = [(int(a, 16), int(b, 16)) for a, b in re.findall(r"\{0x([0-9A-F]+), 0x([0-9A-F]+)\}",
                                                               table)]
    spaces = source[source.index("unicode_set_whitespace"):source.index("unicode_map_lowercase")]
    white = {int(x, 16) for x in re.findall(r"0x([0-9A-F]+)", spaces)}
    assert white == set(uc.WHITESPACE_CPTS)
    wrong = []
    for (start, cat), (end, _) in zip(ranges, ranges[1:]):
        for cpt in range(start, end):
            if uc.flags(cpt) & 0xFF != cat:
                wrong.append(cpt)
    assert not wrong, f"{len(wrong)} code points differ, first U+{wrong[0]:04X}"
    uc._flags_cache.clear()


# --- real llama.cpp on generated texts --------------------------------------------------------

PARTS = ["Hello", " world", "  ", "   ", "\t", "\n", "\n\n", " \n ", "\r\n", "3", "42", "1234567",
         " 3.14", "don't", "I'M", "they'll", "Über", "naïve", "café", "Ελληνικά", "русский",
         "עברית", "العربية", "हिन्दी", "ภาษาไทย", "한국어", "日本語", "中文字符", "🦙", "👍🏽",
         "🏳️‍🌈", "e\u0301", "\u00a0", "\u2003", "\u3000", "def f(x):\n    return x**2",
         "if (a && b) { c[i] = d->e; }", "<|endoftext|>", "<s>", "</s>", "[CLS]", "<|im_start|>",
         "<start_of_turn>", "...", "!!!", "?!", "$100", "a+b=c", "   leading", "trailing   ",
         "ǅ", "ﬁ", "Ⅻ", "½", "\x00", "\x7f", "\u200b", "\ufeff"]


def _texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(PARTS) for _ in range(rng.randint(1, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def llama_cpp():
    """Real llama.cpp's tokenizer, run in a child process (tests/support/llamacpp_vocab.py)."""
    from tests.support.llamacpp_vocab import ask

    return ask


@pytest.mark.parametrize("path", [p for p in vocab_files() if _name(p) not in NOT_BUILT],
                         ids=_name)
def test_real_llama_cpp_on_generated_texts(llama_cpp, path):
    tok = _tokenizer(_name(path))
    texts = [(t.encode(), k % 2 == 0, k % 3 == 0) for k, t in enumerate(_texts(1234, 60))]
    ids = sorted({i for t in _texts(99, 20) for i in tok.encode(t.encode(), True, True)})
    ids += list(range(min(300, len(tok.tokens))))
    answer = llama_cpp(path, texts, ids)
    wrong = [(text, add, special, got, want) for (text, add, special), want
             in zip(texts, answer["tokens"])
             if (got := tok.encode(text, add_special=add, parse_special=special)) != want]
    assert not wrong, f"{len(wrong)} of {len(texts)} texts differ; first: {wrong[0]}"
    assert [tok.piece(i, special=True) for i in ids] == answer["pieces"]


def test_tokenize_as_llama_tokenize_prints():
    """llama-tokenize's default: add_special when the vocabulary adds BOS, pieces with
    special tokens shown."""
    tok = _tokenizer("llama-bpe")
    result = tokenize(tok, "Hello world", add_bos=True)
    assert result.ids[0] == tok.bos_id and result.pieces[:3] == [b"<|begin_of_text|>",
                                                                b"Hello", b" world"]
    assert tokenize(tok, "Hello world", add_bos=False).ids == result.ids[1:]
    qwen = _tokenizer("qwen2")
    assert tokenize(qwen, "<|im_start|>", parse_special=True).pieces == [b"<|im_start|>"]
    assert len(tokenize(qwen, "<|im_start|>").ids) > 1


def test_long_hostile_texts_are_fast_and_capped():
    import time

    tok = _tokenizer("llama-bpe")
    words = "The quick brown fox jumps over the lazy dog 1234, naïve café 日本語 🦙".split()
    text = " ".join(words[i % len(words)] for i in range(1000))
    start = time.perf_counter()
    tok.encode(text)
    tok.encode("a" * 20000 + " " * 20000 + "1" * 20000)
    assert time.perf_counter() - start < 5.0
    with pytest.raises(ValueError, match="at most"):
        tok.encode("x" * (1 << 21))


def test_thousands_as_the_regex():
    """SuperBPE's digit split by its fast twin gives the regex's pieces (which llama.cpp runs)."""
    from engine.models.pretokenize import THOUSANDS, _regex_split, compiled_pattern, split_thousands

    rng = random.Random(7)
    rx, _ = compiled_pattern(THOUSANDS)
    for _ in range(300):
        text = "".join(rng.choice("0123456789ab ١") for _ in range(rng.randint(0, 30)))
        cpts = [ord(c) for c in text]
        offsets = [len(cpts)] if cpts else []
        want = [n for n in _regex_split(rx, uc.widen(cpts), offsets) if n]
        assert split_thousands(cpts, offsets) == want, text
