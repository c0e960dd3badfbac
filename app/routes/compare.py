"""Compare: two model files run over one prompt and stepped in lockstep, node by node.

/compare shows the form (a model of the models folder, a second file: another one, an upload or
a quantization of the first made here, and a prompt); with a pair chosen it shows node `n` of both
runs, their difference, the error through the layers, the next-token distributions and the
weights' own error. The runs are a job of this area's own queue (a few seconds: two models and
perhaps a quantization); a request waits a moment for it, else the page shows its progress and
polls. The work is the engine's (engine/models/compare.py); a made quantization is kept in the
data directory under a hash of its source's digest and type, so it is made once.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Callable

from cachetools import LRUCache
from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.requests import ClientDisconnect

from app.deps import Store
from app.i18n import _
from app.jobs import Job, JobQueue, QueueFull, busy
from app.store import Fixture, UploadStore, UploadTooLarge, evict_oldest
from app.views import compare as V
from app.web import client_of, go_to, templates
from engine.gguf import GGUFError, GGUFReader
from engine.models.bundled import FILE_NAME, model_path

router = APIRouter()

QUICK = 5.0  # seconds a request waits for its comparison before showing the progress instead
KEPT = 2  # comparisons kept per process (each a few tens of MB: both runs' node values)
PROMPT_CHARS = 200  # the prompt's length in characters (the engine caps its tokens too)
Prompt = Annotated[str, Query(max_length=PROMPT_CHARS)]
Digest = Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$")]
DIGEST = re.compile(r"[0-9a-f]{64}")
# the second file: a stored file's hash, or a file type to quantize the first to
Second = Annotated[str | None, Query(pattern=r"^([0-9a-f]{64}|[A-Za-z0-9_]{1,16})$")]


@dataclass(frozen=True, slots=True)
class Key:
    """One comparison: file A, and B as a stored file or a quantization of A (`quant`)."""

    a: str
    b: str | None
    quant: str | None
    prompt: str


class Compare:
    """This area's shared objects: the job queue and the comparisons kept."""

    def __init__(self, store: UploadStore, data_dir: Path) -> None:
        self.store = store
        self.bundled = model_path(data_dir)
        self.quantized = data_dir / "quantized"
        self.kept: LRUCache = LRUCache(KEPT)
        self.stages: dict[Key, tuple[str, int, int]] = {}  # the running jobs': (stage, done, total)
        self.lock = threading.Lock()
        self.jobs = JobQueue(self.work, workers=1, capacity=4, per_client=2)

    def models(self) -> list[Fixture]:
        """The models folder's files, and the bundled Gemma where it is installed outside it
        (named like them: by its resolved path, size and modification time)."""
        models = self.store.models()
        if self.bundled.is_file():
            real = self.bundled.resolve()
            st = real.stat()
            digest = hashlib.sha256(f"{real}\0{st.st_size}\0{st.st_mtime_ns}".encode()).hexdigest()
            if all(m.digest != digest for m in models):
                models.insert(0, Fixture(FILE_NAME, real, st.st_size, digest))
        return models

    def path(self, digest: str) -> Path:
        found = next((m.path for m in self.models() if m.digest == digest), None)
        if found is not None:
            return found
        p = self.store.path(digest)
        if p is None or not self.store.whole(digest):
            raise V.Refused(V.NO_FILE)
        return p

    def quantize(self, a: str, quant: str, say: Callable[[str, int, int], None] | None = None) -> Path:
        """The quantization of file `a` to `quant` (llama-quantize's file type), made once."""
        from engine.gguf.quantize import QuantizeError, QuantizeParams, llama_model_quantize

        opt = V.quant_option(quant)
        if opt is None:
            raise V.Refused(V.BAD_QUANT, quant=quant)
        name = hashlib.sha256(f"{a}\0{opt.name}".encode()).hexdigest()
        out = self.quantized / f"{name}.gguf"
        if out.is_file():
            os.utime(out)
            return out
        self.quantized.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.quantized, suffix=".part")
        os.close(fd)
        try:
            llama_model_quantize(self.path(a), tmp, QuantizeParams(opt.ftype, allow_requantize=True),
                                 None if say is None else lambda p: say(V.QUANTIZING, p.index, p.count))
            os.replace(tmp, out)
        except QuantizeError as e:
            raise V.Refused(V.QUANTIZE_FAILED, error=str(e)) from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        evict_oldest(self.quantized, ".gguf", self.store.store_limit, keep=out)
        return out

    def work(self, key: Key, job: Job):
        """A job: the pair's files (B quantized first if asked), then the engine's comparison.
        What it makes is kept, and so is what it raises: asked again (a poll), it is not run
        again. Where it is, for its page: `stages[key]`."""
        from engine.models.compare import compare_files

        def say(stage: str, done: int, total: int) -> None:
            self.stages[key] = (stage, done, total)
            job.steps = done

        try:
            a = self.path(key.a)
            b = self.quantize(key.a, key.quant, say) if key.quant else self.path(key.b or "")
            made = compare_files(a, b, key.prompt, lambda stage, done, total: say(stage.value, done, total))
        except Exception as e:
            with self.lock:
                self.kept[key] = e
            raise
        finally:
            self.stages.pop(key, None)
        with self.lock:
            self.kept[key] = made
        return made

    def get(self, key: Key, client: str, wait: float):
        """The comparison when kept or made within `wait` seconds, else its job (QueueFull: no
        room). What the job raised (a refusal: Refused, CompareError, ModelError) is raised here."""
        made = self._kept(key)
        if made is not None:
            return made
        job = self.jobs.find(key)
        if job is None:
            made = self._kept(key)  # (its job may have ended meanwhile)
            if made is not None:
                return made
            job = self.jobs.submit(key, client)
        return self.jobs.wait(job, wait) or job

    def _kept(self, key: Key):
        """The comparison kept for key (what its job raised is raised), or None."""
        with self.lock:
            made = self.kept.get(key)
        if isinstance(made, BaseException):
            raise made
        return made


