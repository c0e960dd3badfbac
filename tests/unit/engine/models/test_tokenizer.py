"""WordPiece from the MiniLM GGUF's vocabulary: the Hugging Face ids in minilm-reference.json and
the basic tokenizer's rules. (tests/conformance/test_models.py compares many more texts with
llama.cpp's own WordPiece.)"""

from __future__ import annotations

import json

import pytest

from engine.models.common import ModelFile
from engine.models.tokenizer import WordPiece, basic_split
from engine.programs import FIXTURES_DIR

FIXTURES = FIXTURES_DIR
REFERENCE = json.loads((FIXTURES / "minilm-reference.json").read_text())


@pytest.fixture(scope="module")
def wp() -> WordPiece:
    f = ModelFile(FIXTURES / "minilm-q8_0.gguf")
    try:
        return WordPiece.from_model_file(f)
    finally:
        f.close()


@pytest.mark.parametrize("case", REFERENCE["cases"], ids=lambda c: c["text"][:20])
def test_hugging_face_ids(wp, case):
    assert wp.encode(case["text"]) == case["token_ids"]


def test_special_tokens_from_the_file(wp):
    assert (wp.bos_id, wp.eos_id, wp.unk_id) == (101, 102, 100)
    assert wp.decode_pieces([101, 102, 100]) == ["[CLS]", "[SEP]", "[UNK]"]
    assert wp.encode("") == [101, 102]


def test_word_pieces_start_with_the_phantom_space(wp):
    ids = wp.encode("ggml", add_special=False)
    assert wp.decode_pieces(ids) == ["▁g", "gm", "l"]  # 'g', '##gm', '##l' in BERT's vocab.txt


def test_lowercase_and_accents_stripped(wp):
    assert wp.encode("NAÏVE Café") == wp.encode("naive cafe")
    assert wp.lowercase and wp.strip_accents


def test_punctuation_is_split_off(wp):
    assert wp.encode("hello,world!") == wp.encode("hello , world !")
    assert basic_split("a.b-c'd") == ["a", ".", "b", "-", "c", "'", "d"]
    assert basic_split("¿qué?") == ["¿", "que", "?"]  # Unicode punctuation (Po) too


def test_cjk_characters_are_words_of_their_own(wp):
    assert basic_split("東京タワー") == ["東", "京", "タワー"]  # kana are not CJK ideographs
    assert wp.decode_pieces(wp.encode("東京", add_special=False)) == ["▁東", "▁京"]


def test_whitespace_and_control_characters(wp):
    assert basic_split("a\tb\nc\u3000d\u00a0e") == ["a", "b", "c", "d", "e"]
    assert basic_split("a\u200bb\x00c\ufffd") == ["abc"]  # Cf, NUL and U+FFFD are dropped
    assert wp.encode("  spaced   out  ") == wp.encode("spaced out")


def test_unknown_words_become_unk(wp):
    assert wp.encode("🙂", add_special=False) == [wp.unk_id]
    # no length limit: llama.cpp's WPM has none (Hugging Face's is 100 characters)
    assert wp.encode("x" * 101, add_special=False) != [wp.unk_id]
    # a word any part of which cannot be covered is [UNK] as a whole
    assert wp.encode("ab🙂cd", add_special=False) == [wp.unk_id]


def test_greedy_longest_match_first(wp):
    pieces = wp.decode_pieces(wp.encode("unaffable", add_special=False))
    assert "".join(p.lstrip("▁") for p in pieces) == "unaffable"
    first = pieces[0]
    # no longer vocabulary entry starts the word
    assert all("▁" + "unaffable"[:k] not in wp.ids
               for k in range(len(first), len("unaffable") + 1))


def test_phantom_space_vocabulary():
    wp = WordPiece(["[UNK]", "[CLS]", "[SEP]", "▁un", "aff", "able", "▁want", "ed"], 0, 1, 2)
    assert wp.encode("unaffable wanted") == [1, 3, 4, 5, 6, 7, 2]
    assert wp.encode("unwanted") == [1, 0, 2]


def test_a_files_tokenizer_is_read_once_until_the_file_changes(wp, tmp_path):
    """file_tokenizer builds a file's tokenizer once; the same path holding another file (a new
    modification time or size) is read again."""
    import os
    import shutil

    from engine.models import tokenize

    tokenize._BUILT.clear()
    built = []

    def build(meta):
        built.append(meta.path)
        return WordPiece.from_model_file(meta)

    path = tmp_path / "model.gguf"
    shutil.copy(FIXTURES / "minilm-q8_0.gguf", path)
    first = tokenize.file_tokenizer(path, build)
    assert tokenize.file_tokenizer(path, build) is first and len(built) == 1
    assert first.encode("hello world") == wp.encode("hello world")
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # the file replaced
    again = tokenize.file_tokenizer(path, build)
    assert again is not first and len(built) == 2
    assert again.encode("hello world") == first.encode("hello world")
