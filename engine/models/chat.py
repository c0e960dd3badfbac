"""A model's chat template: the conversation turned into the prompt the model was trained on.

A GGUF file may store its chat template (`tokenizer.chat_template`, a Jinja template written for
Hugging Face's `apply_chat_template`). It is rendered here as llama.cpp's Jinja path renders it:
`messages` (role and content), `add_generation_prompt`, the BOS and EOS tokens' texts; the result
is tokenized with special tokens parsed (so `<start_of_turn>` is one token), and the BOS token is
added only when the rendered text does not start with it already.
Leaves out: tools, images, a template named by another key.
"""

from __future__ import annotations

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .common import ModelError


class ChatTemplate:
    """A file's chat template with the tokenizer that reads what it renders."""

    def __init__(self, path, source: str, tokenizer) -> None:
        self.path, self.tokenizer = path, tokenizer
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise ModelError(f"{path}: tokenizer.chat_template does not parse: {e}")

    @classmethod
    def of(cls, model) -> ChatTemplate:
        """The template the model's file stores; an error naming the key when there is none."""
        return cls.of_file(model.file, model.tokenizer)

    @classmethod
    def of_file(cls, meta, tokenizer) -> ChatTemplate:
        """The template a file stores (`meta`: its ModelMeta or ModelFile), read by `tokenizer`."""
        source = meta.reader.get("tokenizer.chat_template")
        if not isinstance(source, str):
            raise ModelError(f"{meta.path}: the file stores no chat template (key "
                             "'tokenizer.chat_template'); use `ggml-lens generate` with a prompt")
        if tokenizer is None:
            raise ModelError(f"{meta.path}: its tokenizer is not built here, so its chat "
                             "template cannot be tokenized")
        return cls(meta.path, source, tokenizer)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        tok = self.tokenizer
        try:
            return self.template.render(messages=messages,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=tok.tokens[tok.bos_id],
                                        eos_token=tok.tokens[tok.eos_id])
        except TemplateError as e:
            raise ModelError(f"{self.path}: the chat template failed: {e}") from None

    def tokens(self, messages: list[dict]) -> list[int]:
        """The conversation's token ids, as llama.cpp reads a rendered chat."""
        return self.tokenizer.encode_prompt(self.render(messages))


def _raise(message: str):
    raise TemplateError(message)
