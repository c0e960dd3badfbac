"""The repack walkthrough through the app: the CPU_REPACK buffer beside the CPU one, the repacked
blocks panel (its layout, and each byte where the engine's own pack puts it, on the trace's real
bytes), the thread panel's gemm/gemv line, and the Values tab reading the plain blocks back.

The byte map itself (app/views/debugger/repacked.py's `byte_map`, found by probing each layout's
pack) is held against pack on random blocks for every layout the build has."""

from __future__ import annotations

import html
import re

import numpy as np
import pytest
from fastapi.testclient import TestClient

from app.main import create_app
from app.settings import Settings
from app.views.debugger.repacked import byte_map
from engine.core.types import TYPE_TRAITS, GGMLType
from engine.quants import dequantize, quantize
from engine.quants.repack import LAYOUTS
from engine.quants.repack_legacy import Q4_0_XOR
from tests.support.recorded import recorded

CELL = re.compile(r'<span class="hb rpb[^"]*" style="background: [^"]+" title="([^"]+)">([0-9a-f]{2})</span>')


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    return TestClient(create_app(Settings(data_dir=tmp_path_factory.mktemp("data"))))


def step_of(call: str) -> int:
    """The step of the walkthrough whose call starts with `call`."""
    return next(s.index for s in recorded("repack").steps if s.call.startswith(call))


def section(text: str, id_: str) -> str:
    start = text.index(f'<section id="{id_}"')
    return text[start:text.index("</section>", start)]


def cells(text: str, label: str) -> list[tuple[str, int]]:
    """(title, byte) of each cell of the panel's table labelled `label`, in order."""
    start = text.index(f'aria-label="{label}"')
    end = text.find('role="table"', start)  # the next table, if any
    return [(html.unescape(t), int(b, 16)) for t, b in CELL.findall(text[start:end if end > 0 else None])]


@pytest.mark.parametrize("type_", sorted(LAYOUTS, key=int), ids=lambda t: t.name)
def test_the_byte_map_is_the_layouts_pack(type_):
    """Where the panel says each byte comes from is where pack puts it, on random blocks."""
    layout = LAYOUTS[type_]
    m = byte_map(layout)
    size = TYPE_TRAITS[type_].type_size
    assert m.exact and m.rows == layout.rows and m.block_size == size
    blocks = np.random.default_rng(int(type_)).integers(0, 256, (6, layout.rows, size), dtype=np.uint8)
    for b in blocks:
        assert np.array_equal(m.apply(b), np.asarray(layout.pack(b), np.uint8).reshape(-1))
    assert m.origins[0][0].row == 0 and m.origins[0][0].byte == 0  # the scales first: row 0's


def test_q4_0s_quants_are_stored_xor_0x88():
    m = byte_map(LAYOUTS[GGMLType.Q4_0])
    scales = 2 * m.rows  # 8 halves
    assert set(m.xor[:scales].tolist()) == {0} and set(m.xor[scales:].tolist()) == {Q4_0_XOR}


def test_the_buffers_tab_shows_cpu_repack_beside_cpu(client):
    k = step_of("ggml_backend_tensor_set(w")
    text = section(client.get(f"/walkthroughs/repack/steps/{k}").text, "buffers")
    names = re.findall(r"buffer \d+: <strong>([A-Z_]+)</strong> \((\w+)", text)
    assert names == [("CPU_REPACK", "weights"), ("CPU", "any")]
    assert "is_host = no" in text and "seg-repacked changed" in text  # w's bytes, written this step


