"""The inspector's start page: the example files and the upload form (with a refused upload's
reasons)."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import N_, _
from app.store import UploadStore
from app.views.format import human_bytes
from app.views.gguf.state import file_url

FIXTURE_NOTES = {
    "minilm-q8_0.gguf": N_("all-MiniLM-L6-v2, a small BERT sentence encoder: 6 layers, 101 tensors "
                           "(64 F32 + 37 Q8_0) and its WordPiece vocabulary."),
    "ggml-vocab-llama-spm.gguf": N_("A vocabulary-only file: LLaMA's SentencePiece tokenizer "
                                    "(32,000 tokens with scores and types) and no tensors."),
}

@dataclass(frozen=True, slots=True)
class FixtureRow:
    name: str
    size: str
    note: str
    href: str


@dataclass(frozen=True, slots=True)
class UploadError:
    """What to tell the user about a refused upload."""

    title: str  # "This is not a valid GGUF file"
    message: str  # the GGUFError message (field, offset, rule) or the limit broken
    field: str | None = None
    offset: int | None = None
    rule: str | None = None


@dataclass(frozen=True, slots=True)
class HomeView:
    fixtures: list[FixtureRow]
    upload_limit: str
    upload_limit_bytes: int
    error: UploadError | None = None
    models: list[FixtureRow] | None = None  # the models folder's files (None: no folder)
    models_dir: str = ""


def home_view(store: UploadStore, error: UploadError | None = None) -> HomeView:
    rows = [FixtureRow(f.name, human_bytes(f.size), _(FIXTURE_NOTES[f.name]) if f.name in FIXTURE_NOTES else "",
                       file_url(f.digest)) for f in store.fixtures()]
    models = None if store.models_dir is None else [
        FixtureRow(f.name, human_bytes(f.size), "", file_url(f.digest)) for f in store.models()]
    return HomeView(rows, human_bytes(store.upload_limit), store.upload_limit, error, models,
                    str(store.models_dir or ""))
