"""A model's chat template: the conversation turned into the prompt the model was trained on.

A GGUF file may store its chat template (`tokenizer.chat_template`, a Jinja template written for
Hugging Face's `apply_chat_template`). It is rendered here as llama.cpp's Jinja path renders it:
`messages` (role and content), `add_generation_prompt`, the BOS and EOS tokens' texts (empty for
a vocabulary without one); the result is tokenized with special tokens parsed (so
`<start_of_turn>` is one token), and the BOS token is added only when the rendered text does not
start with it already.
A template is a program its file's author wrote, so it runs in Jinja's immutable sandbox (no
attribute outside the safe ones, no changes to its arguments), its source and what it writes are
capped (caps, not llama.cpp's), and the server runs it in a child process bounded in time and
memory (app/sandbox/template.py): a loop or a constant too large for it to finish is the child's
to die of.
Leaves out: tools, images, a template named by another key.
"""

from __future__ import annotations

from dataclasses import dataclass

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .common import ModelError

TEMPLATE_CHARS = 1 << 17  # the longest template read (real ones: a few thousand characters)
OUTPUT_CHARS = 1 << 16  # the most a rendering may write: a conversation's prompt, not a book
# what a template's expressions may raise besides Jinja's own errors ({{ 1 / 0 }}, {{ x[9] }}...)
TEMPLATE_FAILURES = (TemplateError, ArithmeticError, LookupError, TypeError, ValueError,
                     RecursionError)


@dataclass(frozen=True, slots=True)
class ChatTokens:
    """The special tokens' texts a template reads besides the messages ('' for one the
    vocabulary lacks, as llama.cpp passes a missing token)."""

    bos: str  # bos_token
    eos: str  # eos_token

    @classmethod
    def of(cls, tokenizer) -> ChatTokens:
        def text(i: int | None) -> str:
            return tokenizer.tokens[i] if i is not None else ""

        return cls(text(tokenizer.bos_id), text(tokenizer.eos_id))


class ChatTemplate:
    """A file's chat template with the tokenizer that reads what it renders (`specials`: the
    BOS and EOS texts when they are known without the tokenizer, which may then be None)."""

    def __init__(self, path, source: str, tokenizer, specials: ChatTokens | None = None) -> None:
        self.path, self.tokenizer = path, tokenizer
        self.specials = specials if specials is not None else ChatTokens.of(tokenizer)
        if len(source) > TEMPLATE_CHARS:
            raise ModelError(f"{path}: tokenizer.chat_template has {len(source):,} characters; "
                             f"the longest read here has {TEMPLATE_CHARS:,}")
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
    def of_file(cls, meta, tokenizer, specials: ChatTokens | None = None) -> ChatTemplate:
        """The template a file stores (`meta`: its ModelMeta or ModelFile), read by `tokenizer`."""
        source = meta.reader.get("tokenizer.chat_template")
        if not isinstance(source, str):
            raise ModelError(f"{meta.path}: the file stores no chat template (key "
                             "'tokenizer.chat_template'); use `ggml-lens generate` with a prompt")
        if tokenizer is None and specials is None:
            raise ModelError(f"{meta.path}: its tokenizer is not built here, so its chat "
                             "template cannot be tokenized")
        return cls(meta.path, source, tokenizer, specials)

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The conversation as the template writes it, up to OUTPUT_CHARS characters."""
        pieces = self.template.generate(messages=messages,
                                        add_generation_prompt=add_generation_prompt,
                                        bos_token=self.specials.bos, eos_token=self.specials.eos)
        out: list[str] = []
        n = 0
        while True:
            try:
                piece = next(pieces, None)
            except TEMPLATE_FAILURES as e:  # the template's own error, or one of its operations'
                why = str(e) if isinstance(e, TemplateError) else f"{type(e).__name__}: {e}"
                raise ModelError(f"{self.path}: the chat template failed: {why}") from None
            if piece is None:
                return "".join(out)
            n += len(piece)
            if n > OUTPUT_CHARS:
                raise ModelError(f"{self.path}: the chat template writes more than "
                                 f"{OUTPUT_CHARS:,} characters")
            out.append(piece)

    def tokens(self, messages: list[dict]) -> list[int]:
        """The conversation's token ids, as llama.cpp reads a rendered chat."""
        return self.tokenizer.encode_prompt(self.render(messages))


def _raise(message: str):
    raise TemplateError(message)
