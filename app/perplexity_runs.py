"""The perplexity page's runs: a text scored by a model of the models folder (and a second one
against it for the KL divergence), as jobs on a queue of their own, so a request never waits.

A run is named by its inputs (`RunSpec`: the models' names in the folder, the text, -c, --chunks),
which its URL carries; a learner's text is kept by its sha256 under the data directory, so the
same URL names the same run. The work is capped (a text of MAX_TEXT_BYTES, at most
MAX_EVAL_TOKENS tokens decoded by each model, fewer for large models); the finished runs are kept in a small cache of
this process (a run asked for again after it is evicted, or on another process, runs again).
The arithmetic is the engine's (engine/models/perplexity_scores.py); the models run with
`ggml-lens perplexity`'s context for the same -c (llama.cpp's default path), and are closed when
the run ends.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

from cachetools import LRUCache

from app.i18n import N_, _
from app.jobs import Job, JobQueue, Progress
from app.store import Fixture, UploadStore, evict_oldest
from app.web import log
from engine.models.bundled import FILE_NAME
from engine.programs import FIXTURES_DIR

if TYPE_CHECKING:
    from engine.models.perplexity_scores import PerplexityRun

BUILTIN = "builtin"  # the text named so in a RunSpec: the shipped essay
BUILTIN_TEXT = FIXTURES_DIR / "perplexity-text.txt"
DEFAULT_MODEL = FILE_NAME  # the bundled Gemma 3 270M, when the models folder has it
CTX_SIZES = (64, 128, 256, 512)  # -c choices (each divides llama-perplexity's default -b 2048)
DEFAULT_CTX = 128
MAX_TEXT_BYTES = 32 * 1024  # a learner's text
MAX_EVAL_TOKENS = 2048  # tokens one model decodes in a run (chunks * -c)
# bytes of weights times tokens decoded, all models together: two 270M models (~320 MB) over
# MAX_EVAL_TOKENS; larger models decode fewer tokens, so no run takes more than a minute or two
WORK_LIMIT = 2 * 320 * 2**20 * MAX_EVAL_TOKENS
TEXTS_LIMIT = 16 * 1024 * 1024  # bytes of learners' texts kept
TEXT_SUFFIX = ".txt"
KEPT_RUNS = 8  # finished runs kept in memory
RUN_URL = "/perplexity/run"
ENCODERS = frozenset({"bert"})  # architectures the engine builds that embed a text, not predict


class RunRefused(ValueError):
    """A run that is not started, or stopped: a message id and its arguments, translated when
    shown (a job's thread has no request's language); `status` the HTTP status to answer."""

    def __init__(self, message: str, status: int = 422, **args: object) -> None:
        super().__init__(message)
        self.message, self.status, self.args_ = message, status, args

    def __str__(self) -> str:
        return _(self.message).format(**self.args_)


@dataclass(frozen=True, slots=True)
class RunSpec:
    """What a run scores: its URL's query."""

    model: str  # a file of the models folder, by its name there
    text: str = BUILTIN  # BUILTIN or a learner's text's sha256
    c: int = DEFAULT_CTX  # -c: the chunk size
    chunks: int = -1  # --chunks: at most this many (-1: as many as the text holds, capped)
    kld: str = ""  # a second model (the folder's name), scored against the first; "" none

    @property
    def key(self) -> str:
        return hashlib.sha256(repr(self).encode()).hexdigest()

    @property
    def url(self) -> str:
        query = {k: v for k, v in asdict(self).items() if v not in ("", -1)}
        return f"{RUN_URL}?{urlencode(query)}"


@dataclass(frozen=True, slots=True)
class RunStatus:
    """Where a run is: finished (`run` or `error`), or queued/running (`progress`)."""

    run: PerplexityRun | None = None
    error: str | None = None
    progress: Progress | None = None
    done: int = 0  # chunks scored so far
    total: int | None = None  # chunks to score (known once the text is tokenized)


