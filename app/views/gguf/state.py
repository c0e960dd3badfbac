"""The GGUF pages' URLs, and the file page's state: one URL holds every panel's choices."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping
from urllib.parse import quote, urlencode

def file_url(digest: str) -> str:
    return f"/gguf/{digest}"


def tensor_url(digest: str, name: str, **params: Any) -> str:
    url = f"/gguf/{digest}/tensors/{quote(name, safe='')}"
    return url + ("?" + urlencode(params) if params else "")


def kv_url(digest: str, key: str, page: int = 1, q: str = "") -> str:
    url = f"/gguf/{digest}/kv/{quote(key, safe='')}"
    params = {k: v for k, v in (("page", page), ("q", q)) if v not in (1, "")}
    return url + ("?" + urlencode(params) if params else "")

# --- the file page's state: one URL holds every panel's choices ---------------------------------

SORTS = ("index", "name", "type", "shape", "elements", "offset", "size", "bpw")
# which query parameters each swappable panel owns
PANEL_PARAMS = {"gguf-bytemap": ("seg",), "gguf-kv-table": ("q",),
                "gguf-tensors-table": ("filter", "sort", "order", "group")}


@dataclass(frozen=True, slots=True)
class FileState:
    """The file page's query parameters, read leniently (anything odd falls back)."""

    seg: int = 0  # selected byte-map item: an index into reader.byte_map()
    q: str = ""  # metadata search
    filter: str = ""  # tensor filter
    sort: str = "index"
    order: str = "asc"
    group: str = "layer"  # "layer" or "none"

    @classmethod
    def from_params(cls, p: Mapping[str, str]) -> FileState:
        seg = p.get("seg", "0")
        return cls(seg=int(seg) if seg.isdigit() and len(seg) < 10 else 0,
                   q=p.get("q", "")[:200].strip(), filter=p.get("filter", "")[:200].strip(),
                   sort=p.get("sort", "index") if p.get("sort") in SORTS else "index",
                   order="desc" if p.get("order") == "desc" else "asc",
                   group="none" if p.get("group") == "none" else "layer")

    def params(self, **changes: Any) -> dict[str, str]:
        """Non-default parameters, after `changes`."""
        values = {k: getattr(self, k) for k in self.__slots__} | changes
        default = FileState()
        return {k: str(v) for k, v in values.items() if v != getattr(default, k)}

    def url(self, digest: str, **changes: Any) -> str:
        p = self.params(**changes)
        return file_url(digest) + ("?" + urlencode(p) if p else "")

    def hidden(self, *shown: str) -> list[tuple[str, str]]:
        """Every parameter but a form's visible fields, as hidden fields (a plain GET keeps
        the rest of the page as it is)."""
        return [(k, v) for k, v in self.params().items() if k not in shown]


def merge_params(current: Mapping[str, str], request: Mapping[str, str],
                 owned: tuple[str, ...]) -> dict[str, str]:
    """A panel's request changes only the parameters it owns; the rest come from the URL the
    browser shows (htmx's HX-Current-URL), so one panel's swap keeps the others' state."""
    merged = {k: v for k, v in current.items() if k not in owned}
    merged.update({k: v for k, v in request.items() if k in owned})
    return merged
