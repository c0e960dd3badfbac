"""llama.cpp's own command-line tools, the oracles of the engine's quantize, perplexity and fit.

`make setup-test` (its `llama-tools` step) builds llama-quantize, llama-perplexity and
llama-fit-params with CMake from the llama.cpp that the llama-cpp-python 0.3.36 sdist vendors (the
AVX2 build of the other oracles) into ~/.cache/ggml-lens/tools-<version>-<hash of the flags>/,
with bin/ and lib/ (the shared libraries they load), and points var/cache/llama-tools at it
(GGML_LENS_LLAMA_TOOLS names another such directory). `tool(name)` finds a binary and `run_tool`
runs it with its libraries on LD_LIBRARY_PATH (which comes before the build tree's RUNPATH).
Tests never build: a missing tool raises, so its tests fail rather than skip.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = Path(os.environ.get("GGML_LENS_LLAMA_TOOLS", REPO / "var" / "cache" / "llama-tools"))
SETUP_HINT = "run `make setup-test` (its llama-tools step builds them) once to set them up"


def tool(name: str) -> Path:
    """The path of llama.cpp's tool `name` (llama-quantize, ...); raises when it is not built."""
    path = TOOLS / "bin" / name
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"llama.cpp's {name} is not in {TOOLS / 'bin'}: {SETUP_HINT}")
    if not (TOOLS / "lib").is_dir():
        raise RuntimeError(f"the shared libraries of llama.cpp's tools are not in "
                           f"{TOOLS / 'lib'}: {SETUP_HINT}")
    return path


def tool_env() -> dict[str, str]:
    """The environment the tools run in: theirs, with their lib/ first on LD_LIBRARY_PATH."""
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (str(TOOLS / "lib"), env.get("LD_LIBRARY_PATH", "")) if p)
    return env


def run_tool(name: str, *args: str | os.PathLike, check: bool = True,
             timeout: float = 1800) -> subprocess.CompletedProcess:
    """Run llama.cpp's tool `name` with `args`; its output as text. With `check`, a failure
    raises with its output."""
    cmd = [str(tool(name)), *map(str, args)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=tool_env(), timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-3000:]}")
    return done
