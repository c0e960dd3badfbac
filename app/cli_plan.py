"""`ggml-lens plan`: will it fit? The buffers llama.cpp makes for a model file and a context.

Prints the plan of engine/models/plan.py as llama.cpp logs the same buffers when it loads the
model and makes its context (its function names, its formats: MiB to two decimals), then the
compute buffer's worst graphs and the tensors it holds at its peak; `--json` every figure in
bytes. `--fit BYTES` is llama-fit-params for the host as its one device: the context it would set
(-c) to fit that much memory, and the largest context whose whole plan fits.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

MIB = 1024 * 1024
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def size_arg(text: str) -> int:
    """A size in bytes: 123, or with a binary unit: 512M, 8G, 8GiB, 1.5g."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text, re.IGNORECASE)
    if not m:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (bytes, or 512M, 8G, 8GiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def add_parser(sub, llama_context_flags) -> None:
    p = sub.add_parser("plan", help="the memory llama.cpp takes for a model and a context "
                       "(weights, KV cache, compute and output buffers), the weights unread")
    p.add_argument("model", metavar="MODEL.gguf")
    llama_context_flags(p)
    p.add_argument("-np", "--parallel", type=int, default=1, metavar="N",
                   help="sequences the context serves (only 1 is planned here)")
    p.add_argument("--json", action="store_true", help="every figure in bytes, as JSON")
    p.add_argument("--fit", type=size_arg, metavar="BYTES",
                   help="the memory there is (8G, 512M...): the context llama-fit-params sets")
    p.add_argument("--fit-target", type=int, default=1024, metavar="MiB",
                   help="with --fit, the memory left free (llama.cpp's -fitt; default: 1024)")
    p.add_argument("--fit-ctx", type=int, default=4096, metavar="N",
                   help="with --fit, the least context it goes down to (-fitc; default: 4096)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.models import ModelError
    from engine.models.params import ContextParams, ParamsError
    from engine.models.plan import fit, plan

    if args.parallel != 1:
        print(f"ggml-lens: -np {args.parallel}: only one sequence is planned (the engine's graphs "
              "serve one; several need llama.cpp's KV streams)", file=sys.stderr)
        return 2
    try:
        params = ContextParams(n_ctx=args.ctx_size, n_batch=args.batch_size,
                               n_ubatch=args.ubatch_size, flash_attn=args.flash_attn,
                               type_k=args.cache_type_k, type_v=args.cache_type_v,
                               no_repack=args.no_repack, swa_full=args.swa_full,
                               load_mode=args.load_mode)
        if args.fit is not None:
            return _fit(fit(args.model, args.fit, params, params.use_mmap,
                            args.fit_target * MIB, args.fit_ctx), args.json)
        p = plan(args.model, params)
    except (ModelError, ParamsError) as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"ggml-lens: cannot read {args.model}: {err.strerror}", file=sys.stderr)
        return 1
    print(json.dumps(p.to_json()) if args.json else "\n".join(plan_lines(p)))
    return 0


def plan_lines(p) -> list[str]:
    """The plan as llama.cpp's log lines (its formats), the graphs and the peak after them."""
    import numpy as np

    from engine.core.types import TYPE_TRAITS

    c, mib = p.context, lambda n: n / MIB  # noqa: E731
    mib32 = lambda n: float(np.float32(n) / np.float32(MIB))  # noqa: E731 - its size line's floats
    name = lambda t: TYPE_TRAITS[t].type_name  # noqa: E731
    out = [f"{p.path}: {p.arch}, n_ctx = {c.n_ctx}, n_batch = {c.n_batch}, n_ubatch = "
           f"{c.n_ubatch}, flash_attn = {'on' if c.flash_attn else 'off'}, type_k = "
           f"{name(c.type_k)}, type_v = {name(c.type_v)}"
           + (", swa_full" if c.swa_full else "") + (", -nr" if c.no_repack else "")
           + ("" if p.mmap else ", -lm none")]
    out += [f"load_tensors: {b.name:>12} model buffer size = {mib(b.size):8.2f} MiB"
            for b in p.model]
    out.append(f"llama_context: {'CPU':>10}  output buffer size = {mib(p.output):8.2f} MiB")
    iswa = len(p.caches) > 1
    for k in p.caches:
        if k.name == "RS":
            out.append(f"llama_memory_recurrent: {'CPU':>10} RS buffer size = "
                       f"{mib(k.size):8.2f} MiB")
            continue
        if iswa:
            out.append(f"llama_kv_cache_iswa: creating {k.name:>7} KV cache, size = "
                       f"{k.cells} cells")
        out.append(f"llama_kv_cache: {'CPU':>10} KV buffer size = {mib(k.size):8.2f} MiB")
        out.append(f"llama_kv_cache: size = {mib32(k.k_bytes + k.v_bytes):7.2f} MiB ({k.cells:6d} "
                   f"cells, {len(k.layers):3d} layers,  1/1 seqs), K ({name(k.type_k)}): "
                   f"{mib32(k.k_bytes):7.2f} MiB, V ({name(k.type_v)}): {mib32(k.v_bytes):7.2f} MiB")
    for g in p.graphs:
        out.append(f"graph_reserve: {g.what}: n_tokens = {g.n_tokens:4d}, n_outputs = "
                   f"{g.n_outputs:4d}, {g.n_nodes} nodes: {mib(g.size):8.2f} MiB")
    out.append(f"sched_reserve: {'CPU':>10} compute buffer size = {mib(p.compute):8.2f} MiB")
    out.append(f"total: {mib(p.total):.2f} MiB")
    if p.peak:
        out.append("the compute buffer at its peak holds:")
        out += [f"  {t.name:<24} {t.op:<14} {t.type:<5} {str(list(t.ne)):<26} "
                f"{mib(t.size):10.2f} MiB" for t in p.peak[:8]]
    return out


def _fit(f, as_json: bool) -> int:
    """llama-fit-params' output: `-c N` on stdout (with the ubatch), its reasoning on stderr."""
    if as_json:
        print(json.dumps({"n_ctx": f.n_ctx, "n_ubatch": f.n_ubatch, "largest": f.largest,
                          "free": f.free, "margin": f.margin, "used_max": f.used_max,
                          "used_min": f.used_min,
                          "plan": None if f.plan is None else f.plan.to_json()}))
        return 0 if f.n_ctx is not None else 1
    err = sys.stderr
    print(f"llama_params_fit: projected to use {f.used_max // MIB} MiB at the model's context "
          f"vs. {f.free // MIB} MiB, leaving at least {f.margin // MIB} MiB free", file=err)
    if f.used_min:
        print(f"llama_params_fit: {f.used_min // MIB} MiB at the minimum context", file=err)
    if f.largest is not None:
        print(f"largest context whose whole plan fits: {f.largest} (-ub {f.n_ubatch})", file=err)
    if f.n_ctx is None:
        print("llama_params_fit: was unable to fit model into system memory by reducing "
              "context, abort", file=err)
        return 1
    print(f"-c {f.n_ctx} -ub {f.n_ubatch}")
    return 0
