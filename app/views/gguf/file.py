"""The file page's head: facts about the file and its 24-byte header."""

from __future__ import annotations

from dataclasses import dataclass

from app.heads import have
from app.store import UploadStore
from app.views.format import human_bytes, visible_text
from engine.gguf import GGUFReader

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


def file_view(store: UploadStore, digest: str, r: GGUFReader) -> FileView:
    fixture = store.fixture_name(digest)
    name = r.get("general.name")
    title = name if isinstance(name, str) and name else (fixture or "GGUF file")
    arch = r.get("general.architecture")
    facts = [Fact("file size", f"{r.size:,} bytes", human_bytes(r.size)),
             Fact("GGUF version", str(r.version), f"{r.byte_order}-endian"),
             Fact("architecture", visible_text(arch, 40) if isinstance(arch, str) else "—"),
             Fact("key-value pairs", f"{r.n_kv:,}"), Fact("tensors", f"{r.n_tensors:,}"),
             Fact("alignment", f"{r.alignment} bytes",
                  "general.alignment" if r.find_key("general.alignment") >= 0 else "default"),
             Fact("data section", f"at byte {r.data_offset:,}", f"{human_bytes(r.data_size)}")]
    header = [
        HeaderField("magic", "char[4]", "'GGUF'", 0, 4, "identifies the file as GGUF"),
        HeaderField("version", "uint32", str(r.version), 4, 4, "format version (ggml reads 2, 3)"),
        HeaderField("n_tensors", "int64", f"{r.n_tensors:,}", 8, 8,
                    "tensor infos after the key-value pairs"),
        HeaderField("n_kv", "int64", f"{r.n_kv:,}", 16, 8, "key-value pairs after the header"),
    ]
    return FileView(digest, visible_text(title, 80), store.origin(digest),
                    facts, header, r.n_kv, r.n_tensors,
                    "" if have(store, digest) is not None else f"/walkthroughs/gguf-load?file={digest}")
