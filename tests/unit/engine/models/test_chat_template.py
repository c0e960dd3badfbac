"""The chat template's and the tokenizer's own bounds (engine/models/chat.py, vocab.py, bpe.py,
tokenize.py): what a template writes is capped, its failures are ModelErrors, a vocabulary's
size is refused from the count its file declares, and a file's tokenizer is built once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.models import bpe, tokenize, vocab
from engine.models.chat import OUTPUT_CHARS, ChatTemplate, ChatTokens
from engine.models.common import ModelError, ModelMeta
from tests.api.routes.test_hostile_templates import LEGIT, chat_file

HI = [{"role": "user", "content": "Hi"}]


def test_a_template_renders_with_the_texts_it_is_given() -> None:
    t = ChatTemplate("f.gguf", LEGIT, None, ChatTokens("<s>", "</s>"))
    assert t.render(HI) == "<s><|user|>Hi</s><|assistant|>"
    assert t.render(HI, add_generation_prompt=False) == "<s><|user|>Hi</s>"


def test_a_missing_bos_or_eos_is_empty_text() -> None:
    tok = SimpleNamespace(tokens=["a", "</s>"], bos_id=None, eos_id=1)
    assert ChatTokens.of(tok) == ChatTokens("", "</s>")


def test_what_a_template_writes_is_capped() -> None:
    exact = "{% for i in range(%d) %}x{% endfor %}"
    assert len(ChatTemplate("f", exact.replace("%d", str(OUTPUT_CHARS)), None,
                            ChatTokens("", "")).render([])) == OUTPUT_CHARS
    over = ChatTemplate("f", exact.replace("%d", str(OUTPUT_CHARS + 1)), None, ChatTokens("", ""))
    with pytest.raises(ModelError, match=f"writes more than {OUTPUT_CHARS:,} characters"):
        over.render([])


@pytest.mark.parametrize("source, why", [
    ("{{ 1 / 0 }}", "failed: ZeroDivisionError: division by zero"),
    ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "failed: .*'__class__' .* is unsafe"),
    ("{{ messages.append(1) }}", "failed: .*unsafe"),
    ("{{ raise_exception('roles must alternate') }}", "failed: roles must alternate"),
    ("{% if %}", "does not parse"),
])
def test_a_templates_failure_is_a_model_error(source: str, why: str) -> None:
    with pytest.raises(ModelError, match=why):
        ChatTemplate("f.gguf", source, None, ChatTokens("", "")).render(HI)


def test_a_vocabulary_is_refused_from_the_count_it_declares(tmp_path: Path, monkeypatch) -> None:
    meta = ModelMeta(chat_file(tmp_path / "v.gguf", LEGIT, n_merges=20))
    monkeypatch.setattr(bpe, "MAX_MERGES", 19)
    with pytest.raises(ModelError, match="tokenizer.ggml.merges holds 20 elements; .* at most 19"):
        bpe.BytePairEncoding.from_model_file(meta)
    monkeypatch.setattr(bpe, "MAX_MERGES", 20)
    monkeypatch.setattr(vocab, "MAX_TOKENS", 257)
    with pytest.raises(ModelError, match="ggml.tokens holds 258 elements; .* at most 257"):
        bpe.BytePairEncoding.from_model_file(meta)


def test_a_files_tokenizer_is_built_once_and_weighed_by_its_entries(tmp_path: Path) -> None:
    path = chat_file(tmp_path / "v.gguf", LEGIT, n_merges=30)
    tokenize._BUILT.clear()
    first = tokenize.tokenizer_of(ModelMeta(path))
    assert tokenize.tokenizer_of(ModelMeta(path)) is first
    assert tokenize._BUILT.currsize == 258 + 1  # its tokens and its one distinct merge
