"""``harness synth``: a random-weight GGUF at a real model shape."""

from __future__ import annotations

import sys
from pathlib import Path

from engine.errors import AnvilError


def add(sub) -> None:
    s = sub.add_parser("synth", help="write a random-weight GGUF at a real model shape")
    s.add_argument("--preset", required=True, help="e.g. tiny-llama, qwen3-8b, llama3-8b")
    s.add_argument("out", help="output .gguf path")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--vocab", help="GGUF to copy the tokenizer from (default: the preset's)")
    s.add_argument("--margin", action="store_true", help="report the median top-2 logit margin (NumPy engine)")
    s.set_defaults(func=run)


def run(args) -> int:
    from engine import synth
    from engine.atomic import check_writable

    from .. import catalog

    if args.preset not in synth.PRESETS:
        raise AnvilError(f"unknown preset '{args.preset}'; available: {', '.join(synth.PRESETS)}")
    preset = synth.PRESETS[args.preset]
    check_writable(args.out)  # before the vocabulary is fetched
    vocab = Path(args.vocab) if args.vocab else catalog.vocab_source(preset.vocab)
    info = synth.write_synthetic(preset, args.out, vocab_gguf=vocab, seed=args.seed,
                                 progress=lambda done, size: print(f"  {done / 1e9:.1f} of {size / 1e9:.1f} GB",
                                                                   file=sys.stderr, flush=True))
    print(f"wrote {info['path']}: {info['bytes'] / 1e6:.1f} MB, {info['n_params'] / 1e6:.1f}M params, "
          f"sha256 {info['sha256']}")
    if args.margin:
        _report_margin(Path(info["path"]))
    return 0


def _report_margin(path: Path) -> None:
    """Median top-2 logit margin of greedy decoding with the NumPy engine: the
    headroom a synthetic model leaves for numerical noise between engines."""
    import numpy as np

    import engine
    from engine.generate import greedy

    model = engine.load(path)
    margins = []
    for seed in range(3):
        prompt = np.random.default_rng(seed).integers(0, model.config.n_vocab, 8).tolist()
        for logits in greedy(model, prompt, 16, keep_logits=True).logits:
            top2 = np.partition(logits, -2)[-2:]
            margins.append(float(top2[1] - top2[0]))
    print(f"median top-2 logit margin over {len(margins)} greedy steps: {np.median(margins):.3f} "
          f"(min {min(margins):.3f})")
