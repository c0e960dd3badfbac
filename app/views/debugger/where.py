"""Where the learner is: program, step, threads, selected tensor — and the URL that names it."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote

from app.views.debugger.layouts import tensor_offsets
from engine.core.tensor import Tensor
from engine.programs.settings import SETTINGS
from engine.trace import State, Step, StepKind


def ref_key(ctx: int, offs: int) -> str:
    """A tensor's small stable name in URLs: "ctx.offset" of its struct."""
    return f"{ctx}.{offs}"


def tensor_key(t: Tensor) -> str:
    return ref_key(t.ctx.id, t.offs)


def parse_key(key: str | None) -> tuple[int, int] | None:
    if not key:
        return None
    try:
        ctx, offs = key.split(".")
        return int(ctx), int(offs)
    except ValueError:
        return None


@dataclass
class Where:
    """Everything that names a debugger view: program, step, threads, selected tensor."""

    name: str
    step: int
    threads: int | None = None
    tensor: str | None = None  # "ctx.offset" of the selected tensor struct
    row: int = 0  # quantized row and block shown in the block explainer
    block: int = 0
    file: str | None = None  # content hash of an uploaded GGUF, for gguf-load
    hex: str = "struct"  # what the Bytes panel shows: "struct" or "data"
    prompt: str | None = None  # the learner's prompt, for a program that reads one
    then: str | None = None  # token ids appended after the prompt, "506,5279"
    kind: str = "walkthroughs"  # or "programs": a learner's program, `name` its text's hash
    ith: int = 0  # the thread whose share the kernel panel shows
    settings: tuple[tuple[str, str], ...] = ()  # llama.cpp's settings given, (name, value), as
    #                                            engine.programs.settings.read_settings made them

    @property
    def base(self) -> str:
        """The program's own path: /walkthroughs/<name> or /programs/<hash>."""
        return f"/{self.kind}/{self.name}"

    @property
    def is_program(self) -> bool:
        return self.kind == "programs"

    @property
    def then_ids(self) -> tuple[int, ...]:
        return tuple(int(x) for x in self.then.split(",")) if self.then else ()

    def inputs(self) -> list[tuple[str, str | None]]:
        """The query pairs that name the trace (file, prompt, tokens, llama.cpp's settings), for
        every link."""
        return [("file", self.file), ("prompt", self.prompt), ("then", self.then),
                *_setting_pairs(self.settings)]

    def query(self, **change) -> str:
        """A link relative to the current step's path: "?threads=..&t=..". Independent of the
        step, so the graph's SVG can be reused from step to step."""
        v = {**self.__dict__, **change}
        return "?" + _query((("threads", v["threads"]), ("file", v["file"]),
                             ("prompt", v["prompt"]), ("then", v["then"]),
                             *_setting_pairs(v["settings"]), ("t", v["tensor"]),
                             ("expand", change.get("expand"))))

    def url(self, **change) -> str:
        v = {**self.__dict__, **change}
        q = _step_query(v)
        return _step_path(v) + (f"?{q}" if q else "")

    def tensor_url_parts(self, **change) -> tuple[str, str]:
        """url(tensor=key, **change) is prefix + key + suffix: a page linking every tensor of a
        model builds the rest of the URL once."""
        prefix, suffix = self.tensor_link_parts(**change)
        return _step_path({**self.__dict__, **change}) + prefix, suffix

    def tensor_link_parts(self, **change) -> tuple[str, str]:
        """The same link relative to the step's own URL ("?…&t=" + key + suffix): the same at
        every step, so elements made once serve every step of a layout."""
        prefix, _, suffix = ("?" + _step_query({**self.__dict__, "tensor": "\0", **change})).partition("\0")
        return prefix, suffix


def _step_path(v: dict) -> str:
    """A step's path, of a Where's fields `v`."""
    return f"/{v['kind']}/{v['name']}/steps/{v['step']}"


def _step_query(v: dict) -> str:
    """A step's query, of a Where's fields `v` (its selected tensor and panels' choices)."""
    pairs = [("threads", v["threads"]), ("file", v["file"]), ("prompt", v["prompt"]),
             ("then", v["then"]), *_setting_pairs(v["settings"]), ("t", v["tensor"]),
             ("hex", None if v["hex"] == "struct" else v["hex"])]
    if v["row"] or v["block"]:
        pairs += [("row", v["row"]), ("block", v["block"])]
    if v["ith"]:
        pairs.append(("ith", v["ith"]))
    return _query(pairs)


def _setting_pairs(settings: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """llama.cpp's settings as query pairs: each under its flag's name ("fa", "ctk")."""
    return [(SETTINGS[name].key, value) for name, value in settings]


def _query(pairs) -> str:
    """A query string: the prompt (free text) escaped; every other value is a number, a hex
    hash, "ctx.offset", token ids or a setting's value (a word of letters, digits and _), which
    need no escaping."""
    return "&".join(f"{k}={quote(x, safe=',.') if k == 'prompt' else x}" for k, x in pairs
                    if x is not None)


def selected_tensor(state: State, where: Where, step: Step) -> Tensor | None:
    """The tensor the view is about: the one in the URL, else the step's own, else the newest."""
    ref = parse_key(where.tensor) or step.tensor
    if ref is not None and ref[0] in state.contexts:
        if ref[1] in tensor_offsets(state, ref[0]):
            return Tensor(state.contexts[ref[0]], ref[1])
    return state.newest_tensor()


def current_node(state: State, step: Step) -> Tensor | None:
    """The node being visited or computed at this step, if any."""
    if step.kind in (StepKind.NODE, StepKind.VISIT, StepKind.ALLOC, StepKind.COPY) and step.tensor is not None:
        ctx = state.contexts.get(step.tensor[0])
        if ctx is not None:
            return Tensor(ctx, step.tensor[1])
    return None
