"""Settings in one place: defaults here, read from the environment (GGML_LENS_*) once, by
`Settings.from_env()` when the app or the command line starts.

The app's own limits that are not per-deployment (the thread range a walkthrough may be
recorded with) are constants here too, so a route, a cache and a template share one number.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from engine.models.bundled import DATA_DIR
from engine.programs import FIXTURES_DIR

MAX_THREADS = 8  # a walkthrough is recorded with 1..MAX_THREADS compute threads
MEMORY_LIMIT = 4 << 30  # bytes of traces, dumps and states a process keeps (a model's trace holds ~1 GB)
PACKAGE = Path(__file__).resolve().parent  # templates/ and static/ ship inside the package


@dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path = Path(DATA_DIR)  # uploads under data_dir/uploads (shared by workers), the
    # bundled model under data_dir/models
    upload_limit: int = 512 * 1024 * 1024  # bytes of one upload
    store_limit: int = 4 * 1024 * 1024 * 1024  # bytes of all uploads kept
    trace_cache: int = 32  # traces kept in memory per worker
    svg_cache: int = 256  # rendered graph SVGs kept in memory per worker
    fixtures_dir: Path = field(default=FIXTURES_DIR)  # the GGUF examples, served like uploads
    programs: bool = False  # the playground: learners' programs run (in a sandbox) on this server
    unconfined_programs: bool = False  # ... without the kernel boundary (localhost only; tests)
    runs_at_once: int = 2  # recordings made at the same time by the embedded queue (each takes a core)
    run_queue: int = 16  # recordings that may wait for a free worker
    runs_per_client: int = 2  # recordings one client (address) may have waiting or running
    pure_numpy: bool = False  # the engine runs the numpy twins of its C loops (engine/lanes.py)
    models_dir: Path | None = None  # a folder of GGUF files opened in place (default: the
    # data directory's models/, where the bundled Gemma 3 270M is installed)
    queue: str | None = None  # a Redis URL: recordings are jobs for `ggml-lens worker` (app/workers.py)
    store: str | None = None  # an object store URL every process shares (app/objects.py)
    share_traces: bool = False  # traces go to data_dir/traces for the other processes (set by
    # --workers N; implied by queue and store)
    traces_limit: int = 8 * 1024 * 1024 * 1024  # bytes of trace files kept in data_dir/traces
    memory_limit: int = MEMORY_LIMIT  # bytes one process keeps in memory together: traces (their
    # patches, records and checkpoints), eval-callback dumps, rebuilt states (a quarter of it)

    @property
    def shares_traces(self) -> bool:
        return self.share_traces or self.queue is not None or self.store is not None

    @property
    def uploads(self) -> Path:
        return self.data_dir / "uploads"

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """The settings a deployment chose: GGML_LENS_DATA, _UPLOAD_LIMIT, _STORE_LIMIT,
        _TRACE_CACHE, _SVG_CACHE, _FIXTURES, _PROGRAMS ("1": the playground is on; "unconfined": on
        without the kernel boundary), _PURE_NUMPY ("1": the numpy twins), _MODELS, _QUEUE, _STORE,
        _SHARE_TRACES ("1"), _TRACES_LIMIT, _RUN_QUEUE, _RUNS_PER_CLIENT and _MEMORY_LIMIT (bytes
        of traces, dumps and states one process keeps in memory), each falling back to the
        default above."""
        env = os.environ if env is None else env
        d = cls()
        # (absolute from here on: a worker started elsewhere, bubblewrap's binds, a process
        # that changes its directory all read the paths the server was started with)
        data_dir = Path(env.get("GGML_LENS_DATA", d.data_dir)).absolute()
        return cls(data_dir=data_dir,
                   upload_limit=int(env.get("GGML_LENS_UPLOAD_LIMIT", d.upload_limit)),
                   store_limit=int(env.get("GGML_LENS_STORE_LIMIT", d.store_limit)),
                   trace_cache=int(env.get("GGML_LENS_TRACE_CACHE", d.trace_cache)),
                   svg_cache=int(env.get("GGML_LENS_SVG_CACHE", d.svg_cache)),
                   fixtures_dir=Path(env.get("GGML_LENS_FIXTURES", d.fixtures_dir)).absolute(),
                   programs=env.get("GGML_LENS_PROGRAMS", "") in ("1", "unconfined"),
                   unconfined_programs=env.get("GGML_LENS_PROGRAMS", "") == "unconfined",
                   pure_numpy=env.get("GGML_LENS_PURE_NUMPY", "") not in ("", "0"),
                   models_dir=Path(env["GGML_LENS_MODELS"]).absolute() if env.get("GGML_LENS_MODELS")
                   else data_dir / "models",
                   queue=env.get("GGML_LENS_QUEUE") or None,
                   store=env.get("GGML_LENS_STORE") or None,
                   share_traces=env.get("GGML_LENS_SHARE_TRACES", "") not in ("", "0"),
                   traces_limit=int(env.get("GGML_LENS_TRACES_LIMIT", d.traces_limit)),
                   run_queue=int(env.get("GGML_LENS_RUN_QUEUE", d.run_queue)),
                   runs_per_client=int(env.get("GGML_LENS_RUNS_PER_CLIENT", d.runs_per_client)),
                   memory_limit=int(env.get("GGML_LENS_MEMORY_LIMIT", d.memory_limit)))
