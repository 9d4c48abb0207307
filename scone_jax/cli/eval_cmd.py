"""`scone-jax eval RUN_DIR [--dataset DIR ...]`."""

from __future__ import annotations

import json

from scone_jax.cli import distributed_args
from scone_jax.cli.step_arg import add_step_argument
from scone_jax.runtime import distributed


def register(sub) -> None:
    p = sub.add_parser(
        "eval",
        help="held-out perplexity and bits per byte of a run's checkpoint",
        description="Evaluate the latest (or --step) checkpoint of RUN_DIR on the run's held-out "
        "split and on any extra tokenized datasets (made with `scone-jax tokenize` and the run's "
        "tokenizer). With --table, the f-gram embeddings come from an exported table (in the "
        "--tier given) instead of the live f-gram model. Prints one line per eval set, and JSON "
        "with --json.",
    )
    p.add_argument("run_dir", help="a run directory made by `scone-jax train`")
    p.add_argument(
        "--dataset",
        action="append",
        default=[],
        metavar="DIR",
        help="an extra named eval set (a tokenized dataset directory); repeatable",
    )
    add_step_argument(p, "to evaluate")
    p.add_argument(
        "--table",
        default=None,
        metavar="URL",
        help="evaluate through the serving path with this exported f-gram table "
        "(default: the live f-gram model from the checkpoint)",
    )
    p.add_argument(
        "--tier",
        default=None,
        choices=("device", "host", "disk"),
        help="where the table lives during evaluation (with --table; default host)",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    distributed_args.add_cli_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.errors import UserError
    from scone_jax.evaluation.run import evaluate_run

    if args.tier and not args.table:
        raise UserError(
            f"--tier {args.tier} applies only with --table URL (without one the live f-gram "
            "model is evaluated, on the device)"
        )
    topology = distributed_args.initialize_from_args(args)
    with distributed.failures_reported(args.run_dir):
        out = evaluate_run(args.run_dir, args.dataset, args.step, args.table, args.tier or "host")
    if topology and topology.process_id != 0:
        return (
            0  # every process evaluates (restore and eval steps are collective); process 0 reports
        )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for name, r in out["results"].items():
        print(
            f"step {out['step']} {name}: loss {r['loss']:.4f}  perplexity {r['perplexity']:.3f}  "
            f"bits/byte {r['bits_per_byte']:.4f}  ({int(r['tokens']):,} tokens)"
        )
    return 0
