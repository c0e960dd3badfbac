"""The GGUF inspector: upload or pick a file, then browse its header, keys, tensors and blocks.

Every view has its own URL and renders in full for a plain request; for an htmx request
(`HX-Request`) the route renders only the partial named by `HX-Target` and tells htmx which URL
to push, so back/forward and sharing work. Uploads stream into the UploadStore.
"""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import parse_qsl, urlsplit

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect

from app.deps import Store
from app.heads import HEAD_MAX, PROBE, SEND_MAX, NeedMore, OverLimit, add_bytes, check_bytes, check_size, missing, \
    store_head
from app.i18n import N_, _
from app.store import PendingUpload, UploadStore, UploadTooLarge
from app.views.format import human_bytes, visible_text
from app.views.gguf.array import array_view
from app.views.gguf.block import block_view
from app.views.gguf.bytemap import byte_map_view
from app.views.gguf.file import file_view
from app.views.gguf.home import UploadError, home_view
from app.views.gguf.kv_table import kv_table_view
from app.views.gguf.sample import read_ranges
from app.views.gguf.state import PANEL_PARAMS, FileState, file_url, kv_url, merge_params, tensor_url
from app.views.gguf.tensor import gguf_tensor_view
from app.views.gguf.tensors_table import tensor_table_view
from app.web import log, templates
from engine.gguf import GGUFError, GGUFReader

router = APIRouter()

# the partial each swappable panel is, by the id of its root (the request's HX-Target)
PARTIALS = {"gguf-bytemap": "partials/gguf/bytemap.html",
            "gguf-kv-table": "partials/gguf/kv_table.html",
            "gguf-tensors-table": "partials/gguf/tensors_table.html",
            "gguf-array": "partials/gguf/array.html",
            "gguf-block": "partials/gguf/block.html"}
NOT_A_FILE = N_("No GGUF file with this hash: it was never uploaded here or was evicted since.")


def _target(request: Request) -> str | None:
    """The partial an htmx request asks for; None for a page (or htmx restoring history)."""
    if request.headers.get("HX-Request") != "true" or \
            request.headers.get("HX-History-Restore-Request") == "true":
        return None
    target = request.headers.get("HX-Target")
    return target if target in PARTIALS else None


def _render(request: Request, page: str, target: str | None, ctx: dict[str, Any],
            push: str | None = None, status: int = 200) -> HTMLResponse:
    name = PARTIALS[target] if target else page
    response = templates.TemplateResponse(request, name, ctx, status_code=status)
    response.headers["Vary"] = "HX-Request, HX-Target"
    if target and push:
        response.headers["HX-Push-Url"] = push
    return response


def _open(store: UploadStore, digest: str) -> GGUFReader:
    try:
        reader = store.open(digest)
    except GGUFError as e:  # a stored file changed under us
        raise HTTPException(422, _("The stored file no longer reads as GGUF: {error}").format(error=e)) from None
    if reader is None:
        raise HTTPException(404, _(NOT_A_FILE))
    return reader


# --- the start page and uploads -----------------------------------------------------------------

@router.get("/gguf", response_class=HTMLResponse)
def gguf_home(request: Request, store: Store) -> HTMLResponse:
    return _render(request, "pages/gguf_home.html", None, {"view": home_view(store)})


def _refuse(request: Request, store: UploadStore, status: int, error: UploadError) -> HTMLResponse:
    return _render(request, "pages/gguf_home.html", None,
                   {"view": home_view(store, error)}, status=status)


@router.post("/gguf", response_class=HTMLResponse)
async def gguf_upload(request: Request, store: Store) -> Response:
    """Stream the body (a multipart form's `file` field, or the raw bytes) into the store."""
    limit = store.upload_limit
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit + 64 * 1024:  # more than the form's overhead
        return _refuse(request, store, 413, _too_large(limit, int(length)))
    pending = store.begin()
    committed = False
    try:
        try:
            chose = await _receive(request, pending)
        except UploadTooLarge:
            return _refuse(request, store, 413, _too_large(limit, None))
        except _BadForm as e:
            return _refuse(request, store, 422, UploadError(
                _("The upload could not be read"), str(e)))
        except ClientDisconnect:
            return Response(status_code=400)
        digest = pending.finish()
        if not chose and pending.size == 0:
            return _refuse(request, store, 422, UploadError(
                _("No file was chosen"), _("Choose a .gguf file, then press Inspect.")))
        if store.path(digest) is not None:  # already here: keep the old copy, refresh its age
            store.touch(digest)
            return RedirectResponse(file_url(digest), status_code=303)
        try:
            await run_in_threadpool(_check, pending.path)
        except GGUFError as e:
            return _refuse(request, store, 422, UploadError(
                _("This is not a valid GGUF file"), str(e), e.field, e.offset, e.rule))
        except Exception as e:  # noqa: BLE001 - the reader should only raise GGUFError; say so plainly
            log.exception("GGUF reader failed on an upload")
            return _refuse(request, store, 422, UploadError(
                _("This file could not be read"), f"{type(e).__name__}: {e}"))
        await run_in_threadpool(pending.commit)
        committed = True
        return RedirectResponse(file_url(digest), status_code=303)
    finally:
        if not committed:
            pending.abort()


