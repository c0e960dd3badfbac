"""`ggml-lens quantize`: llama-quantize, the same file byte for byte, and why each tensor got its type.

`ggml-lens quantize [options] IN.gguf [OUT.gguf] TYPE [nthreads]` takes llama-quantize's
arguments (without OUT it writes ggml-model-TYPE.gguf beside IN, as llama-quantize does) and the
options that need no importance matrix. It prints what llama-quantize logs, tensor by tensor
(`[  12/ 236] blk.0.attn_v.weight - [...], type = f32, converting to q6_K .. size = ...`), each
followed by the rule that chose the type (engine/quants/mix.py), and the sizes at the end.
The work is engine/gguf/quantize.py's; this module only reads arguments and prints.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

MIB = 1024 * 1024


def add_quantize_parser(sub) -> None:
    from engine.quants.ftype import QUANT_OPTIONS

    names = ", ".join(o.name for o in QUANT_OPTIONS)
    p = sub.add_parser(
        "quantize", help="llama-quantize: a GGUF model in another file type (Q4_K_M, Q8_0, ...), "
        "the file byte for byte llama-quantize's, with why each tensor got its type",
        usage="ggml-lens quantize [options] IN.gguf [OUT.gguf] TYPE [nthreads]",
        description=f"TYPE is one of {names} (or its number). The types that need an importance "
                    "matrix are refused as llama-quantize refuses them without one.")
    p.add_argument("files", nargs="+", metavar="IN.gguf [OUT.gguf] TYPE [nthreads]")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow requantizing tensors that are already quantized (loses quality)")
    p.add_argument("--leave-output-tensor", action="store_true",
                   help="leave output.weight un(re)quantized")
    p.add_argument("--pure", action="store_true",
                   help="no mix: every tensor in the file type's default type")
    p.add_argument("--output-tensor-type", metavar="ggml_type", help="this type for output.weight")
    p.add_argument("--token-embedding-type", metavar="ggml_type",
                   help="this type for the token embeddings")
    p.add_argument("--dry-run", action="store_true",
                   help="show the types and the sizes without writing the file")
    p.add_argument("--imatrix", metavar="FILE", help=argparse.SUPPRESS)
    p.set_defaults(func=run_quantize)


def _type(text: str | None, flag: str):
    from engine.quants.ftype import parse_ggml_type

    if text is None:
        return None
    t = parse_ggml_type(text)
    if t is None:
        raise ValueError(f"{flag}: invalid ggml_type '{text}'")
    return t


def _arguments(files: list[str]):
    """llama-quantize's positional arguments: IN, then TYPE or OUT TYPE, then threads."""
    from engine.quants.ftype import parse_ftype

    if len(files) < 2:
        raise ValueError("bad arguments: IN.gguf [OUT.gguf] TYPE [nthreads]")
    inp, rest = files[0], files[1:]
    opt = parse_ftype(rest[0])
    if opt is not None:  # no OUT: ggml-model-TYPE.gguf beside IN
        out = os.path.join(os.path.dirname(inp), f"ggml-model-{opt.name}.gguf")
        rest = rest[1:]
    else:
        out, rest = rest[0], rest[1:]
        if not rest:
            raise ValueError("missing ftype")
        opt = parse_ftype(rest[0])
        if opt is None:
            raise ValueError(f"invalid ftype '{rest[0]}'")
        rest = rest[1:]
    if len(rest) > 1:
        raise ValueError(f"unexpected arguments: {' '.join(rest[1:])}")
    try:
        nthread = int(rest[0]) if rest else 0
    except ValueError:
        raise ValueError(f"invalid nthread '{rest[0]}'") from None
    return inp, out, opt, nthread


def _shape(ne) -> str:
    """llama_format_tensor_shape."""
    return ", ".join(f"{x:6}" for x in ne)


