"""The Chat tab of a model walkthrough whose file stores a chat template: a message (and a system
message) becomes the prompt the model was trained on, rendered by the template as `ggml-lens
chat` renders it (engine/models/chat.py), and the walkthrough runs on it; the tokens appended
after it (the Next token tab) are the model's reply so far. The file may be anyone's upload, so
its template runs in a worker process bounded in time and memory (app/sandbox/template.py), and
only a template of at most TEMPLATE_CHARS characters is shown or run."""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from app.sandbox.template import render_chat
from app.views.debugger.where import Where
from engine.models.chat import TEMPLATE_CHARS
from engine.trace import Trace

MESSAGE_CHARS, SYSTEM_CHARS = 300, 200  # what the form takes (the rendered prompt must fit 400)


@dataclass(frozen=True, slots=True)
class ChatView:
    template: str  # the template's source, to read
    action: str  # the form's target
    reply: str  # the appended tokens' text: the reply so far


def chat_view(trace: Trace, where: Where, path: Path | None) -> ChatView | None:
    """The tab, when the walkthrough reads a prompt from a file that stores a chat template."""
    if where.is_program or path is None or "prompt_tokens" not in trace.outputs:
        return None
    source = template_of(str(path), os.stat(path).st_mtime_ns)
    if source is None:
        return None
    reply = "".join(str(next((text for t, text, _p in trace.outputs.get(f"top10_{k}") or []
                              if int(t) == token), "")) for k, token in enumerate(where.then_ids))
    return ChatView(source, where.base + "/chat", reply)


@lru_cache(maxsize=64)
def template_of(path: str, mtime_ns: int) -> str | None:
    """tokenizer.chat_template of the file (its metadata only), or None (also for a template
    longer than any real one, which the worker would refuse)."""
    from engine.models.common import ModelMeta

    source = ModelMeta(path).reader.get("tokenizer.chat_template")
    return source if isinstance(source, str) and len(source) <= TEMPLATE_CHARS else None


def chat_prompt(path: Path, message: str, system: str = "") -> str:
    """The conversation as the template renders it, in a worker (TemplateRefused: why not;
    TemplatesBusy: no worker free)."""
    messages = ([{"role": "system", "content": system}] if system.strip() else []) + \
        [{"role": "user", "content": message}]
    return render_chat(path, messages)