@router.post("/gguf/head")
async def gguf_head(request: Request, store: Store,
                    size: Annotated[int, Query(ge=1, le=2**62)]) -> JSONResponse:
    """A file too large to upload, inspected from its first bytes (the raw body) and its size:
    {"url": its page}, {"need": bytes to send from the start}, or {"error": why not}. The size
    is checked before a byte of the body is read."""
    try:
        check_size(size)
        head = await _read_body(request, HEAD_MAX)
        if head is None:
            return JSONResponse({"error": _("send at most {n} bytes").format(n=f"{HEAD_MAX:,}")}, status_code=413)
        digest = await run_in_threadpool(store_head, store, head, size)
    except NeedMore as e:
        return JSONResponse({"need": e.need})
    except GGUFError as e:
        return JSONResponse({"error": str(e), "field": e.field, "offset": e.offset,
                             "rule": e.rule}, status_code=422)
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=422)
    return JSONResponse({"url": file_url(digest)})


@router.post("/gguf/{digest}/bytes")
async def gguf_bytes(request: Request, store: Store, digest: str,
                     ranges: Annotated[str, Query(pattern=r"^\d{1,19}:\d{1,19}(,\d{1,19}:\d{1,19})*$",
                                                  max_length=65536)],
                     probe: Annotated[int, Query(ge=0, le=PROBE)]) -> JSONResponse:
    """Bytes of a header-only file that a page needs: the body is the file's first `probe`
    bytes (to show it is the same file), then the byte ranges `ranges` ("start:length,...")
    one after the other. The ranges are checked against the file's caps (app/heads.py) before
    a byte of the body is read."""
    if store.path(digest) is None:
        return JSONResponse({"error": _(NOT_A_FILE)}, status_code=404)
    spans = [(int(a), int(n)) for a, n in (r.split(":") for r in ranges.split(","))]
    want = probe + sum(n for _start, n in spans)
    try:
        await run_in_threadpool(check_bytes, store, digest, spans)
        body = await _read_body(request, want)
        if body is None or len(body) != want:
            return JSONResponse({"error": _("send the file's first {probe} bytes, then the {n} bytes asked for (at "
                                            "most {most})").format(probe=probe, n=f"{want - probe:,}",
                                                                   most=f"{SEND_MAX:,}")}, status_code=413)
        pieces, pos = [], probe
        for start, n in spans:
            pieces.append((start, body[pos:pos + n]))
            pos += n
        await run_in_threadpool(add_bytes, store, digest, body[:probe], pieces)
    except OverLimit as e:
        return JSONResponse({"error": str(e)}, status_code=413)
    except ValueError as e:
        return JSONResponse({"error": str(e)}, status_code=422)
    return JSONResponse({"ok": True})


async def _read_body(request: Request, limit: int) -> bytes | None:
    """The raw body, or None past `limit` bytes (refused as it arrives)."""
    out = bytearray()
    async for chunk in request.stream():
        out += chunk
        if len(out) > limit:
            return None
    return bytes(out)


def _check(path) -> None:
    """Parse the file as ggml would load it (GGUFError if it breaks a rule), then let it go."""
    GGUFReader(path).close()


def _too_large(limit: int, length: int | None) -> UploadError:
    if length:
        why = _("Uploads are limited to {limit} bytes ({human}) (this request is {n} bytes); it was refused while "
                "arriving and nothing was kept.").format(limit=f"{limit:,}", human=human_bytes(limit), n=f"{length:,}")
    else:
        why = _("Uploads are limited to {limit} bytes ({human}); it was refused while arriving and nothing was "
                "kept.").format(limit=f"{limit:,}", human=human_bytes(limit))
    return UploadError(_("The file is too large"), why)


class _BadForm(Exception):
    pass


