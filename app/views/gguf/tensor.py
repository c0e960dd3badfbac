"""The tensor page: its facts, its sampled values and the block explainer."""

from __future__ import annotations

from dataclasses import dataclass

from app.store import UploadStore
from app.views.format import human_bytes, shape_text, visible_text
from app.views.gguf.block import BlockView, block_view
from app.views.gguf.file import Fact
from app.heads import has_bytes, have
from app.views.gguf.sample import SampleView, nrows, read_ranges, sample_view
from app.views.gguf.state import FileState, file_url
from app.views.gguf.tensors_table import fmt_bpw, layer_name
from engine.gguf import GGUFReader, TensorInfo
from engine.types import traits

@dataclass(frozen=True, slots=True)
class TensorView:
    digest: str
    file_title: str
    name: str
    type: str
    facts: list[Fact]
    storage: str  # one sentence about how the type stores values
    sample: SampleView
    block: BlockView
    load_href: str
    file_href: str
    info_seg_href: str
    data_seg_href: str
    needs: list[tuple[int, int]]  # byte ranges the page reads that a header-only file lacks
    needs_bytes: int

def _storage(t: TensorInfo) -> str:
    tr = traits(t.type)
    if not tr.is_quantized:
        return (f"{t.type.name} is not quantized: each element is stored on its own in "
                f"{tr.type_size} byte{'s' if tr.type_size > 1 else ''}.")
    return (f"{t.type.name} is quantized: each row is cut into blocks of {tr.blck_size} elements, "
            f"and each block is stored in {tr.type_size} bytes "
            f"({tr.type_size * 8 / tr.blck_size:g} bits per weight): its scale(s), then the "
            "packed integer quants.")

def tensor_view(store: UploadStore, digest: str, r: GGUFReader, t: TensorInfo, row: int,
                block: int) -> TensorView:
    tr = traits(t.type)
    layer = layer_name(t.name)
    facts = [Fact("type", t.type.name, f"ggml_type {int(t.type)}"),
             Fact("shape (ne)", shape_text(t.shape), f"{t.n_dims} dim{'s' if t.n_dims != 1 else ''}, "
                                                   "ne[0] varies fastest"),
             Fact("elements", f"{t.n_elements:,}"),
             Fact("rows", f"{nrows(t):,}", f"of {t.ne[0]:,} elements, {t.nb[1]:,} bytes each"),
             Fact("strides (nb)", shape_text(t.nb), "bytes to step in each dimension"),
             Fact("size", f"{t.nbytes:,} bytes", human_bytes(t.nbytes)),
             Fact("bits per weight", fmt_bpw(t.nbytes, t.n_elements)),
             Fact("block", f"{tr.blck_size} elements in {tr.type_size} bytes"
                  if tr.is_quantized else f"1 element in {tr.type_size} bytes"),
             Fact("data at byte", f"{t.data_offset:,}",
                  f"offset {t.offset:,} in the data section"),
             Fact("layer", layer or "—")]
    spans = r.byte_map()
    info_seg = next(i for i, s in enumerate(spans) if s.kind == "tensor_info"
                    and s.offset == t.span.offset)
    data_seg = next((i for i, s in enumerate(spans) if s.kind == "tensor_data"
                     and s.label == t.name), info_seg)
    state = FileState()
    needs = [(a, n) for a, n in read_ranges(t, row) if not has_bytes(store, digest, a, a + n)]
    return TensorView(digest, visible_text(str(r.get("general.name") or store.fixture_name(digest)
                                        or "GGUF file"), 80),
                      t.name, t.type.name, facts, _storage(t), sample_view(r, t),
                      block_view(digest, r, t, row, block),
                      "" if have(store, digest) is not None else f"/walkthroughs/gguf-load?file={digest}",
                      file_url(digest),
                      state.url(digest, seg=info_seg) + "#gguf-bytemap",
                      state.url(digest, seg=data_seg) + "#gguf-bytemap",
                      needs, sum(n for _, n in needs))
