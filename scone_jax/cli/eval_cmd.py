"""`scone-jax eval RUN_DIR [--dataset DIR ...]`."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="held-out perplexity and bits per byte of a run's checkpoint",
        description="Evaluate the latest (or --step) checkpoint of RUN_DIR on the run's held-out split "
        "and on any extra tokenized datasets (made with `scone-jax tokenize` and the run's tokenizer). "
        "Prints one line per eval set, and JSON with --json.",
    )
    p.add_argument("run_dir", help="a run directory made by `scone-jax train`")
    p.add_argument("--dataset", action="append", default=[], metavar="DIR",
                   help="an extra named eval set (a tokenized dataset directory); repeatable")
    p.add_argument("--step", type=int, default=None, help="checkpoint step to evaluate (default: latest)")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.train.loop import evaluate_run

    out = evaluate_run(args.run_dir, args.dataset, args.step)
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, r in out["results"].items():
        print(f"step {out['step']} {name}: loss {r['loss']:.4f}  perplexity {r['perplexity']:.3f}  "
              f"bits/byte {r['bits_per_byte']:.4f}  ({int(r['tokens']):,} tokens)")
    return 0