async def _receive(request: Request, pending: PendingUpload) -> bool:
    """Write the upload's bytes into `pending` as they arrive; whether a file was named."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data":
        async for chunk in request.stream():
            pending.write(chunk)
        return pending.size > 0
    boundary = params.get(b"boundary")
    if not boundary:
        raise _BadForm(_("The form has no multipart boundary."))
    part: dict[str, Any] = {"headers": {}, "field": b"", "value": b"", "file": False}
    found = {"file": False, "named": False, "done": False}

    def on_part_begin() -> None:
        part.update(headers={}, field=b"", value=b"", file=False)

    def on_header_field(data: bytes, start: int, end: int) -> None:
        part["field"] += data[start:end]

    def on_header_value(data: bytes, start: int, end: int) -> None:
        part["value"] += data[start:end]

    def on_header_end() -> None:
        part["headers"][part["field"].lower()] = part["value"]
        part["field"], part["value"] = b"", b""

    def on_headers_finished() -> None:
        _, disp = parse_options_header(part["headers"].get(b"content-disposition", b""))
        part["file"] = disp.get(b"name") == b"file" and not found["done"]
        if part["file"]:
            found["file"] = True
            found["named"] = bool(disp.get(b"filename"))

    def on_part_data(data: bytes, start: int, end: int) -> None:
        if part["file"]:
            pending.write(data[start:end])

    def on_part_end() -> None:
        if part["file"]:
            found["done"] = True

    parser = MultipartParser(boundary, {
        "on_part_begin": on_part_begin, "on_header_field": on_header_field,
        "on_header_value": on_header_value, "on_header_end": on_header_end,
        "on_headers_finished": on_headers_finished, "on_part_data": on_part_data,
        "on_part_end": on_part_end})
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except (UploadTooLarge, ClientDisconnect):
        raise
    except Exception as e:  # noqa: BLE001 - python-multipart's parse errors have no common class
        raise _BadForm(_("The form data is malformed: {error}").format(error=e)) from None
    if not found["file"]:
        raise _BadForm(_("The form has no field named 'file'."))
    return found["named"]


# --- one file -----------------------------------------------------------------------------------

def _current_params(request: Request) -> dict[str, str]:
    """The query of the page the browser shows (htmx's HX-Current-URL), if it is this page."""
    current = urlsplit(request.headers.get("HX-Current-URL", ""))
    if current.path != request.url.path:
        return {}
    return dict(parse_qsl(current.query))


@router.get("/gguf/{digest}", response_class=HTMLResponse)
def gguf_file(request: Request, digest: str, store: Store) -> HTMLResponse:
    reader = _open(store, digest)
    target = _target(request)
    params = dict(request.query_params)
    if target in PANEL_PARAMS:
        params = merge_params(_current_params(request), params, PANEL_PARAMS[target])
    elif target is not None:
        target = None  # not a panel of this page: send the page
    state = FileState.from_params(params)
    ctx: dict[str, Any] = {"state": state}
    if target in (None, "gguf-bytemap"):
        ctx["bytemap"] = byte_map_view(digest, reader, state, None if store.whole(digest) else
                                       lambda start, n: not missing(store, digest, [(start, n)]))
    if target in (None, "gguf-kv-table"):
        ctx["kv"] = kv_table_view(digest, reader, state)
    if target in (None, "gguf-tensors-table"):
        ctx["tensors"] = tensor_table_view(digest, reader, state)
    if target is None:
        ctx["file"] = file_view(store, digest, reader)
    return _render(request, "pages/gguf_file.html", target, ctx, state.url(digest))


@router.get("/gguf/{digest}/kv/{key:path}", response_class=HTMLResponse)
def gguf_kv(request: Request, digest: str, key: str, store: Store,
            page: Annotated[int, Query(ge=1, le=10**9)] = 1,
            q: Annotated[str, Query(max_length=200)] = "") -> HTMLResponse:
    reader = _open(store, digest)
    i = reader.find_key(key)
    if i < 0:
        raise HTTPException(404, _("This file has no key named '{key}'.").format(key=visible_text(key, 80)))
    view = array_view(digest, reader, reader.kvs[i], page, q)
    target = _target(request)
    target = target if target == "gguf-array" else None
    return _render(request, "pages/gguf_kv.html", target, {"view": view},
                   kv_url(digest, key, view.page, view.q))


@router.get("/gguf/{digest}/tensors/{name:path}", response_class=HTMLResponse)
def gguf_tensor(request: Request, digest: str, name: str, store: Store,
                row: Annotated[int, Query(ge=0, le=2**62)] = 0,
                block: Annotated[int, Query(ge=0, le=2**62)] = 0) -> Response:
    reader = _open(store, digest)
    i = reader.find_tensor(name)
    if i < 0:
        raise HTTPException(404, _("This file has no tensor named '{name}'.").format(name=visible_text(name, 80)))
    t = reader.tensors[i]
    target = _target(request)
    push = tensor_url(digest, t.name, row=row, block=block)
    if target == "gguf-block":
        if missing(store, digest, read_ranges(t, row)):  # a header-only file: its page asks for them
            return Response(headers={"HX-Redirect": push})
        view = block_view(digest, reader, t, row, block)
        push = tensor_url(digest, t.name, row=view.row, block=view.block)
        return _render(request, "", target, {"block": view}, push)
    page = gguf_tensor_view(store, digest, reader, t, row, block)
    return _render(request, "pages/gguf_tensor.html", None,
                   {"view": page, "block": page.block})
