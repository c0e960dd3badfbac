"""`ggml-lens perplexity`: llama-perplexity's perplexity and KL divergence, the same figures.

`ggml-lens perplexity FILE -f TEXT [-c N] [-b N] [--chunks N]` prints what llama-perplexity
prints: the running estimate after each chunk (`[1]12.3456,[2]...`) and `Final estimate: PPL =
x.xxxx +/- y.yyyyy`. With `--kl-divergence-base F` it also writes the base model's
log-probabilities to F in llama.cpp's format; with `--kl-divergence` it reads F (written by
either tool), runs FILE on the tokens F holds and prints the table of chunks and the statistics
(Mean PPL(Q), Mean KLD, its percentiles, dp, "Same top p"). -c is the chunk size (llama-perplexity's
n_ctx, default 512); the other context flags are llama-cli's, llama.cpp's default path unless
changed. `--json` prints the same figures as JSON. The numerics are engine/models/perplexity.py's;
this module reads the arguments, runs the chunks and prints.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

DEFAULT_CHUNK = 512  # llama-perplexity's n_ctx unless -c says otherwise


def add_perplexity_parser(sub, context_flags) -> None:
    p = sub.add_parser(
        "perplexity", help="llama-perplexity: a model's perplexity on a text, or its KL "
        "divergence from a base model's logits, the figures llama-perplexity prints",
        description="-c N is the chunk size (llama-perplexity's n_ctx, default 512); each chunk's "
                    "second half is scored.")
    p.add_argument("model", metavar="FILE", help="the GGUF model")
    p.add_argument("-f", "--file", dest="text_file", metavar="TEXT",
                   help="the text to score (not needed with --kl-divergence: the base file has "
                        "the tokens)")
    p.add_argument("--chunks", type=int, default=-1, metavar="N",
                   help="score at most N chunks (default: -1, all)")
    p.add_argument("--kl-divergence-base", "--save-all-logits", dest="logits_file", metavar="F",
                   help="the base logits file: written, or read with --kl-divergence")
    p.add_argument("--kl-divergence", action="store_true",
                   help="the KL divergence of FILE from the base logits of --kl-divergence-base")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    context_flags(p)
    p.set_defaults(func=run_perplexity, ctx_size=DEFAULT_CHUNK)


def _model(args: argparse.Namespace, n_ctx: int):
    """The model with llama-perplexity's context: one chunk's cells, batches of at most a chunk
    (several chunks in one batch are run one after another)."""
    from engine.models import load_model
    from engine.models.params import ContextParams

    return load_model(args.model, params=ContextParams(
        n_ctx=n_ctx, n_batch=min(args.batch_size, n_ctx), n_ubatch=args.ubatch_size,
        n_threads=args.threads, flash_attn=args.flash_attn, type_k=args.cache_type_k,
        type_v=args.cache_type_v, no_repack=args.no_repack, swa_full=args.swa_full,
        load_mode=args.load_mode))


def _bos(model) -> int | None:
    tok = getattr(model, "tokenizer", None)
    return tok.bos_id if tok is not None and getattr(tok, "add_bos", False) else None


def _scored_logits(model, ids: list[int], first: int):
    """One chunk from an empty cache: the logits of positions first .. n_ctx-2."""
    model.reset()
    return model.decode(ids).logits[first:len(ids) - 1]


def _check_batch(n_batch: int, n_ctx: int) -> None:
    from engine.models.perplexity import PerplexityError

    if not (n_batch < n_ctx or n_batch % n_ctx == 0):
        raise PerplexityError("GGML_ASSERT(n_batch < n_ctx || n_batch % n_ctx == 0) failed")


def _perplexity(args: argparse.Namespace, err) -> int:
    from engine.models.perplexity import base_rows, split_chunks, ppl_estimate, ppl_nll, \
        write_logits_header

    with open(args.text_file, "rb") as fh:
        text = fh.read()
    if text.endswith(b"\n"):  # as llama.cpp's -f reads a file
        text = text[:-1]
    _check_batch(args.batch_size, args.ctx_size)
    model = _model(args, args.ctx_size)
    print("perplexity: tokenizing the input ..", file=err)
    tokens = model.encode(text)
    c = split_chunks(len(tokens), args.ctx_size, args.chunks)
    n_seq = max(1, args.batch_size // c.n_ctx)
    print(f"perplexity: calculating perplexity over {c.n_chunk} chunks, n_ctx={c.n_ctx}, "
          f"batch_size={min(args.batch_size, n_seq * c.n_ctx)}, n_seq={n_seq}", file=err)
    out = open(args.logits_file, "wb") if args.logits_file else None
    bos, nll, nll2, count, running = _bos(model), 0.0, 0.0, 0, []
    try:
        if out:
            print(f"perplexity: saving all logits to {args.logits_file}", file=err)
            write_logits_header(out, c, model.hp.n_vocab, tokens)
        for i in range(c.n_chunk):
            t0 = time.perf_counter()
            logits = _scored_logits(model, c.chunk(tokens, i, bos), c.first)
            if out:
                v, rows = base_rows(logits, c.targets(tokens, i))
                out.write(rows.astype("<u2").tobytes())
            else:
                v = ppl_nll(logits, c.targets(tokens, i))
            for x in v.tolist():  # in token order (the tool: per thread, then the threads')
                nll += x
                nll2 += x * x
            count += c.n_scored
            running.append(math.exp(nll / count))
            if i == 0:
                print(f"perplexity: {time.perf_counter() - t0:.2f} seconds per pass", file=err)
            if not args.json:
                print(f"[{i + 1}]{running[-1]:.4f},", end="", flush=True)
    finally:
        if out:
            out.close()
    ppl, unc = ppl_estimate(nll, nll2, count)
    if args.json:
        print(json.dumps({"n_ctx": c.n_ctx, "n_chunk": c.n_chunk, "n_tokens": len(tokens),
                          "chunks": running, "ppl": ppl, "ppl_error": unc, "count": count}))
        return 0
    print()
    if unc is None:
        print("Unexpected negative standard deviation of log(prob)", file=err)
        return 0
    print(f"Final estimate: PPL = {ppl:.4f} +/- {unc:.5f}")
    return 0


def _kl_divergence(args: argparse.Namespace, err) -> int:
    from engine.models.perplexity import (KLD_TABLE_HEAD, KLDSums, PerplexityError,
                                          kld_chunk_figures, kld_chunk_line, kld_rows,
                                          kld_summary, kld_summary_lines, open_logits_file)

    if not args.logits_file:
        raise PerplexityError("you must provide a name of a file containing the log "
                              "probabilities of the base model")
    with open(args.logits_file, "rb") as fh:
        base = open_logits_file(fh, args.logits_file)
        c = base.chunks  # (the tool asserts nothing of -b here)
        model = _model(args, max(c.n_ctx, args.ctx_size))
        if base.n_vocab != model.hp.n_vocab:
            raise PerplexityError(f"inconsistent vocabulary ({base.n_vocab} vs "
                                  f"{model.hp.n_vocab})")
        print(f"kl_divergence: computing over {c.n_chunk} chunks, n_ctx={c.n_ctx}, "
              f"batch_size={args.batch_size}", file=err)
        bos, s, chunks = _bos(model), KLDSums(), []
        for i in range(c.n_chunk):
            logits = _scored_logits(model, c.chunk(base.tokens, i, bos), c.first)
            kld_rows(logits, base.chunk_rows(), c.targets(base.tokens, i), s)
            chunks.append(kld_chunk_figures(s))
            if not args.json:
                if i == 0:
                    print("\n" + KLD_TABLE_HEAD)
                print(kld_chunk_line(i + 1, chunks[-1]), flush=True)
    summary = kld_summary(s) if s.count >= 100 else None  # the tool's: no statistics below 100
    if args.json:
        print(json.dumps({"n_ctx": c.n_ctx, "n_chunk": c.n_chunk, "count": s.count,
                          "chunks": chunks, "summary": summary}))
        return 0
    print()
    for line in kld_summary_lines(summary) if summary else []:
        print(line)
    return 0


def run_perplexity(args: argparse.Namespace) -> int:
    from engine.models import ModelError
    from engine.models.params import ParamsError
    from engine.models.perplexity import PerplexityError

    err = sys.stderr
    if not args.kl_divergence and not args.text_file:
        print("ggml-lens perplexity: -f TEXT is required (or --kl-divergence)", file=err)
        return 1
    try:
        return (_kl_divergence if args.kl_divergence else _perplexity)(args, err)
    except (PerplexityError, ParamsError, ModelError, OSError) as e:
        print(f"ggml-lens perplexity: {e}", file=err)
        return 1
