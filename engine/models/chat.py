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
    def __init__(self, model, source: str) -> None:
        self.model = model
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise ModelError(f"{model.file.path}: tokenizer.chat_template does not parse: {e}")

    @classmethod
    def of(cls, model) -> ChatTemplate:
        """The template the model's file stores; an error naming the key when there is none."""
        source = model.file.reader.get("tokenizer.chat_template")
        if not isinstance(source, str):
            raise ModelError(f"{model.file.path}: the file stores no chat template (key "
                             "'tokenizer.chat_template'); use `ggml-lens generate` with a prompt")
        if model.tokenizer is None:
            raise ModelError(f"{model.file.path}: its tokenizer is not built here, so its chat "
                             "template cannot be tokenized")
        return cls(model, source)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        tok = self.model.tokenizer
        try:
            return self.template.render(messages=messages,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=tok.tokens[tok.bos_id],
                                        eos_token=tok.tokens[tok.eos_id])
        except TemplateError as e:
            raise ModelError(f"{self.model.file.path}: the chat template failed: {e}") from None

    def tokens(self, messages: list[dict]) -> list[int]:
        tok = self.model.tokenizer
        text = self.render(messages)
        starts_with_bos = text.startswith(tok.tokens[tok.bos_id])
        return tok.encode(text, add_special=not starts_with_bos, parse_special=True)


def _raise(message: str):
    raise TemplateError(message)
