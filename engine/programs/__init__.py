"""The built-in walkthroughs: short ggml programs written against engine.ggml.

Each module has a docstring (its first line says what it teaches) and `run(n_threads) -> outputs`.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from engine.models import ARCHITECTURES

# the GGUF files the demos and tests read, shipped inside the package (engine/fixtures/README.md
# says what they are; the web app and the command line may take another folder from app.settings)
FIXTURES_DIR = Path(__file__).resolve().parents[1] / "fixtures"


@dataclass(frozen=True, slots=True)
class Program:
    name: str  # the URL name, e.g. "simple-ctx"
    module: str  # module under engine.programs
    threads: int  # the thread count it is shown with by default
    reads: str | None = None  # the fixture file it reads when no `path` is given
    model: bool = False  # it reads the bundled model (engine/models/bundled.py) by default
    prompt: str | None = None  # the text it reads when the learner gives none
    runs: tuple[str, ...] = ()  # the architectures of the files it can run ("Run it")
    steps_into: tuple[str, ...] = ()  # packages under engine whose facade calls are steps too
    #                                   (a model walkthrough's: the builders' own code)
    settings: tuple[str, ...] = ()  # llama.cpp's settings its run() takes (settings.SETTINGS)

    def load(self) -> ModuleType:
        return importlib.import_module(f"engine.programs.{self.module}")

    @property
    def teaches(self) -> str:
        doc = (self.load().__doc__ or "").strip().splitlines()[0]
        return doc.split(":", 1)[1].strip() if ":" in doc else doc

    @property
    def source_file(self) -> str:
        return inspect.getfile(self.load())

    def check_settings(self, path: str | None, settings: dict) -> None:
        """llama.cpp's refusals of these settings (run()'s keywords, typed) for the file at
        `path` before it runs: ParamsError, from the module's check_settings where it has one."""
        check = getattr(self.load(), "check_settings", None)
        if check is not None and settings:
            check(path, **settings)

    @property
    def also_files(self) -> tuple[str, ...]:
        """The files of the packages it steps into (their modules, sorted)."""
        root = Path(__file__).resolve().parents[1]
        return tuple(str(f) for pkg in self.steps_into
                     for f in sorted((root / pkg.replace(".", "/")).glob("*.py"))
                     if "from engine.ggml" in f.read_text())  # (those that call ggml)


PROGRAMS: dict[str, Program] = {p.name: p for p in [
    Program("simple-ctx", "simple_ctx", 1),
    Program("simple-add", "simple_add", 1),
    Program("simple-backend", "simple_backend", 1),
    Program("views-and-permute", "views_and_permute", 1),
    Program("quantized-tensor", "quantized_tensor", 1),
    Program("graph-build", "graph_build", 1),
    Program("threads", "threads", 4),
    Program("gguf-load", "gguf_load", 1, reads="minilm-q8_0.gguf", runs=("*",)),
    Program("mnist-style", "mnist_style", 1),
    Program("mnist-train", "mnist_train", 2),
    Program("attention-block", "attention_block", 1),
    Program("moe-routing", "moe_routing", 2),
    Program("minilm", "minilm", 2, reads="minilm-q8_0.gguf",
            prompt="ggml is a tensor library for machine learning.", runs=("bert",)),
    Program("tiny-llama", "tiny_llama", 1),
    Program("offload", "offload", 1),
    Program("repack", "repack", 2),
    Program("gemma3", "gemma3", 1, model=True, prompt="The capital of France is",
            runs=("gemma3",), settings=("flash_attn",)),
    Program("model", "model", 1, model=True, prompt="The capital of France is",
            runs=tuple(a for a in ARCHITECTURES if a not in ("bert", "gemma3")),
            steps_into=("models",),
            settings=("flash_attn", "type_k", "type_v", "no_repack", "n_ubatch", "n_ctx")),
]}


def program_for(arch: str) -> Program | None:
    """The walkthrough that runs a model file of architecture `arch`, if one does."""
    return next((p for p in PROGRAMS.values() if arch in p.runs), None)


def trace_program(name: str, n_threads: int | None = None, **inputs):
    """Record the named walkthrough (KeyError if there is none); `inputs` go to its run()."""
    from engine.trace import record

    prog = PROGRAMS[name]
    mod = prog.load()
    return record(mod.run, inspect.getfile(mod), name, n_threads or prog.threads, also=prog.also_files,
                  **inputs)
