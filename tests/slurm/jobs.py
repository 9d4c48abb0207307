"""A scone-jax job submitted through launch/slurm_submit.py to a LocalCluster, and what the
tests read of it: its state from `scontrol`, its output file, its tasks' pids."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

from tests.multihost.helpers import process_environ
from tests.slurm.local_cluster import LocalCluster
from tests.train.helpers import read_metrics

REPO = Path(__file__).resolve().parents[2]
SUBMIT = REPO / "launch" / "slurm_submit.py"
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "SUSPENDED")


class SlurmJob:
    def __init__(self, cluster: LocalCluster, job_id: str, output: Path):
        self.cluster, self.id, self.output = cluster, job_id, output

    @classmethod
    def submit(
        cls,
        cluster: LocalCluster,
        scone_args: list[str],
        output: Path,
        env: dict[str, str],
        *options: str,
    ) -> SlurmJob:
        """`slurm_submit.py OPTIONS --python THIS_PYTHON SCONE_ARGS` from the repository, with
        the cluster's environment plus `env` (sbatch exports it to the job)."""
        out = subprocess.run(
            [sys.executable, str(SUBMIT), *options, f"--python={sys.executable}"]
            + ["--sbatch-arg=--parsable", f"--sbatch-arg=--output={output}", *scone_args],
            cwd=REPO,
            env={**cluster.env, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, f"slurm_submit.py failed: {out.stderr}"
        return cls(cluster, out.stdout.strip().split(";")[0], output)

    def field(self, name: str) -> str:
        """One field of `scontrol show job`, e.g. JobState, ExitCode, RunTime, Restarts."""
        shown = self.cluster.run("scontrol", "-o", "show", "job", self.id)
        m = re.search(rf"(?:^| ){name}=(\S*)", shown)
        assert m, f"no {name} in: {shown}"
        return m.group(1)

    def text(self, since: int = 0) -> str:
        try:
            return self.output.read_text()[since:]
        except FileNotFoundError:
            return ""

    def wait_done(self, timeout: float = 300) -> str:
        """Block until the job has ended; its final state."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.field("JobState")
            if state not in ACTIVE:
                return state
            time.sleep(0.5)
        raise AssertionError(
            f"job {self.id} still {state} after {timeout:g}s:\n{self.text()[-3000:]}"
        )

    def wait_for_step(self, run_dir: Path, step: int, timeout: float = 300) -> None:
        """Block until the run's metrics reach `step`, the job running all along."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if any(r["step"] >= step for r in read_metrics(run_dir)):
                    return
            except (FileNotFoundError, ValueError):
                pass
            state = self.field("JobState")
            assert state in ACTIVE, (
                f"job {self.id} ended ({state}) before step {step}:\n" + (self.text()[-3000:])
            )
            time.sleep(0.2)
        raise AssertionError(f"step {step} not reached in {timeout:g}s:\n{self.text()[-3000:]}")

    def wait_for_output(self, pattern: str, since: int = 0, timeout: float = 120) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := re.search(pattern, self.text(since), re.M):
                return m
            time.sleep(0.2)
        raise AssertionError(f"no line matching {pattern!r} in:\n{self.text(since)[-3000:]}")

    def task_pids(self) -> dict[int, int]:
        """{SLURM_PROCID: pid} of the job's scone-jax processes (its nodes are this machine)."""
        found = {}
        for entry in Path("/proc").iterdir():
            try:
                if not entry.name.isdigit():
                    continue
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                if argv[1:3] != [b"-m", b"scone_jax.cli.main"]:  # srun's own line holds it too
                    continue
                env = process_environ(entry)
            except (OSError, ValueError):
                continue
            if env.get("SLURM_JOB_ID") == self.id and "SLURM_PROCID" in env:
                found[int(env["SLURM_PROCID"])] = int(entry.name)
        return found
