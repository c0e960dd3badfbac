"""The playground's programs (a learner's own; engine/programs holds the walkthroughs'), kept by
the sha256 of their text in a directory every worker shares, and recorded in the sandbox
(app/sandbox/) by the job queue (app/jobs.py) when a worker has no trace of them.

A program's permalink is its hash: any worker can read the text back and record the same trace.
With a shared object store (`--store`, app/objects.py) the text is put there too, and fetched
from there by a process that does not have it.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path

from app.i18n import _
from app.objects import SharedStore
from app.sandbox.boundary import BoundaryMissing, boundary
from app.sandbox.run import Limits, ProgramFailed, run_program
from engine.core.notes import Note
from engine.trace.steps import Step, StepKind
from engine.trace import Trace

PROGRAM_RE = re.compile(r"[0-9a-f]{64}")
MAX_PROGRAM = 64 * 1024  # bytes of program text
MAX_KEPT = 10_000  # programs kept; the oldest go first


class ProgramStore:
    def __init__(self, root: Path, limits: Limits = Limits(), unconfined: bool = False,
                 model: Path | None = None, shared: SharedStore | None = None) -> None:
        self.root = root
        self.shared = shared
        self.limits = limits
        self.model = model.absolute() if model is not None else None  # the bundled model, which
        # programs may read (bound into the worker's sandbox by its absolute path)
        self.unconfined = unconfined  # --allow-unconfined-programs: no kernel boundary (localhost)
        root.mkdir(parents=True, exist_ok=True)

    def boundary_missing(self) -> str | None:
        """Why programs cannot run on this machine (the kernel boundary is missing), or None."""
        try:
            boundary(self.unconfined)
        except BoundaryMissing as e:
            return str(e)
        return None

    @staticmethod
    def digest(source: str) -> str:
        return hashlib.sha256(source.encode("utf-8")).hexdigest()

    def save(self, source: str) -> str:
        """Keep the text (written to a temporary file, then renamed: a reader never sees half)."""
        if len(source.encode("utf-8")) > MAX_PROGRAM:
            raise ValueError(_("a program may be at most {n} bytes").format(n=f"{MAX_PROGRAM:,}"))
        digest = self.digest(source)
        path = self.root / f"{digest}.py"
        if not path.exists():
            fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".part")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(source)
            os.replace(tmp, path)
            if self.shared is not None:
                self.shared.put_file(f"programs/{path.name}", path)
            self._trim()
        return digest

    def load(self, digest: str) -> str | None:
        if not PROGRAM_RE.fullmatch(digest):
            return None
        path = self.root / f"{digest}.py"
        if not path.is_file() and (self.shared is None or not self.shared.fetch(f"programs/{path.name}", path,
                                                                                 MAX_PROGRAM)):
            return None
        source = path.read_text(encoding="utf-8")
        return source if self.digest(source) == digest else None  # (a shared copy must be the text)

    def record(self, source: str, threads: int) -> Trace:
        """Run the program in the sandbox (a job's work: it waits for the worker). A run that
        gave no trace (a limit killed it, its output was refused, the boundary went missing) is
        a trace of one error step saying why."""
        try:
            return run_program(source, threads, self.limits, unconfined=self.unconfined, model=self.model)
        except (ProgramFailed, BoundaryMissing) as e:
            return failed_trace(source, threads, str(e))

    def _trim(self) -> None:
        files = sorted(self.root.glob("*.py"), key=lambda p: p.stat().st_mtime)
        for p in files[:max(0, len(files) - MAX_KEPT)]:
            p.unlink(missing_ok=True)


def failed_trace(source: str, threads: int, message: str) -> Trace:
    trace = Trace("program", source, threads, error=message)
    trace.steps.append(Step(0, StepKind.ERROR, "", 1, (Note.verbatim(message),)))
    return trace
