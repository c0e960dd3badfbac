"""The file page's head: facts about the file and its 24-byte header."""

from __future__ import annotations

from dataclasses import dataclass

from app.heads import have
from app.i18n import _
from app.store import UploadStore
from app.views.format import human_bytes, visible_text
from engine.gguf import GGUFReader
from engine.models import ARCHITECTURES
from engine.programs import program_for

from functools import lru_cache


@lru_cache(maxsize=64)
def _walk_plan(path: str, digest: str) -> tuple[int, int] | str:
    """What recording the model walkthrough on the file takes, from its memory plan at the
    walkthrough's context: (bytes of weights mapped from the file, bytes held besides), or why
    the engine cannot build the model. (Cached by the file's digest: the plan reads no weights,
    but builds the reserve graphs.)"""
    from engine.models import ModelError
    from engine.models.params import ContextParams, ParamsError
    from engine.models.plan import MAPPED, plan
    from engine.programs.model import N_CTX

    try:
        p = plan(path, ContextParams(n_ctx=N_CTX))
    except (ModelError, ParamsError, ValueError) as e:
        return str(e)
    mapped = sum(b.size for b in p.model if b.name == MAPPED)
    return mapped, p.total - mapped


@dataclass(frozen=True, slots=True)
class Fact:
    label: str
    value: str
    note: str = ""


@dataclass(frozen=True, slots=True)
class HeaderField:
    name: str
    ctype: str  # its C type in the file
    value: str
    offset: int
    size: int
    meaning: str


@dataclass(frozen=True, slots=True)
class FileView:
    digest: str
    title: str  # general.name, or the fixture's file name
    source: str  # "fixture minilm-q8_0.gguf" or "upload"
    facts: list[Fact]
    header: list[HeaderField]
    n_kv: int
    n_tensors: int
    load_href: str
    run_href: str  # the model walkthrough on this file, when one runs it
    run_note: str  # why it cannot run, or what running it does


def file_view(store: UploadStore, digest: str, r: GGUFReader) -> FileView:
    fixture = store.fixture_name(digest)
    name = r.get("general.name")
    title = name if isinstance(name, str) and name else (fixture or _("GGUF file"))
    arch = r.get("general.architecture")
    facts = [Fact(_("file size"), _("{n} bytes").format(n=f"{r.size:,}"), human_bytes(r.size)),
             Fact(_("GGUF version"), str(r.version), _("{order}-endian").format(order=r.byte_order)),
             Fact(_("architecture"), visible_text(arch, 40) if isinstance(arch, str) else "—"),
             Fact(_("key-value pairs"), f"{r.n_kv:,}"), Fact(_("tensors"), f"{r.n_tensors:,}"),
             Fact(_("alignment"), _("{n} bytes").format(n=r.alignment),
                  "general.alignment" if r.find_key("general.alignment") >= 0 else _("default")),
             Fact(_("data section"), _("at byte {n}").format(n=f"{r.data_offset:,}"),
                  f"{human_bytes(r.data_size)}")]
    header = [
        HeaderField("magic", "char[4]", "'GGUF'", 0, 4, _("identifies the file as GGUF")),
        HeaderField("version", "uint32", str(r.version), 4, 4, _("format version (ggml reads 2, 3)")),
        HeaderField("n_tensors", "int64", f"{r.n_tensors:,}", 8, 8,
                    _("tensor infos after the key-value pairs")),
        HeaderField("n_kv", "int64", f"{r.n_kv:,}", 16, 8, _("key-value pairs after the header")),
    ]
    whole = have(store, digest) is None
    run_href, run_note = run_it(digest, arch, r.path, whole)
    return FileView(digest, visible_text(title, 80), store.origin(digest),
                    facts, header, r.n_kv, r.n_tensors,
                    f"/walkthroughs/gguf-load?file={digest}" if whole else "", run_href, run_note)


def run_it(digest: str, arch, path: str | None, whole: bool) -> tuple[str, str]:
    """"Run it": the walkthrough that runs a model of this architecture on this file and what
    recording it takes (its memory plan), or why there is none."""
    arch = arch if isinstance(arch, str) else None
    prog = program_for(arch) if arch else None
    if prog is None:
        steps = ", ".join(p for p in ARCHITECTURES if program_for(p) is not None)
        built = ", ".join(ARCHITECTURES)
        if arch:
            return "", _("Step-by-step runs take {steps} files; ggml-lens generate and embed also run {built} "
                         "ones (this one is '{arch}').").format(steps=steps, built=built,
                                                                arch=visible_text(arch, 40))
        return "", _("Step-by-step runs take {steps} files; ggml-lens generate and embed also run {built} "
                     "ones.").format(steps=steps, built=built)
    if not whole:
        return "", _("Only the file's first bytes were sent: a run needs its weights.")
    href = f"/walkthroughs/{prog.name}?file={digest}"
    if arch == "bert":  # (an encoder: no memory plan, as llama.cpp's fit pass plans decoders)
        return href, _("Run the '{name}' walkthrough on this file: type a prompt, then step through every "
                       "node it computes.").format(name=prog.name)
    taken = _walk_plan(path, digest) if path is not None else ""
    if isinstance(taken, str):
        return "", _("The engine cannot build this model: {why}").format(why=visible_text(taken, 300))
    mapped, held = taken
    return (href,
            _("Run the '{name}' walkthrough on this file: type a prompt, then step through every node it "
              "computes. Its memory plan: {mapped} of weights read from the file as they are used, "
              "{held} besides (repacked weights, KV cache, compute and output buffers).").format(
                  name=prog.name, mapped=human_bytes(mapped), held=human_bytes(held)))
