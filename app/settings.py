"""Settings in one place: read once from the environment (GGML_LENS_*), with safe defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path = field(default_factory=lambda: Path(os.environ.get("GGML_LENS_DATA", ROOT / "var")))
    upload_limit: int = int(os.environ.get("GGML_LENS_UPLOAD_LIMIT", 512 * 1024 * 1024))  # bytes
    store_limit: int = int(os.environ.get("GGML_LENS_STORE_LIMIT", 4 * 1024 * 1024 * 1024))
    trace_cache: int = int(os.environ.get("GGML_LENS_TRACE_CACHE", 32))  # traces kept in memory

    @property
    def uploads(self) -> Path:
        return self.data_dir / "uploads"
