"""Real llama.cpp in a process of its own: the oracle for the model tests.

llama-cpp-python and ggml-python each load a ggml library; in one process the second one loaded
changes what the first computes, so the comparisons with a real model run llama.cpp here, in a
child process that imports nothing of ggml-python, and read its answers back as JSON (logits as
a .npy file). `ask(model, request)` is the parent's side; `ask_many` runs several in one process.

`params` go to llama_cpp.Llama, except two switches for llama.cpp's other CPU code paths, whose
spread bounds the comparisons: "extra_bufts": False turns off the extra buffer types (the
repacked weights); "tiled": False turns off the tiled K-quant products llama.cpp's ggml takes for
8 or more rows (GGML_CPU_TILED_MM=0). With both off llama.cpp runs ggml's plain kernels (and
llamafile's sgemm, which the engine follows inside engine.compute.plan.llamafile_build).
"flash_attn" is llama_cpp.Llama's (True: on, False: off), or "auto": llama.cpp's own default,
which llama_cpp.Llama cannot ask for (its context is made with flash_attn_type AUTO).

Requests: {"tokenize": [text, ...], "special": bool} -> {"tokens": [[id, ...], ...]};
{"logits": [id, ...], "out": path} -> every position's logits saved to `out` (with "batch": k,
the first k tokens decoded in one batch, then the others one at a time through the cache);
{"greedy": [id, ...], "n": k} -> {"tokens": the k most likely next tokens, one at a time};
{"sweep": [[id, ...], ...], "n": k} -> {"prompts": per prompt, from an empty cache, "digests":
row_digests of every position's logits and of each greedy step's, "tokens": the k greedy tokens};
{"pieces": [id, ...]} -> {"pieces": each token's bytes as latin-1 text};
{"dump": [id, ...]} -> {"dump": the eval-callback dump (llama-eval-callback's format, see
engine/trace/evaldump.py) of decoding the tokens in one batch};
{"sample": [id, ...], "n": k, "top_k", "top_p", "min_p", "temp", "seed"} -> {"tokens": k tokens
drawn by llama.cpp's own sampler chain (top-k, top-p, min-p, temperature, dist), each fed back};
{"chat": [{"role", "content"}, ...], "template": text} -> {"text": llama_chat_apply_template's
prompt (llama.cpp's own C++ formatting of the template it recognises), "tokens": its ids};
{"flash_attn_ext": npz, "out": npz} -> no model: llama.cpp's own ggml computing
ggml_flash_attn_ext (F32 precision) of each job flash_attn_many wrote, saved to `out`;
{"load_log": true} -> {"log": everything llama.cpp and ggml logged while loading the model and
making the context, debug lines included (which tensors it repacked, its buffers' sizes), and
"error" when llama.cpp refused to make the context (its reason is in the log)}.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

N_CTX = 512
TIMEOUT = 600


def ask(model: Path, request: dict, n_threads: int = 2, **params) -> dict:
    """Run one request against `model` in a fresh llama.cpp process."""
    cmd = [sys.executable, "-m", "tests.support.llamacpp_run", str(model), str(n_threads),
           json.dumps(params)]
    done = subprocess.run(cmd, input=json.dumps(request), capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def ask_many(jobs: list[tuple[Path, dict]], n_threads: int = 2, **params) -> list[dict]:
    """Run each (model, request) in turn in one fresh llama.cpp process (one start for many
    small files)."""
    cmd = [sys.executable, "-m", "tests.support.llamacpp_run", "--many", str(n_threads),
           json.dumps(params)]
    done = subprocess.run(cmd, input=json.dumps([[str(m), r] for m, r in jobs]),
                          capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=Path(__file__).resolve().parents[2])
    if done.returncode != 0:
        raise RuntimeError(f"llama.cpp failed: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def flash_attn_many(jobs: list[dict], tmp: Path) -> list:
    """llama.cpp's ggml_flash_attn_ext of each job, all in one child process: a job is q (float32,
    numpy order), k and v (raw bytes of types tk and tv, numpy order of their ne: ne_k, ne_v),
    an optional mask (float32 values, rounded to F16 as the graph's input) and sinks (float32),
    scale, max_bias, softcap and n_threads. Returns each dst (float32, numpy order)."""
    import numpy as np

    arrays = {}
    for i, j in enumerate(jobs):
        mask, sinks = j.get("mask"), j.get("sinks")
        arrays[f"q{i}"] = np.ascontiguousarray(j["q"], np.float32)
        arrays[f"k{i}"] = np.frombuffer(bytes(j["k"]), np.uint8)
        arrays[f"v{i}"] = np.frombuffer(bytes(j["v"]), np.uint8)
        ne_m = [0] * 4 if mask is None else list(reversed(mask.shape))
        arrays[f"h{i}"] = np.array([j["tk"], j["tv"], j["n_threads"], *j["ne_k"], *j["ne_v"],
                                    *ne_m, sinks is not None], np.int64)
        arrays[f"p{i}"] = np.array([j["scale"], j.get("max_bias", 0.0), j.get("softcap", 0.0)],
                                   np.float32)
        if mask is not None:
            arrays[f"m{i}"] = np.asarray(mask, np.float32).astype(np.float16)
        if sinks is not None:
            arrays[f"s{i}"] = np.asarray(sinks, np.float32)
    np.savez(tmp / "fa-jobs.npz", **arrays)
    ask(tmp, {"flash_attn_ext": str(tmp / "fa-jobs.npz"), "out": str(tmp / "fa-dst.npz")})
    with np.load(tmp / "fa-dst.npz") as got:
        return [got[f"d{i}"] for i in range(len(jobs))]


def _flash_attn_ext(request: dict) -> dict:
    """The child's side of flash_attn_many: the jobs built and computed with the libggml-base and
    libggml-cpu llama_cpp ships, through ctypes."""
    import ctypes
    import importlib.util

    import numpy as np

    lib = Path(importlib.util.find_spec("llama_cpp").origin).parent / "lib"
    base = ctypes.CDLL(str(lib / "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
    cpu = ctypes.CDLL(str(lib / "libggml-cpu.so"))

    class InitParams(ctypes.Structure):
        _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                    ("no_alloc", ctypes.c_bool)]

    vp, f32 = ctypes.c_void_p, ctypes.c_float
    for fn, res, args in [(base.ggml_init, vp, [InitParams]),
                          (base.ggml_new_tensor, vp, [vp, ctypes.c_int, ctypes.c_int,
                                                      ctypes.POINTER(ctypes.c_int64)]),
                          (base.ggml_flash_attn_ext, vp, [vp, vp, vp, vp, vp, f32, f32, f32]),
                          (base.ggml_flash_attn_ext_set_prec, None, [vp, ctypes.c_int]),
                          (base.ggml_flash_attn_ext_add_sinks, None, [vp, vp]),
                          (base.ggml_new_graph, vp, [vp]),
                          (base.ggml_build_forward_expand, None, [vp, vp]),
                          (base.ggml_get_data, vp, [vp]), (base.ggml_nbytes, ctypes.c_size_t, [vp]),
                          (base.ggml_free, None, [vp]),
                          (cpu.ggml_graph_compute_with_ctx, ctypes.c_int, [vp, vp, ctypes.c_int])]:
        fn.restype, fn.argtypes = res, args
    cpu.ggml_cpu_init()
    out = {}
    with np.load(request["flash_attn_ext"]) as jobs:
        for i in range(sum(1 for k in jobs.files if k.startswith("h"))):
            h, p = [int(x) for x in jobs[f"h{i}"]], jobs[f"p{i}"]
            tk, tv, n_threads, ne_k, ne_v, ne_m, sinks = h[0], h[1], h[2], h[3:7], h[7:11], h[11:15], h[15]
            ctx = base.ggml_init(InitParams(256 << 20, None, False))

            def leaf(type_: int, ne: list[int], data) -> int:
                t = base.ggml_new_tensor(ctx, type_, 4, (ctypes.c_int64 * 4)(*ne))
                raw = np.ascontiguousarray(data).tobytes()
                assert base.ggml_nbytes(t) == len(raw)
                ctypes.memmove(base.ggml_get_data(t), raw, len(raw))
                return t

            q = jobs[f"q{i}"]
            ne_q = list(reversed(q.shape)) + [1] * (4 - q.ndim)
            dst = base.ggml_flash_attn_ext(
                ctx, leaf(0, ne_q, q), leaf(tk, ne_k, jobs[f"k{i}"]), leaf(tv, ne_v, jobs[f"v{i}"]),
                leaf(1, ne_m, jobs[f"m{i}"]) if ne_m[0] else None, *(float(x) for x in p))
            base.ggml_flash_attn_ext_set_prec(dst, 10)  # GGML_PREC_F32
            if sinks:
                s = jobs[f"s{i}"]
                base.ggml_flash_attn_ext_add_sinks(dst, leaf(0, [len(s), 1, 1, 1], s))
            gf = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(gf, dst)
            assert cpu.ggml_graph_compute_with_ctx(ctx, gf, n_threads) == 0
            d = ctypes.string_at(base.ggml_get_data(dst), base.ggml_nbytes(dst))
            out[f"d{i}"] = np.frombuffer(d, np.float32).reshape(ne_q[3], ne_q[1], ne_q[2], -1)
            base.ggml_free(ctx)
    np.savez(request["out"], **out)
    return {"saved": request["out"]}


_ORIGINAL_PARAMS = []  # llama_model_default_params before _serve first wrapped it
_KEEP: list = []  # the eval callbacks of the dumps (alive while llama.cpp may call them)


def _serve(model: str, n_threads: int, params: dict, request: dict) -> dict:
    import os

    if "flash_attn_ext" in request:  # (no model: llama.cpp's ggml alone)
        return _flash_attn_ext(request)
    params = dict(params)
    if not params.pop("tiled", True):  # read once, when the first product asks
        os.environ["GGML_CPU_TILED_MM"] = "0"
    import llama_cpp
    import llama_cpp.llama as llama_module
    import numpy as np

    extra_bufts = params.pop("extra_bufts", True)  # False: no repacked weights (another path)
    if not _ORIGINAL_PARAMS:
        _ORIGINAL_PARAMS.append(llama_module.llama_cpp.llama_model_default_params)
    original = _ORIGINAL_PARAMS[0]

    def model_params():
        p = original()
        p.use_extra_bufts = extra_bufts
        return p

    llama_module.llama_cpp.llama_model_default_params = model_params
    logged: list[str] = []
    if request.get("load_log"):
        _KEEP.append(_capture_log(llama_cpp, logged))
    dumped: list[str] = []
    if "dump" in request:
        from tests.support.llamacpp_dump import watch_nodes

        _KEEP.append(watch_nodes(llama_cpp, dumped))
    if params.get("flash_attn") == "auto":
        params.pop("flash_attn")
        _KEEP.append(_auto_flash_attn(llama_cpp, llama_module))
    try:
        llm = llama_cpp.Llama(model, n_ctx=params.pop("n_ctx", N_CTX), n_threads=n_threads,
                              logits_all=bool({"logits", "greedy", "sample", "sweep"} & set(request)),
                              verbose=False, **params)
    except ValueError as e:  # llama.cpp refused: say so with its log, when that was asked for
        if not request.get("load_log"):
            raise
        return {"log": "".join(logged), "error": str(e)}
    if request.get("load_log"):
        return {"log": "".join(logged)}
    if "tokenize" in request:
        special = bool(request.get("special", False))
        return {"tokens": [llm.tokenize(t.encode(), add_bos=True, special=special)
                           for t in request["tokenize"]]}
    if "pieces" in request:
        return {"pieces": [llm.detokenize([t]).decode("latin-1") for t in request["pieces"]]}
    if "dump" in request:
        dumped.clear()  # nothing from loading
        llm.eval(request["dump"])
        return {"dump": "".join(dumped)}
    if "logits" in request:
        tokens = request["logits"]
        k = int(request.get("batch", len(tokens)))
        llm.eval(tokens[:k])
        for t in tokens[k:]:
            llm.eval([t])
        np.save(request["out"], np.array(llm.scores[:len(tokens)], dtype=np.float32))
        return {"saved": request["out"]}
    if "sweep" in request:
        return {"prompts": [_sweep(llm, ids, int(request["n"])) for ids in request["sweep"]]}
    if "greedy" in request:
        tokens, out = list(request["greedy"]), []
        llm.eval(tokens)
        for _ in range(int(request["n"])):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(nxt)
            llm.eval([nxt])
        return {"tokens": out}
    if "chat" in request:
        return _chat(llama_cpp, llm, request)
    if "sample" in request:
        return {"tokens": _sample(llama_cpp, llm, request)}
    raise ValueError(f"unknown request {sorted(request)}")


def _auto_flash_attn(llama_cpp, llama_module):
    """Make llama_cpp.Llama's contexts with flash_attn_type AUTO (it only sets ENABLED or
    DISABLED): the context class it calls, wrapped. Returns the original."""
    internals = llama_module.internals
    original = internals.LlamaContext

    def make(*args, **kwargs):
        kwargs["params"].flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO
        return original(*args, **kwargs)

    internals.LlamaContext = make
    return original


def _capture_log(llama_cpp, out: list[str]):
    """Route llama.cpp's and ggml's log, every level, into out (the callback, to keep alive)."""
    @llama_cpp.llama_log_callback
    def callback(level, text, user_data):
        out.append(text.decode("utf-8", "replace"))
    llama_cpp.llama_log_set(callback, None)
    return callback


def row_digests(rows) -> list[str]:
    """Each row of float32 logits as a short sha256 of its bytes (bit-for-bit comparisons
    without carrying 262,144 floats a position between processes)."""
    import hashlib

    import numpy as np

    return [hashlib.sha256(np.ascontiguousarray(r, np.float32).tobytes()).hexdigest()[:16]
            for r in rows]


def _sweep(llm, ids: list[int], n: int) -> dict:
    """A fresh sequence: every position's logits of the prompt (digests), then n greedy tokens,
    each fed back, with the digest of the logits that chose it."""
    import numpy as np

    llm.reset()
    llm.eval(list(ids))
    digests = row_digests(llm.scores[:len(ids)])
    tokens = []
    for _ in range(n):
        last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
        tokens.append(int(np.argmax(last)))
        llm.eval([tokens[-1]])
        digests += row_digests([llm.scores[llm.n_tokens - 1]])
    return {"digests": digests, "tokens": tokens}


def _chat(llama_cpp, llm, request: dict) -> dict:
    import ctypes

    lib = llama_cpp.llama_cpp
    msgs = (lib.llama_chat_message * len(request["chat"]))(*[
        lib.llama_chat_message(m["role"].encode(), m["content"].encode())
        for m in request["chat"]])
    buf = (ctypes.c_char * 65536)()
    n = lib.llama_chat_apply_template(request["template"].encode(), msgs, len(msgs), True, buf,
                                      len(buf))
    if n < 0:
        raise ValueError("llama.cpp does not recognise the template")
    text = bytes(buf[:n]).decode()
    return {"text": text, "tokens": llm.tokenize(text.encode(), add_bos=True, special=True)}


def _sample(llama_cpp, llm, request: dict) -> list[int]:
    """llama_sampler_sample with a chain of llama.cpp's samplers, token after token."""
    lib = llama_cpp.llama_cpp
    chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(int(request["top_k"])))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(float(request["top_p"]), 1))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_min_p(float(request["min_p"]), 1))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(float(request["temp"])))
    lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(int(request["seed"])))
    llm.eval(list(request["sample"]))
    out = []
    for _ in range(int(request["n"])):
        token = int(lib.llama_sampler_sample(chain, llm.ctx, -1))
        out.append(token)
        llm.eval([token])
    lib.llama_sampler_free(chain)
    return out


if __name__ == "__main__":
    path, threads, extra = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    if path == "--many":
        print(json.dumps([_serve(m, threads, extra, r) for m, r in json.loads(sys.stdin.read())]))
    else:
        print(json.dumps(_serve(path, threads, extra, json.loads(sys.stdin.read()))))
