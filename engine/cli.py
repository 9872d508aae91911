"""``python -m engine``: generate tokens from a GGUF model, or benchmark it.

    python -m engine generate MODEL.gguf --prompt "The capital of France is" -n 32
    python -m engine generate MODEL.gguf --prompt-ids 1,504,3458 -n 32
    python -m engine bench MODEL.gguf [-p 512] [-n 128] [-r 5] [-d 0] [--json]
    python -m engine info [--json]
    python -m engine launches MODEL.gguf [--ctx N] [--resources] [--json]

``launches`` counts the kernels one CUDA decode step launches (the graph of a
step holds exactly these), on any machine: no GPU is used. ``--resources``
lists instead each distinct launch in order with what its block takes of an
H200's SM (registers and stack from the kernel compiled for sm_90) and how
many of its blocks fit beside the launch before: 0 means it cannot start
early (programmatic dependent launch) on an SM that launch fills.

``info`` is what a harness asks a build before measuring it: the engine's
build hash, version, kernel cache and the file of every engine module a run
imports, so it can check they all come from the build under test.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import AnvilError, count_int, positive_int, run_command


def _token_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids must be integers separated by commas or spaces, got {text!r}")
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids is empty")
    return ids


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description="Anvil inference engine")
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="greedy generation from prompt token ids")
    g.add_argument("model", help="path to a GGUF file")
    prompt = g.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="prompt text (tokenized with the model's own tokenizer)")
    prompt.add_argument("--prompt-ids", type=_token_ids, help="prompt token ids, e.g. 1,504,3458")
    g.add_argument("-n", "--n-predict", type=positive_int, default=32, help="tokens to generate (default 32)")
    g.add_argument("--ctx", type=positive_int, default=None, help="context length (default: min(4096, trained))")
    _backend_args(g)
    g.add_argument("--stop-at-eos", action="store_true", help="stop at the end-of-sequence token")
    g.add_argument("--json", action="store_true", help="print one JSON object instead of text")

    b = sub.add_parser("bench", help="llama-bench style pp/tg throughput")
    b.add_argument("model", help="path to a GGUF file")
    b.add_argument("-p", "--n-prompt", type=count_int, default=512, help="prefill test length (0 = skip; default 512)")
    b.add_argument("-n", "--n-gen", type=count_int, default=128, help="decode test length (0 = skip; default 128)")
    b.add_argument("-r", "--repetitions", type=positive_int, default=5, help="measured repetitions (default 5)")
    b.add_argument("-d", "--n-depth", type=count_int, default=0,
                   help="context tokens in the cache before each test, untimed (llama-bench's -d; default 0)")
    b.add_argument("--ctx", type=positive_int, default=None,
                   help="context length (default: min(4096, trained); with -d, the depth plus the test's length)")
    _backend_args(b)
    b.add_argument("--json", action="store_true", help="print the result record as JSON")

    i = sub.add_parser("info", help="this build: hash, version, kernel cache, module files")
    i.add_argument("--json", action="store_true", help="print one JSON object")

    n = sub.add_parser("launches", help="kernels per CUDA decode step, by kernel (no GPU needed)")
    n.add_argument("model", help="path to a GGUF file")
    n.add_argument("--ctx", type=positive_int, default=None, help="context length (default: min(4096, trained))")
    n.add_argument("--resources", action="store_true",
                   help="each distinct launch's registers, shared memory and blocks an SM, beside the one before "
                        "(compiles every kernel for sm_90)")
    n.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _backend_args(p) -> None:
    p.add_argument("--backend", choices=["auto", "cuda", "numpy"], default="auto",
                   help="auto (default): cuda when an NVIDIA GPU is usable and runs the model's architecture, "
                        "else numpy")
    p.add_argument("--eager", action="store_true", help="cuda: run decode without CUDA graphs")
    p.add_argument("--kv", choices=["f16", "f32"], default=None,
                   help="KV cache type (default: f16 on cuda and with --rounding cuda, else f32)")
    p.add_argument("--rounding", choices=["exact", "cuda"], default=None,
                   help="numpy: exact fp32 (default), or the CUDA engine's roundings (the faithful oracle)")
    p.add_argument("--ubatch", type=int, default=None, metavar="N",
                   help="cuda: a prompt's micro-batch in tokens (default 4096; NumPy's is 512)")


def _load(args):
    from .model import Model

    options = {} if args.ubatch is None else {"ubatch": args.ubatch}
    model = Model(args.model, n_ctx=args.ctx, backend=args.backend, eager=args.eager,
                  kv_f16=None if args.kv is None else args.kv == "f16", rounding=args.rounding, **options)
    args.backend = model.backend.name  # what "auto" chose
    if args.ubatch is not None and model.backend.ubatch != args.ubatch:  # NumPy's micro-batch is fixed
        raise AnvilError(f"--ubatch {args.ubatch}: the {args.backend} backend runs a prompt "
                         f"{model.backend.ubatch} tokens at a time (--ubatch is the cuda backend's)")
    return model


def cmd_generate(args) -> int:
    from .generate import greedy
    from .tokenizer import Tokenizer

    model = _load(args)
    # a file without tokenizer metadata still runs from token ids (printed as ids)
    tok = Tokenizer.from_gguf(model.gguf) if model.gguf.has_key("tokenizer.ggml.model") else None
    if args.prompt is not None and tok is None:
        raise AnvilError(f"{model.path}: no tokenizer (missing key 'tokenizer.ggml.model'): use --prompt-ids")
    prompt_ids = args.prompt_ids if args.prompt is None else tok.encode(args.prompt)

    streamed = [False]  # whether a line of text is open on stdout

    def show(t: int) -> None:  # stream the text; raw bytes so a UTF-8 character split over tokens prints whole
        sys.stdout.buffer.write(tok.piece(t, False) if tok else f"{t} ".encode())
        sys.stdout.flush()
        streamed[0] = True

    if not args.json and args.prompt is not None:
        print(args.prompt, end="", flush=True)
        streamed[0] = bool(args.prompt)
    try:
        out = greedy(model, prompt_ids, args.n_predict, stop_at_eos=args.stop_at_eos,
                     on_token=None if args.json else show)
    except BaseException:  # an error or Ctrl-C ends the streamed line: its message starts on a fresh one
        if streamed[0]:
            print(flush=True)
        raise
    if args.json:
        print(json.dumps({"model": str(args.model), "backend": args.backend, "prompt_ids": out.prompt_ids,
                          "tokens": out.tokens, "text": tok.decode(out.tokens) if tok else None,
                          "prefill_tok_s": out.prefill_tok_s, "decode_tok_s": out.decode_tok_s}))
    else:
        print()
        print(f"tokens: {' '.join(map(str, out.tokens))}", file=sys.stderr)
        print(f"prefill: {len(out.prompt_ids)} tokens in {out.prefill_s * 1e3:.1f} ms ({out.prefill_tok_s:.1f} tok/s); "
              f"decode: {len(out.tokens)} tokens, {out.decode_tok_s:.1f} tok/s [{args.backend}]", file=sys.stderr)
    return 0


def cmd_bench(args) -> int:
    from .bench import bench, bench_ctx, format_table

    if not (args.n_prompt or args.n_gen):
        raise AnvilError("nothing to measure: -p/--n-prompt and -n/--n-gen are both 0")
    if args.ctx is None:
        args.ctx = bench_ctx(args.n_depth, args.n_prompt, args.n_gen)
    model = _load(args)
    for flag, n in (("-p/--n-prompt", args.n_prompt), ("-n/--n-gen", args.n_gen)):
        if args.n_depth + n > model.n_ctx:
            depth = f" at depth {args.n_depth}" if args.n_depth else ""
            raise AnvilError(f"{flag} {n}{depth} exceeds the context of {model.n_ctx} (--ctx)")
    rec = bench(model, n_prompt=args.n_prompt, n_gen=args.n_gen, reps=args.repetitions, depth=args.n_depth,
                progress=None if args.json else lambda t, v: print(f"  {t}: {v:.2f} t/s", file=sys.stderr))
    print(json.dumps(rec, indent=1) if args.json else format_table(rec))
    return 0


# What a run (generate or bench, on either backend) imports: loaded by
# ``info`` so a build that lacks one fails its probe, before any measurement.
RUN_MODULES = ("engine.model", "engine.generate", "engine.bench", "engine.tokenizer", "engine.backends.numpy",
               "engine.backends.cuda", "engine.backends.cuda.compile", "engine.backends.cuda.device")


def build_info() -> dict:
    import importlib
    import platform

    from . import __version__
    from .backends.cuda.compile import cache_dir
    from .bench import build_hash

    for name in RUN_MODULES:
        importlib.import_module(name)
    modules = {name: getattr(m, "__file__", None) for name, m in sorted(sys.modules.items())
               if name == "engine" or name.startswith("engine.")}
    return {"engine_file": modules["engine"], "build": build_hash(), "version": __version__,
            "cache_dir": str(cache_dir()), "python": platform.python_version(), "modules": modules}


def cmd_info(args) -> int:
    info = build_info()
    if args.json:
        print(json.dumps(info))
    else:
        print(f"anvil engine {info['version']}, build {info['build']} ({info['engine_file']})\n"
              f"kernel cache: {info['cache_dir']}\npython {info['python']}, {len(info['modules'])} engine modules")
    return 0


def cmd_launches(args) -> int:
    from .backends.cuda.recording import decode_launches, decode_residency

    if args.resources:
        rows = decode_residency(args.model, n_ctx=args.ctx)
        if args.json:
            print(json.dumps({"model": str(args.model), "launches": rows}))
            return 0
        print(f"{args.model}: a decode step's distinct launches on an H200 (sm_90 cubins), in order")
        print("| launch | after | a step | threads | registers | stack bytes | shared KB | blocks an SM "
              "| beside the launch before |")
        print("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            print(f"| {r['launch']} | {r['after'] or ''} | {r['count']} | {r['threads']} | {r['registers']} | "
                  f"{r['local_bytes']} | {r['shared'] / 1024:.1f} | {r['blocks_per_sm']} | {r['beside_before']} |")
        return 0
    counts, n_layer = decode_launches(args.model, n_ctx=args.ctx)
    total = sum(counts.values())
    if args.json:
        print(json.dumps({"model": str(args.model), "launches_per_token": total, "n_layer": n_layer,
                          "kernels": dict(counts.most_common())}))
    else:
        print(f"{args.model}: {total} kernel launches per decode step "
              f"({n_layer} layers, {total / n_layer:.1f} a layer)")
        for name, k in counts.most_common():
            print(f"  {k:5d}  {name}")
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    commands = {"generate": cmd_generate, "bench": cmd_bench, "info": cmd_info, "launches": cmd_launches}
    return run_command(commands[args.command], args)


if __name__ == "__main__":
    sys.exit(main())
