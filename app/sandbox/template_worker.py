"""`python -I -c BOOT root`: render one file's chat template, in a process of its own.

The server starts this (app/sandbox/template.py) and writes one request on stdin, JSON: the
file's path, the messages, the limits, and the BOS and EOS texts when the server knows them from
an earlier rendering of the same file. Before anything of the file is read the worker limits
itself: address space, CPU seconds (the hard limit is the kernel's SIGKILL), no file written, few
open files, no core file. Then it opens the file (its metadata only), builds its tokenizer when
the BOS and EOS texts are not given, compiles the template (Jinja's constant folding happens
here, within the limits) and renders it (engine/models/chat.py: Jinja's immutable sandbox, the
output capped).

It writes one reply on stdout, JSON and nothing else:
  {"prompt": text, "bos": text, "eos": text}  the rendering, with the texts the server may keep
  {"error": message}                          the engine's message: what the file breaks
  {"limit": "memory"}                         the template or the tokenizer needed more memory
A worker that runs out of CPU time is killed by the kernel, one that runs out of wall-clock time
by the server; the server words those itself.
"""

from __future__ import annotations

import json
import resource
import sys

MESSAGE_KEPT = 2_000  # characters of an error message sent back (a template's message may be long)
SPECIAL_CHARS = 1_024  # the longest BOS or EOS text sent back (a real one: a dozen characters)


def limit_self(memory: int, cpu: int) -> None:
    """The worker's rlimits, set by itself before it reads anything of the file (so no pre-exec
    hook runs in the server's threaded process)."""
    for what, soft, hard in ((resource.RLIMIT_AS, memory, memory),
                             (resource.RLIMIT_CPU, cpu, cpu + 1),  # hard: the kernel's SIGKILL
                             (resource.RLIMIT_FSIZE, 0, 0),
                             (resource.RLIMIT_NOFILE, 64, 64),
                             (resource.RLIMIT_CORE, 0, 0)):
        resource.setrlimit(what, (soft, hard))


def render(request: dict) -> dict:
    """The reply to one request: the rendering, or what the file breaks (ModelError)."""
    from engine.models.chat import ChatTemplate, ChatTokens
    from engine.models.common import ModelError, ModelMeta
    from engine.models.tokenize import tokenizer_of

    path = request["path"]
    try:
        meta = ModelMeta(path)
        known = request.get("specials")
        if known is not None:  # (from an earlier rendering: no tokenizer to build)
            template = ChatTemplate.of_file(meta, None, ChatTokens(known["bos"], known["eos"]))
        else:
            template = ChatTemplate.of_file(meta, tokenizer_of(meta))
        specials = template.specials
        for name, text in (("BOS", specials.bos), ("EOS", specials.eos)):
            if len(text) > SPECIAL_CHARS:
                raise ModelError(f"{path}: the {name} token's text has {len(text):,} characters; "
                                 f"a template reads at most {SPECIAL_CHARS:,}")
        prompt = template.render(request["messages"])
    except ModelError as e:
        return {"error": str(e)}
    except RecursionError:  # (compiling a template nested deeper than Python's stack)
        return {"error": f"{path}: the chat template is nested too deeply to compile"}
    return {"prompt": prompt, "bos": specials.bos, "eos": specials.eos}


def main() -> None:
    request = json.loads(sys.stdin.buffer.read(1 << 20))  # the server's own request: small
    limit_self(request["memory"], request["cpu"])
    try:
        reply = render(request)
    except MemoryError:
        reply = {"limit": "memory"}
    except Exception as e:  # noqa: BLE001 - a builder's failure on a malformed file, said
        reply = {"error": f"{request['path']}: {type(e).__name__}: {e}"}
    if "error" in reply:
        reply["error"] = reply["error"][:MESSAGE_KEPT]
    # (ASCII: a text with lone surrogates, from bytes that were not UTF-8, still goes through)
    sys.stdout.write(json.dumps(reply, ensure_ascii=True))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