def test_the_panel_draws_the_traces_bytes_where_pack_puts_them(client):
    k = step_of("ggml_backend_tensor_set(w")
    trace = recorded("repack")
    state = trace.state_at(k)
    w = next(t for t in state.tensors() if t.name == "w")
    buffer, off = w.ctx.space.resolve(w.data)
    packed_bytes = buffer.pool[off:off + 16 * int(w.nb[1])]
    for row, block in ((0, 0), (11, 5)):  # group 0 block 0, group 1 block 5
        r = client.get(f"/walkthroughs/repack/steps/{k}?t={w.ctx.id}.{w.offs}&row={row}&block={block}")
        assert r.status_code == 200, r.text[:300]
        text = section(r.text, "repacked")
        assert '<strong class="rplayout">q4_0_8x8</strong>' in text
        plain, packed = cells(text, "plain blocks"), cells(text, "interleaved block")
        assert len(plain) == len(packed) == 8 * 18
        # the interleaved block is the buffer's bytes at this step, where the panel says it lies
        g = row // 8
        start = g * 8 * int(w.nb[1]) + block * 8 * 18
        assert bytes(b for _, b in packed) == bytes(packed_bytes[start:start + 144])
        assert f"offset {start:#x} of buffer" in text
        # each interleaved byte is the plain byte its title names, XOR what it says
        plain_by_title = dict(plain)
        for p, (title, byte) in enumerate(packed):
            src = re.match(r"byte (\d+): from row (\d+)'s (.+?)(?:, stored XOR (0x[0-9a-f]+))?$", title)
            assert src and int(src[1]) == p, title
            assert byte == plain_by_title[f"row {src[2]}: {src[3]}"] ^ (int(src[4], 16) if src[4] else 0), title
        assert packed[0][0] == f"byte 0: from row {8 * g}'s d (byte 0)"  # the first scale byte first
        assert packed[16][0] == f"byte 16: from row {8 * g}'s qs[0], stored XOR {Q4_0_XOR:#04x}"


def test_the_plain_blocks_are_the_programs_rows(client):
    """unpack of the buffer's bytes gives back the rows the program set: its Q4_0 rows, which
    the Values tab explains (their dequantized values, not the interleaved bytes read as plain)."""
    from engine.libm import sinf

    k = step_of("ggml_backend_tensor_set(w")
    state = recorded("repack").state_at(k)
    w = next(t for t in state.tensors() if t.name == "w")
    n = 16 * 256
    values = sinf(np.arange(n, dtype=np.float32) / 7) * (1 + np.arange(n, dtype=np.float32) % 5)
    rows = quantize(GGMLType.Q4_0, values.reshape(16, 256))
    text = client.get(f"/walkthroughs/repack/steps/{k}?t={w.ctx.id}.{w.offs}&row=9&block=3").text
    shown = np.array([b for _, b in cells(section(text, "repacked"), "plain blocks")], np.uint8)
    assert np.array_equal(shown.reshape(8, 18), rows[8:16, 3 * 18:4 * 18])
    values_tab = section(text, "values")
    assert "read back from the CPU_REPACK buffer" in values_tab
    deq = dequantize(GGMLType.Q4_0, rows[9], 256)[3 * 32:4 * 32]  # row 9's block 3, as plain Q4_0
    shown_values = re.findall(r"<span>([^<]+)</span>", values_tab.split('class="deq"')[1])
    assert shown_values == ["%.4g" % v for v in deq]


def test_the_threads_tab_says_which_rows_went_through_gemm_and_gemv(client):
    trace = recorded("repack")
    for name, said in (("y1", ["row 0 of <code>x1</code> went through gemv"]),
                       ("y5", ["rows 0–3 of <code>x5</code> went through gemm",
                               "row 4 of <code>x5</code> went through gemv"])):
        k = next(s.index for s in trace.steps if s.kind == "node" and s.call.endswith(f"'{name}'"))
        text = section(client.get(f"/walkthroughs/repack/steps/{k}").text, "threads")
        assert "q4_0_8x8" in text and "chunks of 8 weight rows" in text
        line = text.split('<p class="gemmrows">')[1].split("</p>")[0]
        for s in said:
            assert s in line, (name, s)
        # (the rows split as ggml's forward_mul_mat splits them: a multiple of 4 to gemm)
        assert ("through gemm" in line) == (name == "y5")


def test_the_bytes_tab_names_interleaved_blocks(client):
    """The Bytes tab's data view of w: 144-byte interleaved blocks, not 18-byte Q4_0 blocks."""
    k = step_of("ggml_backend_tensor_set(w")
    w = next(t for t in recorded("repack").state_at(k).tensors() if t.name == "w")
    text = section(client.get(f"/walkthroughs/repack/steps/{k}?t={w.ctx.id}.{w.offs}&hex=data").text, "hexview")
    assert "144-byte blocks in memory order" in text
    assert 'data-field="interleaved block 0"' in text and 'data-field="interleaved block 3"' in text
