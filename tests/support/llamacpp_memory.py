"""Real llama.cpp's memory, in a process of its own: the oracle for the plan tests.

`measure([(model, params), ...])` loads each model and makes its context with llama.cpp
(llama-cpp-python 0.3.36's library, through its C API: llama_model_load_from_file and
llama_init_from_model, as llama-cli does) and returns, per job, everything llama.cpp logged while
doing it ("log": its buffer sizes in MiB, two decimals) and its own memory breakdown in bytes
("breakdown": {buffer type: [model, context, compute, is_host]}, llama_get_memory_breakdown,
what llama-fit-params adds up), or "error" when llama.cpp refused the context.

llama_get_memory_breakdown is C++ (src/llama-ext.h): it returns a std::map, which the child
reads as libstdc++ lays one out (a red-black tree whose nodes hold the buffer type's pointer and
three size_t). `params`: n_ctx, n_batch, n_ubatch, flash_attn ("on", "off", "auto"), type_k and
type_v (ggml type numbers), swa_full, use_mmap, extra_bufts (False: -nr), n_seq_max, no_alloc
(llama-fit-params' pass: the model placed, nothing allocated or read, no mmap).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TIMEOUT = 900
FLASH = {"off": 0, "on": 1, "auto": -1}  # llama_flash_attn_type


def measure(jobs: list[tuple[Path, dict]]) -> list[dict]:
    """Each (model, params) loaded in turn by one fresh llama.cpp process."""
    cmd = [sys.executable, "-m", "tests.support.llamacpp_memory"]
    done = subprocess.run(cmd, input=json.dumps([[str(m), p] for m, p in jobs]),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def _breakdown(llama_cpp, ctx) -> dict[str, list[int]]:
    """llama_get_memory_breakdown(ctx): {buffer type name: [model, context, compute] bytes and
    whether the buffer type is a host one (ggml_backend_buft_is_host)}."""
    import ctypes

    lib = llama_cpp.llama_cpp._lib
    get = lib._Z26llama_get_memory_breakdownPK13llama_context
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_void_p]
    base = ctypes.CDLL(lib._name.replace("libllama", "libggml-base"))
    base.ggml_backend_buft_name.restype = ctypes.c_char_p
    base.ggml_backend_buft_name.argtypes = [ctypes.c_void_p]
    base.ggml_backend_buft_is_host.restype = ctypes.c_bool
    base.ggml_backend_buft_is_host.argtypes = [ctypes.c_void_p]
    tree = (ctypes.c_uint8 * 64)()  # the std::map the call constructs (48 bytes), never freed
    get(ctypes.addressof(tree), ctx)
    header = ctypes.addressof(tree) + 8  # past the (empty) comparator
    ptr = lambda a: ctypes.c_void_p.from_address(a).value or 0  # noqa: E731
    out: dict[str, list[int]] = {}

    def walk(node: int) -> None:  # node: color, parent, left, right, then the value
        if not node:
            return
        walk(ptr(node + 16))
        buft = ptr(node + 32)
        out[base.ggml_backend_buft_name(buft).decode()] = [
            *(ctypes.c_size_t.from_address(node + 40 + 8 * i).value for i in range(3)),
            bool(base.ggml_backend_buft_is_host(buft))]
        walk(ptr(node + 24))

    walk(ptr(header + 8))
    assert len(out) == ctypes.c_size_t.from_address(header + 32).value
    return out


def _serve(jobs: list) -> list[dict]:
    import llama_cpp as L

    logged: list[str] = []

    @L.llama_log_callback
    def callback(level, text, user_data):
        logged.append(text.decode("utf-8", "replace"))

    L.llama_log_set(callback, None)
    L.llama_backend_init()
    answers = []
    for path, p in jobs:
        logged.clear()
        mp = L.llama_model_default_params()
        mp.use_extra_bufts = bool(p.get("extra_bufts", True))
        mp.load_mode = L.LLAMA_LOAD_MODE_MMAP if p.get("use_mmap", True) else L.LLAMA_LOAD_MODE_NONE
        if p.get("no_alloc"):
            mp.no_alloc, mp.load_mode = True, L.LLAMA_LOAD_MODE_NONE
        model = L.llama_model_load_from_file(path.encode(), mp)
        if not model:
            answers.append({"log": "".join(logged), "error": "model"})
            continue
        cp = L.llama_context_default_params()
        for key in ("n_ctx", "n_batch", "n_ubatch", "n_seq_max", "type_k", "type_v"):
            if key in p:
                setattr(cp, key, int(p[key]))
        cp.flash_attn_type = FLASH[p.get("flash_attn", "auto")]
        cp.swa_full = bool(p.get("swa_full", False))
        cp.n_threads = cp.n_threads_batch = 1
        ctx = L.llama_init_from_model(model, cp)
        if not ctx:
            answers.append({"log": "".join(logged), "error": "context"})
        else:
            answers.append({"log": "".join(logged), "breakdown": _breakdown(L, ctx)})
            L.llama_free(ctx)
        L.llama_model_free(model)
    return answers


if __name__ == "__main__":
    print(json.dumps(_serve(json.loads(sys.stdin.read()))))
