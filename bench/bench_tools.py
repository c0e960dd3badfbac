"""llama.cpp's tools against the engine's commands, as whole processes on the bundled Gemma 3 270M:
`ggml-lens quantize` against llama-quantize (Q4_0 and Q2_K from the Q4_K_M file, with
--allow-requantize, 2 threads), and `ggml-lens plan` at the model's defaults (no tool to compare:
the goal is the plan issue's, well under a second, the weights unread).

Each row is the median of three runs. llama-quantize is the one `make setup-test` builds
(tests/support/llamacpp_tools.py).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import Goal, median_of

THREADS = "2"


def _seconds(cmd: list[str], env: dict | None = None) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    return time.perf_counter() - t0


def run(report) -> None:
    from app.settings import Settings
    from engine.models.bundled import BundledModelError, require

    try:
        path = str(require(Settings.from_env().data_dir))
    except BundledModelError as e:
        print(f"tools: {e}")
        return
    try:
        from tests.support.llamacpp_tools import tool, tool_env
        quantize, env = str(tool("llama-quantize")), tool_env()
    except RuntimeError as e:  # not built: the rows show ours alone
        quantize, env = None, None
        print(f"tools: llama-quantize: {e}")
    ours_cmd = [sys.executable, "-m", "app.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        for ftype in ("Q4_0", "Q2_K"):
            out = str(Path(tmp) / f"{ftype}.gguf")
            ours = median_of(lambda: _seconds([*ours_cmd, "quantize", "--allow-requantize", path, out,
                                               ftype, THREADS]))
            theirs = median_of(lambda: _seconds([quantize, "--allow-requantize", path, out, ftype, THREADS],
                                                env)) if quantize else None
            report(f"gemma3 270M quantized to {ftype}, {THREADS} threads (whole process)", ours, theirs,
                   "llama-quantize" if quantize else "llama-quantize (not built)", Goal(ratio=4))
    report("gemma3 270M: ggml-lens plan at the model's defaults (whole process)",
           median_of(lambda: _seconds([*ours_cmd, "plan", path])), None, "-", Goal(seconds=3))
