"""`scone-jax sweep SWEEP.yaml [--dry-run] [--launcher local|slurm|tpu|k8s]`."""

from __future__ import annotations

import shlex

from scone_jax.cli import DefaultsHelpFormatter


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid or list of training runs from a sweep file",
        description="Expand SWEEP (a sweep YAML file, or a name in experiments/sweeps/) into one "
        "run directory per point under --out, prepare the shared data once (tokenize, count each "
        "f-gram set on the training split), then train every point. Finished points are skipped "
        "and a killed point resumes from its last checkpoint when the same command is rerun. "
        "--dry-run prints every command. Then `scone-jax report OUT` gathers the results. See "
        "docs/sweeps.md.",
        formatter_class=DefaultsHelpFormatter,
    )
    p.add_argument("sweep", help="sweep YAML file or a name in experiments/sweeps/")
    p.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="config overrides applied to every point, after the sweep's own",
    )
    p.add_argument(
        "--out", default=None, metavar="DIR", help="sweep directory (default: runs/sweeps/<name>)"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print every command; run and write nothing"
    )
    p.add_argument(
        "--launcher",
        default="local",
        choices=("local", "slurm", "tpu", "k8s"),
        help="local: run the points here one after another; slurm/tpu/k8s: prepare the data here, "
        "then submit each point through the launch/ script",
    )
    p.add_argument(
        "--launcher-args",
        default="",
        metavar="'ARGS'",
        help="options for the launch/ script as one quoted string, e.g. "
        "--launcher-args='--nodes 4 --gpus-per-node 8 --partition gpu'",
    )
    p.add_argument(
        "--report", action="store_true", help="write the report (scone-jax report) when done"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from pathlib import Path

    from scone_jax.artifacts.lock import writing
    from scone_jax.atomic import check_output_path
    from scone_jax.sweep.plan import plan_sweep
    from scone_jax.sweep.report import write_report
    from scone_jax.sweep.runner import dry_run
    from scone_jax.sweep.runner import run as run_sweep
    from scone_jax.sweep.spec import load_sweep

    spec = load_sweep(args.sweep)
    out = Path(args.out) if args.out else Path("runs") / "sweeps" / spec.name
    check_output_path(out, "sweep directory --out")
    launcher_args = shlex.split(args.launcher_args)
    if launcher_args and args.launcher == "local":
        from scone_jax.errors import UserError

        raise UserError(
            f"--launcher-args={args.launcher_args!r} with the local launcher, which takes none "
            "(expected --launcher slurm, tpu or k8s)"
        )
    if args.dry_run:
        dry_run(plan_sweep(spec, out, args.overrides), args.launcher, launcher_args)
        return 0
    with writing([("sweep directory --out", out)], args.command_line):
        counts = run_sweep(plan_sweep(spec, out, args.overrides), args.launcher, launcher_args)
        print(
            f"sweep {spec.name}: {counts['ran']} commands run, {counts['submitted']} runs "
            f"submitted, {counts['skipped']} already done; results in {out}"
        )
        if args.report:
            print(f"report: {write_report(out)}")
    return 0