def read_text(data: bytes) -> bytes:
    """A text as llama.cpp's -f reads a file: one trailing newline dropped."""
    return data[:-1] if data.endswith(b"\n") else data


def chunk_limit(requested: int, cap: int) -> int:
    """--chunks for the engine: the request (-1: all), at most cap."""
    return cap if requested < 0 else min(requested, cap)


class PerplexityRuns:
    """The runs of one app: its queue (one run at a time), the finished runs, the texts."""

    def __init__(self, store: UploadStore, texts: Path, workers: int = 1, capacity: int = 4,
                 per_client: int = 1) -> None:
        self.store = store
        self.texts = texts
        self.jobs = JobQueue(self._run, workers, capacity, per_client)
        self._finished: LRUCache = LRUCache(KEPT_RUNS)
        self._totals: dict[str, int] = {}
        self._lock = threading.Lock()

    # --- inputs -------------------------------------------------------------------------------

    def model_names(self) -> list[str]:
        return [f.name for f in self.store.models()]

    def model_file(self, name: str) -> Fixture:
        for f in self.store.models():
            if f.name == name:
                return f
        raise RunRefused(N_("No model named {name} in the models folder."), 404, name=name)

    def model_path(self, name: str) -> Path:
        return self.model_file(name).path

    def max_tokens(self, spec: RunSpec) -> int:
        """The tokens each model may decode in this run: MAX_EVAL_TOKENS, fewer for large
        models (WORK_LIMIT)."""
        size = sum(self.model_file(n).size for n in (spec.model, spec.kld) if n)
        return min(MAX_EVAL_TOKENS, WORK_LIMIT // max(size, 1))

    def save_text(self, text: str) -> str:
        """Keep a learner's text (lines ending in LF, as a file would hold them); its sha256."""
        data = text.replace("\r\n", "\n").encode("utf-8")
        if len(data) > MAX_TEXT_BYTES:
            raise RunRefused(N_("The text is {n} bytes; the page scores at most {limit} bytes. "
                                "Shorten it, or run `ggml-lens perplexity` on a file."), 413,
                             n=len(data), limit=MAX_TEXT_BYTES)
        if not data.strip():
            raise RunRefused(N_("The text is empty: paste a text, or choose the built-in one."))
        digest = hashlib.sha256(data).hexdigest()
        self.texts.mkdir(parents=True, exist_ok=True)
        path = self.texts / f"{digest}{TEXT_SUFFIX}"
        if not path.is_file():
            part = path.with_name(f"{digest}.{threading.get_ident()}.part")
            part.write_bytes(data)
            part.replace(path)
        evict_oldest(self.texts, TEXT_SUFFIX, TEXTS_LIMIT, keep=path)
        return digest

    def text(self, ref: str) -> bytes:
        """The bytes a run scores (the -f rule applied)."""
        if ref == BUILTIN:
            return read_text(BUILTIN_TEXT.read_bytes())
        path = self.texts / f"{ref}{TEXT_SUFFIX}"
        if len(ref) != 64 or not path.is_file():
            raise RunRefused(N_("This text is no longer kept on the server: paste it again."), 404)
        return read_text(path.read_bytes())

    def check(self, spec: RunSpec) -> None:
        """Refuse what the page does not run, before any work (RunRefused)."""
        if spec.c not in CTX_SIZES:
            raise RunRefused(N_("-c must be one of {sizes} (got {c})."),
                             sizes=", ".join(map(str, CTX_SIZES)), c=spec.c)
        tokens = self.max_tokens(spec)  # (a model not in the folder is refused here)
        if tokens < spec.c:
            raise RunRefused(N_("These models are too large for the page at -c {c}: it decodes "
                                "at most {tokens} tokens with them. Choose a smaller -c, or run "
                                "`ggml-lens perplexity`."), c=spec.c, tokens=tokens)
        if spec.chunks == 0 or spec.chunks < -1 or spec.chunks > tokens // spec.c:
            raise RunRefused(N_("--chunks must be 1 to {n} at -c {c} (the page decodes at most "
                                "{tokens} tokens with these models); got {chunks}."),
                             n=tokens // spec.c, c=spec.c, tokens=tokens, chunks=spec.chunks)
        for name in (spec.model, spec.kld):
            if name:
                self._check_decoder(name)
        self.text(spec.text)

    def _check_decoder(self, name: str) -> None:
        """Refuse a file that is not GGUF, or whose architecture predicts no next token."""
        from engine.gguf import GGUFError

        try:
            reader = self.store.open(self.model_file(name).digest)
        except GGUFError as e:
            raise RunRefused(N_("{name} is not a valid GGUF file: {error}"), name=name,
                             error=str(e)) from None
        if reader is not None and reader.get("general.architecture") in ENCODERS:
            raise RunRefused(NOT_A_DECODER, name=name)

    # --- the queue ----------------------------------------------------------------------------

    def status(self, spec: RunSpec, client: str) -> RunStatus:
        """The run's state; a run not known here is queued (QueueFull when there is no room)."""
        key = spec.key
        with self._lock:
            finished = self._finished.get(key)
        if finished is not None:
            run, error = finished
            return RunStatus(run=run, error=None if error is None else str(error))
        job = self.jobs.find(spec) or self.jobs.submit(spec, client)
        if job.done.is_set():  # ended between the two looks
            return self.status(spec, client)
        return RunStatus(progress=self.jobs.progress(job), done=job.steps,
                         total=self._totals.get(key))

    def wait(self, spec: RunSpec, seconds: float) -> bool:
        """Wait up to `seconds` for a queued or running run; whether it has finished."""
        job = self.jobs.find(spec)
        if job is not None:
            job.done.wait(seconds)
        with self._lock:
            return spec.key in self._finished

    def close(self) -> None:
        self.jobs.close()

    def _run(self, spec: RunSpec, job: Job) -> None:
        """The job: load, tokenize, score, close; the outcome kept under the run's key."""
        from engine.models import ModelError
        from engine.models.params import ParamsError
        from engine.models.perplexity import PerplexityError

        outcome: tuple = (None, None)
        try:
            outcome = (self._score(spec, job), None)
        except RunRefused as e:
            outcome = (None, e)
        except (PerplexityError, ModelError, ParamsError, OSError) as e:  # in the engine's words
            outcome = (None, RunRefused(FAILED, error=str(e)))
        except Exception as e:  # noqa: BLE001 - a bug: logged, and shown rather than retried
            log.exception("perplexity run %s", spec)
            outcome = (None, RunRefused(FAILED, error=f"{type(e).__name__}: {e}"))
        with self._lock:
            self._finished[spec.key] = outcome
            self._totals.pop(spec.key, None)

    def _score(self, spec: RunSpec, job: Job) -> PerplexityRun:
        from engine.models import load_model
        from engine.models.params import ContextParams
        from engine.models.perplexity import split_chunks
        from engine.models.perplexity_scores import score_text

        text = self.text(spec.text)
        # `ggml-lens perplexity MODEL -f TEXT -c N`'s context (its -b 2048 taken down to -c)
        params = ContextParams(n_ctx=spec.c, n_batch=spec.c)
        models = []
        try:
            models.append(load_model(self.model_path(spec.model), params=params))
            model = models[0]
            tokens = model.encode(text)
            n_max = len(tokens) // spec.c
            cap = self.max_tokens(spec) // spec.c
            c = split_chunks(len(tokens), spec.c, chunk_limit(spec.chunks, cap))
            self._totals[spec.key] = c.n_chunk
            if spec.kld:
                models.append(load_model(self.model_path(spec.kld), params=params))
            return score_text(model, tokens, c, n_max, models[1] if spec.kld else None,
                              on_chunk=job.count_step)
        finally:
            for m in models:
                m.close()


FAILED = N_("The run stopped: {error}")
NOT_A_DECODER = N_("{name} does not predict next tokens (it is not a decoder model): its "
                   "perplexity is not defined.")
