"""The app's shared objects, made once per app by `install(app, settings)` and handed to routes
as named `Annotated` dependencies: the upload store, the trace cache, the rendered-graph cache,
and the query parameters several routes take (thread count, an uploaded file's hash).
"""

from __future__ import annotations

import threading
from typing import Annotated

from fastapi import Depends, FastAPI, Query, Request

from app.i18n import N_
from app.jobs import JobQueue, Queue
from app.objects import SharedStore
from app.playground import ProgramStore
from app.settings import MAX_THREADS, Settings
from app.store import UploadStore
from app.tracefiles import TraceFiles, TrustedFiles
from app.workers import RedisJobs
from app.traces import TraceCache
from app.views.debugger.graph import SvgCache, svg_cache
from engine.models.bundled import model_path


def traces(settings: Settings, programs: bool) -> TraceCache:
    """The trace cache and the stores it records from (uploads, learners' programs if
    `programs`, the shared trace files and object store as the settings ask): a web process's
    and a worker's."""
    shared = SharedStore(settings.store) if settings.store else None
    model = model_path(settings.data_dir)
    uploads = UploadStore.from_settings(settings, shared)
    return TraceCache(
        settings.trace_cache, settings.fixtures_dir, model, uploads=uploads,
        programs=ProgramStore(settings.data_dir / "programs", unconfined=settings.unconfined_programs,
                              model=model, shared=shared) if programs else None,
        files=TraceFiles(settings.data_dir / "traces", settings.traces_limit, shared, TrustedFiles(uploads, model))
        if settings.shares_traces else None, memory=settings.memory_limit)


def install(app: FastAPI, settings: Settings) -> None:
    """Make the app's shared objects from its settings."""
    app.state.settings = settings
    app.state.traces = cache = traces(settings, settings.programs)
    app.state.store, app.state.programs = cache.uploads, cache.programs
    app.state.svgs = svg_cache(settings.svg_cache)
    if cache.programs is not None:  # the boundary's probe now, not in a learner's request
        threading.Thread(target=cache.programs.boundary_missing, daemon=True).start()
    if settings.queue:
        cache.jobs = RedisJobs(settings.queue, settings.run_queue, settings.runs_per_client)
    else:
        cache.jobs = JobQueue(cache.work, settings.runs_at_once, settings.run_queue, settings.runs_per_client)
    app.state.jobs = cache.jobs


def get_store(request: Request) -> UploadStore:
    return request.app.state.store


def get_traces(request: Request) -> TraceCache:
    return request.app.state.traces


def get_svgs(request: Request) -> SvgCache:
    return request.app.state.svgs


def get_jobs(request: Request) -> Queue:
    return request.app.state.jobs


def get_programs(request: Request) -> ProgramStore | None:
    """The learners' programs, or None where the playground is off."""
    return request.app.state.programs


PLAYGROUND_OFF = N_("The playground is off on this server: it runs learners' programs, so it is on only when "
                    "`ggml-lens serve` listens on localhost, or was started with --allow-programs.")

Store = Annotated[UploadStore, Depends(get_store)]
Programs = Annotated[ProgramStore | None, Depends(get_programs)]
Traces = Annotated[TraceCache, Depends(get_traces)]
Jobs = Annotated[Queue, Depends(get_jobs)]
Svgs = Annotated[SvgCache, Depends(get_svgs)]
Threads = Annotated[int | None, Query(ge=1, le=MAX_THREADS, description="threads for compute")]
FileHash = Annotated[str | None, Query(pattern=r"^[0-9a-f]{64}$",
                                       description="an uploaded GGUF's content hash (gguf-load)")]
