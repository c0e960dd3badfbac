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
    uvicorn.run("app.main:create_app", factory=True, host=args.host, port=args.port)
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
    from engine.programs import PROGRAMS, trace_program

    if args.program not in PROGRAMS:
        print(f"ggml-lens: no walkthrough named '{args.program}'; there are: "
              + ", ".join(PROGRAMS), file=sys.stderr)
        return 2
    prog = PROGRAMS[args.program]
    # a walkthrough that reads a fixture reads it from the configured folder
    inputs = {"path": str(Settings.from_env().fixtures_dir / prog.reads)} if prog.reads else {}
    if args.eval_callback:  # run it (no recording), printing nodes as llama.cpp's callback does
        from engine.evaldump import eval_dump

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
        print(f"{indent}      {s.note}")
        for t in s.threads:
            print(f"{indent}      thread {t.ith}: {t.kind} {list(t.ranges)} {t.seconds * 1e6:.0f} us")
    for name, value in trace.outputs.items():
        text = str(value)
        print(f"{name} = {text if len(text) < 300 else text[:300] + ' ...'}")
    if args.accountant:
        from engine.accountant import account, format_account

        state = trace.state_at(len(trace.steps) - 1)
        for cid, ctx in state.contexts.items():
            if not ctx.freed:
                print(f"\ncontext {cid}: " + format_account(account(ctx)))
    return 0 if trace.error is None else 1


def _diff(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.evaldump import diff_dumps, parse_dump

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


def _generate(args: argparse.Namespace) -> int:
    from engine.models import ModelError, load_model

    try:
        prompt = [int(x) for x in args.tokens.split(",") if x.strip()]
    except ValueError:
        print(f"ggml-lens: --tokens wants comma-separated token ids, not '{args.tokens}'",
              file=sys.stderr)
        return 2
    try:
        model = load_model(args.model)
        if getattr(model, "generate", None) is None:
            raise ModelError(f"{args.model}: architecture '{model.file.arch}' does not generate "
                             "text; try 'ggml-lens embed'")
        out = model.generate(prompt, args.n, n_threads=args.threads)
    except ModelError as err:
        print(f"ggml-lens: {err}", file=sys.stderr)
        return 1
    print("prompt:    " + ",".join(str(i) for i in prompt))
    print("generated: " + ",".join(str(i) for i in out))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ggml-lens", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="start the web app")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--models", metavar="DIR", help="a folder of GGUF files the inspector "
                       "lists and opens in place (never copied)")
    serve.set_defaults(func=_serve)

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

    embed = sub.add_parser("embed", help="embed a text with a BERT GGUF model (e.g. MiniLM)")
    embed.add_argument("model", metavar="MODEL.gguf")
    embed.add_argument("text")
    embed.add_argument("--threads", type=int, default=1, help="threads for compute")
    embed.add_argument("--json", action="store_true", help="tokens, token_ids, embedding as JSON")
    embed.set_defaults(func=_embed)

    generate = sub.add_parser("generate", help="greedy next tokens from a LLaMA GGUF model")
    generate.add_argument("model", metavar="MODEL.gguf")
    generate.add_argument("--tokens", required=True, help="the prompt as token ids: 1,2,3")
    generate.add_argument("-n", type=int, default=5, help="how many tokens to generate")
    generate.add_argument("--threads", type=int, default=1, help="threads for compute")
    generate.set_defaults(func=_generate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
