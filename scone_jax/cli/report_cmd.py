"""`scone-jax report SWEEP_DIR [--out DIR]`."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="gather a sweep's results into a CSV, a markdown table and plots",
        description="Read every point of a sweep directory (made by `scone-jax sweep`) and write "
        "results.csv, results.md and the plots (perplexity against the number of f-grams, the "
        "f-gram model size, K and accelerator-resident parameters, with the baselines marked) to "
        "--out. Unfinished points are listed as incomplete.",
    )
    p.add_argument("sweep_dir", metavar="SWEEP_DIR", help="a sweep directory")
    p.add_argument(
        "--out", default=None, metavar="DIR", help="report directory (default: SWEEP_DIR/report)"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.atomic import check_output_path, check_replaceable
    from scone_jax.errors import UserError
    from scone_jax.sweep.report import REPORT_KIND, REPORT_MARKER, write_report

    if args.out:
        check_output_path(args.out, "report directory --out")
        check_replaceable(args.out, True, REPORT_MARKER, REPORT_KIND)
    try:
        out = write_report(args.sweep_dir, args.out)
    except OSError as e:  # the report's directory could not be made or written
        raise UserError(f"cannot write the report: {e.strerror or e}") from None
    print((out / "results.md").read_text(encoding="utf-8"), end="")
    print(f"report written to {out}")
    return 0