_LOCK = threading.Lock()


def _area(request: Request, store: UploadStore) -> Compare:
    """The app's Compare (made on first use)."""
    with _LOCK:
        area = getattr(request.app.state, "compare", None)
        if area is None:
            area = request.app.state.compare = Compare(store, request.app.state.settings.data_dir)
        return area


def _default_a(models: list[Fixture]) -> str | None:
    """The bundled Gemma, else the models folder's first file."""
    found = next((m for m in models if m.path.name == FILE_NAME), models[0] if models else None)
    return found.digest if found is not None else None


@router.get("/compare", response_class=HTMLResponse)
def compare(request: Request, store: Store, a: Digest = None, b: Second = None,
            prompt: Prompt = V.PROMPT, n: Annotated[int | None, Query(ge=0, le=1_000_000)] = None) -> Response:
    """The form; with a pair chosen (`b`: a stored file's hash, or a file type such as Q4_0 to
    quantize A to), node `n` of the comparison (the node's fragment alone for an htmx swap of
    #cmp-node), or the job's progress."""
    area = _area(request, store)
    models = area.models()
    a = a or _default_a(models)
    form = V.compare_form(models, a, b, prompt)
    context: dict = {"form": form}
    poll = request.headers.get("HX-Request") == "true" and request.headers.get("HX-Target") == "cmp-progress"
    if not b or a is None:
        return templates.TemplateResponse(request, "pages/compare.html", context)
    try:
        quant = None if DIGEST.fullmatch(b) else b.upper()
        if quant is not None and V.quant_option(quant) is None:
            raise V.Refused(V.BAD_QUANT, quant=b)
        if not prompt.strip():
            raise V.Refused(V.NO_PROMPT)
        key = Key(a, None if quant else b, quant, prompt)
        try:
            found = area.get(key, client_of(request), 0 if poll else QUICK)
        except QueueFull as e:
            raise busy(e) from None
    except Exception as e:  # noqa: BLE001 - a refusal in words (V.compare_refusal says which are expected)
        if poll:  # (htmx swaps no error: the page itself says it)
            return go_to(request, f"{request.url.path}?{request.url.query}")
        message = V.compare_refusal(e)
        if message is None:
            raise
        context["error"] = message
        return templates.TemplateResponse(request, "pages/compare.html", context, status_code=422)
    if isinstance(found, Job):
        context["progress"] = V.compare_progress(area.jobs.progress(found), area.stages.get(key), key.quant)
        context["poll_url"] = f"{request.url.path}?{request.url.query}"
        return templates.TemplateResponse(request, "pages/compare.html", context, status_code=202)
    if poll:  # made: the page itself
        return go_to(request, f"{request.url.path}?{request.url.query}")
    page = V.page_view(found, form, n)
    context["page"] = page
    if request.headers.get("HX-Request") == "true" and request.headers.get("HX-Target") == "cmp-node":
        return templates.TemplateResponse(request, "partials/compare/node.html", context)
    return templates.TemplateResponse(request, "pages/compare.html", context)


@router.post("/compare/upload")
async def upload(request: Request, store: Store) -> JSONResponse:
    """A second file sent as the raw body (static/compare.js): streamed into the upload store
    (capped at its limit), kept under its hash if the GGUF reader accepts it: {"digest": …}, or
    {"error": why not}."""
    pending = store.begin()
    committed = False
    try:
        try:
            async for chunk in request.stream():
                pending.write(chunk)
        except UploadTooLarge as e:
            return JSONResponse({"error": str(e)}, status_code=413)
        except ClientDisconnect:
            return JSONResponse({"error": _("the upload was cut off")}, status_code=400)
        digest = pending.finish()
        if pending.size == 0:
            return JSONResponse({"error": _("No file was chosen")}, status_code=422)
        if store.path(digest) is not None:
            store.touch(digest)
            return JSONResponse({"digest": digest})
        try:
            await run_in_threadpool(_check, pending.path)
        except GGUFError as e:
            return JSONResponse({"error": _("This is not a valid GGUF file") + f": {e}"}, status_code=422)
        await run_in_threadpool(pending.commit)
        committed = True
        return JSONResponse({"digest": digest})
    finally:
        if not committed:
            pending.abort()


def _check(path: Path) -> None:
    with GGUFReader(path):
        pass

