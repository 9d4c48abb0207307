#!/usr/bin/env python3
"""Submit launch/slurm.sbatch: one scone-jax process per node (or --tasks-per-node), all its GPUs.

    launch/slurm_submit.py --nodes 4 --gpus-per-node 8 --partition gpu train CONFIG key=value ...
    launch/slurm_submit.py --nodes 1 --tasks-per-node 2 train CONFIG ...  # 2 processes, one node
    launch/slurm_submit.py --nodes 4 --dry-run train CONFIG ...   # print the sbatch and srun lines

The job gets this environment (sbatch exports it) and runs `--python` (default: $SCONE_PYTHON,
else the `python3` on the exported PATH, e.g. an activated venv on a shared filesystem).
Options go before the scone-jax arguments.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().with_name("slurm.sbatch")


def sbatch_command(args) -> list[str]:
    cmd = [
        "sbatch",
        f"--nodes={args.nodes}",
        f"--ntasks-per-node={args.tasks_per_node}",
        f"--job-name={args.job_name}",
    ]
    for flag, value in (
        ("--gpus-per-node", args.gpus_per_node),
        ("--partition", args.partition),
        ("--time", args.time),
        ("--account", args.account),
    ):
        if value:
            cmd.append(f"{flag}={value}")
    if args.requeue:
        cmd.append("--requeue")
    return [*cmd, *args.sbatch_arg, str(SCRIPT), *args.args]


def job_env(args) -> dict[str, str]:
    """The environment sbatch passes on to the job: this one, plus the interpreter if given."""
    return {**os.environ, **({"SCONE_PYTHON": args.python} if args.python else {})}


def srun_command(args) -> str:
    """The line slurm.sbatch runs on the allocation (asked from the script itself)."""
    env = {**job_env(args), "SCONE_DRY_RUN": "1"}
    out = subprocess.run(
        ["bash", str(SCRIPT), *args.args], env=env, check=True, capture_output=True, text=True
    )
    return out.stdout.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="launch/slurm_submit.py",
        description=__doc__.split("\n\n")[0],
        usage="%(prog)s [options] scone-jax-args ...",
    )
    parser.add_argument(
        "args", nargs=argparse.REMAINDER, help="scone-jax arguments (e.g. train CONFIG key=value)"
    )
    parser.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    parser.add_argument(
        "--tasks-per-node",
        type=int,
        default=1,
        help="scone-jax processes per node, each driving its share of the node's devices "
        "(default 1)",
    )
    parser.add_argument(
        "--python",
        default="",
        help="the interpreter the tasks run, on a path every node sees (sets SCONE_PYTHON)",
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=0, help="GPUs per node (default: the partition's)"
    )
    parser.add_argument("--partition", default="", help="SLURM partition")
    parser.add_argument("--time", default="", help="time limit, e.g. 12:00:00")
    parser.add_argument("--account", default="", help="SLURM account")
    parser.add_argument("--job-name", default="scone-jax")
    parser.add_argument(
        "--requeue", action="store_true", help="let SLURM requeue the job (it resumes)"
    )
    parser.add_argument(
        "--sbatch-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="one more sbatch argument, e.g. --sbatch-arg=--qos=high (repeatable)",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="print the sbatch and srun commands, submit nothing"
    )
    args = parser.parse_args(argv)
    if not args.args:
        parser.error("nothing to run: give scone-jax arguments (e.g. train CONFIG)")
    for flag in ("nodes", "tasks_per_node"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')}={getattr(args, flag)}; expected >= 1")
    cmd = sbatch_command(args)
    if args.dry_run:
        print(shlex.join([f"SCONE_PYTHON={args.python}", *cmd] if args.python else cmd))
        print(f"# on the allocation: {srun_command(args)}")
        return 0
    return subprocess.call(cmd, env=job_env(args))


if __name__ == "__main__":
    sys.exit(main())
