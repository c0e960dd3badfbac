"""The tensor page: its facts, its sampled values and the block explainer."""

from __future__ import annotations

from dataclasses import dataclass

from app.i18n import _, ngettext
from app.store import UploadStore
from app.views.format import human_bytes, shape_text, visible_text
from app.views.gguf.block import BlockView, block_view
from app.views.gguf.file import Fact
from app.heads import have, missing
from app.views.gguf.sample import SampleView, nrows, read_ranges, sample_view
from app.views.gguf.state import FileState, file_url
from app.views.gguf.tensors_table import fmt_bpw, layer_name
from engine.gguf import GGUFReader, TensorInfo
from engine.core.types import traits

@dataclass(frozen=True, slots=True)
class TensorView:
    digest: str
    file_title: str
    name: str
    type: str
    facts: list[Fact]
    storage: str  # one sentence about how the type stores values
    sample: SampleView
    block: BlockView | None  # None while its bytes were not sent
    load_href: str
    file_href: str
    info_seg_href: str
    data_seg_href: str
    needs: list[tuple[int, int]]  # byte ranges the page reads that a header-only file lacks
    needs_bytes: int

def _storage(t: TensorInfo) -> str:
    tr = traits(t.type)
    if not tr.is_quantized:
        return ngettext("{type} is not quantized: each element is stored on its own in {n} byte.",
                        "{type} is not quantized: each element is stored on its own in {n} bytes.",
                        tr.type_size).format(type=t.type.name, n=tr.type_size)
    return _("{type} is quantized: each row is cut into blocks of {size} elements, and each block is stored in "
             "{bytes} bytes ({bpw} bits per weight): its scale(s), then the packed integer quants.").format(
                 type=t.type.name, size=tr.blck_size, bytes=tr.type_size, bpw=f"{tr.type_size * 8 / tr.blck_size:g}")

def gguf_tensor_view(store: UploadStore, digest: str, r: GGUFReader, t: TensorInfo, row: int,
                     block: int) -> TensorView:
    tr = traits(t.type)
    layer = layer_name(t.name)
    facts = [Fact(_("type"), t.type.name, f"ggml_type {int(t.type)}"),
             Fact(_("shape (ne)"), shape_text(t.shape),
                  ngettext("{n} dim, ne[0] varies fastest", "{n} dims, ne[0] varies fastest",
                           t.n_dims).format(n=t.n_dims)),
             Fact(_("elements"), f"{t.n_elements:,}"),
             Fact(_("rows"), f"{nrows(t):,}", _("each of {n} elements, {bytes} bytes").format(
                 n=f"{t.ne[0]:,}", bytes=f"{t.nb[1]:,}")),
             Fact(_("strides (nb)"), shape_text(t.nb), _("bytes to step in each dimension")),
             Fact(_("size"), _("{n} bytes").format(n=f"{t.nbytes:,}"), human_bytes(t.nbytes)),
             Fact(_("bits per weight"), fmt_bpw(t.nbytes, t.n_elements)),
             Fact(_("block"), _("{n} elements in {bytes} bytes").format(n=tr.blck_size, bytes=tr.type_size)
                  if tr.is_quantized else _("1 element in {bytes} bytes").format(bytes=tr.type_size)),
             Fact(_("data at byte"), f"{t.data_offset:,}",
                  _("offset {n} in the data section").format(n=f"{t.offset:,}")),
             Fact(_("layer"), layer or "—")]
    spans = r.byte_map()
    info_seg = next(i for i, s in enumerate(spans) if s.kind == "tensor_info"
                    and s.offset == t.span.offset)
    data_seg = next((i for i, s in enumerate(spans) if s.kind == "tensor_data"
                     and s.label == t.name), info_seg)
    state = FileState()
    needs = missing(store, digest, read_ranges(t, row))  # (holes would read as zeros: decode none)
    return TensorView(digest, visible_text(str(r.get("general.name") or store.fixture_name(digest)
                                        or _("GGUF file")), 80),
                      t.name, t.type.name, facts, _storage(t),
                      SampleView(False, _("This tensor's bytes were not sent.")) if needs else sample_view(r, t),
                      None if needs else block_view(digest, r, t, row, block),
                      "" if have(store, digest) is not None else f"/walkthroughs/gguf-load?file={digest}",
                      file_url(digest),
                      state.url(digest, seg=info_seg) + "#gguf-bytemap",
                      state.url(digest, seg=data_seg) + "#gguf-bytemap",
                      needs, sum(n for _, n in needs))