def run_quantize(args: argparse.Namespace) -> int:
    from engine.core.types import traits
    from engine.gguf.quantize import (QuantizeError, QuantizeParams, Stage, plan_quantize,
                                      write_quantized)
    from engine.gguf.reader import GGUFReader
    from engine.quants.ftype import COPY

    err = sys.stderr
    try:
        inp, out, opt, nthread = _arguments(args.files)
        if args.imatrix:
            raise ValueError("--imatrix: the engine does not implement importance matrices")
        params = QuantizeParams(
            opt.ftype, nthread, _type(args.output_tensor_type, "--output-tensor-type"),
            _type(args.token_embedding_type, "--token-embedding-type"), args.allow_requantize,
            not args.leave_output_tensor, opt.name == COPY, args.pure, args.dry_run)
    except ValueError as e:
        print(f"ggml-lens quantize: {e}", file=err)
        return 1
    if not args.dry_run and os.path.exists(out) and os.path.samefile(inp, out):
        print(f"ggml-lens quantize: error: input and output files are the same: '{inp}'", file=err)
        return 1
    verb = "calculating quantization size for" if args.dry_run else "quantizing"
    target = "" if args.dry_run else f" to '{out}'"
    print(f"main: {verb} '{inp}'{target} as {opt.name}", file=err)
    t_start = time.perf_counter()
    try:
        with GGUFReader(inp) as r:
            plan = plan_quantize(r, params, err.write)
            count = len(plan.tensors)

            def head(index: int, t) -> str:
                return (f"[{index:4}/{count:4}] {t.name:<36} - [{_shape(t.info.ne)}], "
                        f"type = {traits(t.info.type).type_name:>6}, ")

            def why(t) -> str:
                return f"{'':12}why: {t.why}"

            if args.dry_run:
                for index, t in enumerate(plan.tensors, 1):
                    size = (f"size = {t.info.nbytes / MIB:8.2f} MiB -> {t.new_size / MIB:8.2f} MiB "
                            f"({traits(t.new_type).type_name})" if t.converts
                            else f"size = {t.info.nbytes / MIB:8.3f} MiB")
                    print(head(index, t) + size, file=err)
                    print(why(t), file=err)
            else:
                tty = err.isatty()

                def progress(p) -> None:
                    t, line = p.tensor, head(p.index, p.tensor)
                    converting = f"{line}converting to {traits(t.new_type).type_name} .. "
                    if p.stage != Stage.DONE:  # a terminal sees the rows go by
                        if tty and t.converts:
                            print(f"\r{converting}{100 * p.rows_done // max(p.rows, 1):3}%",
                                  end="", file=err, flush=True)
                        return
                    if t.converts:
                        print(f"{chr(13) if tty else ''}{converting}size = "
                              f"{t.info.nbytes / MIB:8.2f} MiB -> {t.new_size / MIB:8.2f} MiB",
                              file=err)
                    else:
                        print(f"{line}size = {t.info.nbytes / MIB:8.3f} MiB", file=err)
                    print(why(t), file=err)

                write_quantized(r, plan, out, progress, nthread)
    except (QuantizeError, ValueError, OSError) as e:
        print(f"llama_model_quantize: failed to quantize: {e}", file=err)
        print(f"main: failed to quantize model from '{inp}'", file=err)
        return 1
    n = max(plan.n_elements, 1)
    print(f"llama_model_quantize_impl: model size  = {plan.size_org / MIB:8.2f} MiB "
          f"({plan.size_org * 8.0 / n:.2f} BPW)", file=err)
    print(f"llama_model_quantize_impl: quant size  = {plan.size_new / MIB:8.2f} MiB "
          f"({plan.size_new * 8.0 / n:.2f} BPW)", file=err)
    if plan.needs_imatrix:
        print("llama_model_quantize_impl: WARNING: dry run completed successfully, but actually "
              "completing this quantization will require an imatrix!", file=err)
    if plan.n_fallback:
        print(f"llama_model_quantize_impl: WARNING: {plan.n_fallback} of {count} tensor(s) "
              "required fallback quantization", file=err)
    print(f"\nmain: quantize time = {(time.perf_counter() - t_start) * 1000:8.2f} ms")
    return 0
