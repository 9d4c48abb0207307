"""Run a sweep's commands here, one after another, or hand its runs to a launcher in `launch/`.

Locally every step is a `scone-jax` subprocess (a crash or an out-of-memory in one run cannot
take the sweep down with it) whose output goes to SWEEP_DIR/logs/. With another launcher the
preparation steps (tokenize, count f-grams) still run here, then each run is submitted through
its `launch/` script; rerunning the sweep later skips the runs that have finished.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from scone_jax.data.text import resolve_corpus_files
from scone_jax.errors import UserError
from scone_jax.sweep.plan import Step, SweepPlan

LAUNCH_DIR = Path(__file__).resolve().parents[2] / "launch"
LAUNCHERS = ("local", "slurm", "tpu", "k8s")


def launcher_command(
    step: Step, launcher: str, sweep_name: str, launcher_args: list[str]
) -> list[str]:
    """The command that runs `step` with `launcher` (preparation steps always run here)."""
    if launcher == "local" or step.kind != "train":
        return ["scone-jax", *step.argv]
    job = f"{sweep_name}-{step.point}"
    if launcher == "slurm":
        return [str(LAUNCH_DIR / "slurm_submit.py"), *launcher_args, "--job-name", job, *step.argv]
    if launcher == "tpu":
        return [str(LAUNCH_DIR / "tpu_vm.sh"), *launcher_args, "--", *step.argv]
    if launcher == "k8s":
        name = re.sub(r"[^a-z0-9-]+", "-", job.lower()).strip("-")[:63].strip("-")
        return [str(LAUNCH_DIR / "k8s_jobset.py"), "--name", name, *launcher_args, *step.argv]
    raise UserError(f"--launcher {launcher!r} (expected one of {LAUNCHERS})")


def dry_run(plan: SweepPlan, launcher: str, launcher_args: list[str], print_fn=print) -> None:
    plan.check()
    print_fn(
        f"# sweep {plan.spec.name}: {len(plan.points)} points, {len(plan.steps)} commands, in "
        f"{plan.sweep_dir}"
    )
    for step in plan.steps:
        state = "done" if step.done else "todo"
        print_fn(f"# [{state}] {step.name}")
        if not step.done and (missing := _missing_corpus(step)):
            print_fn(f"# warning: this step would stop: {missing}")
        print_fn(shlex.join(launcher_command(step, launcher, plan.spec.name, launcher_args)))


def _missing_corpus(step: Step) -> str | None:
    """Why a tokenize step's corpus could not be read now (a path or glob that finds nothing),
    so a dry run shows it before a real run stops there; None when it is there."""
    if step.kind != "tokenize":
        return None
    corpus = [b for a, b in zip(step.argv, step.argv[1:]) if a == "--corpus"]
    if not corpus:
        return None  # the embedded corpus
    try:
        resolve_corpus_files(corpus)
    except UserError as e:
        return str(e)
    return None


def _run_logged(command: list[str], log: Path) -> int:
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "a", encoding="utf-8") as out:
        out.write(f"\n$ {shlex.join(command)}  # {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        out.flush()
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            return proc.wait()
        except BaseException:  # Ctrl-C / SIGTERM: let the run save its checkpoint, then go
            proc.terminate()
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
            raise


def _last_error(log: Path) -> str:
    lines = [
        ln.strip()
        for ln in log.read_text(encoding="utf-8", errors="replace").splitlines()
        if ln.strip()
    ]
    errors = [ln for ln in lines if "error" in ln.lower()]
    return (errors or lines or ["(no output)"])[-1][:300]


def _interrupt(signum, frame):
    # SIGTERM too must stop the running step (it checkpoints), not orphan it
    raise KeyboardInterrupt


def run(
    plan: SweepPlan, launcher: str = "local", launcher_args: list[str] | None = None, print_fn=print
) -> dict[str, int]:
    """Run every unfinished step in order; stops at the first failure with a one-line error."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _run_steps(plan, launcher, launcher_args or [], print_fn)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_steps(
    plan: SweepPlan, launcher: str, launcher_args: list[str], print_fn
) -> dict[str, int]:
    plan.write()
    logs = plan.sweep_dir / "logs"
    counts = {"skipped": 0, "ran": 0, "submitted": 0}
    for i, step in enumerate(plan.steps, 1):
        prefix = f"[{i}/{len(plan.steps)}] {step.name}"
        if step.done:
            counts["skipped"] += 1
            print_fn(f"{prefix}: done already, skipped")
            continue
        command = launcher_command(step, launcher, plan.spec.name, launcher_args)
        if command[0] == "scone-jax":
            command = [sys.executable, "-m", "scone_jax.cli.main", *command[1:]]
        start = time.perf_counter()
        print_fn(f"{prefix}: running (log {logs / step.log_name})")
        code = _run_logged(command, logs / step.log_name)
        if code != 0:
            raise UserError(
                f"sweep {plan.spec.name}: {step.name} failed with exit {code} "
                f"({_last_error(logs / step.log_name)}); see {logs / step.log_name}; "
                "rerun the sweep to resume"
            )
        submitted = launcher != "local" and step.kind == "train"
        counts["submitted" if submitted else "ran"] += 1
        print_fn(
            f"{prefix}: {'submitted' if submitted else 'done'} in "
            f"{time.perf_counter() - start:.0f} s"
        )
    return counts
