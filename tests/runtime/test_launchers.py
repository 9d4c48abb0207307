"""Every launcher's --dry-run shows the command it would run, and the environment it sets up is one
that `scone_jax.runtime.cluster.detect` turns into the intended job."""

import os
import shlex
import subprocess
import sys

import yaml

from scone_jax.runtime.cluster import Cluster, detect
from tests.multihost.helpers import LOCAL, REPO

LAUNCH = REPO / "launch"
TRAIN = ["train", "tiny", "run_dir=/shared/runs/a b", "train.steps=10"]


def run(*cmd, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_local_dry_run_prints_one_command_per_process():
    res = run(
        sys.executable,
        LOCAL,
        "--devices-per-process=2",
        "--port=12345",
        "--dry-run",
        "3",
        *TRAIN,
        env={"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x"},
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.strip().splitlines()
    assert len(lines) == 3
    for i, line in enumerate(lines):
        words = shlex.split(line)
        env = dict(w.split("=", 1) for w in words if "=" in w and w.split("=", 1)[0].isupper())
        assert env["JAX_PLATFORMS"] == "cpu"
        assert env["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=2"
        assert detect(env=env) == Cluster("127.0.0.1:12345", 3, i, "SCONE_* environment")
        assert words[len(env) :] == [sys.executable, "-m", "scone_jax.cli.main", *TRAIN]


def test_local_exits_with_the_first_failure_and_prefixes_output():
    script = (
        "import os, sys; i = os.environ['SCONE_PROCESS_ID']; print('hello from', i); "
        "sys.exit(3 if i == '1' else 0)"
    )
    res = run(sys.executable, LOCAL, "--command", "2", sys.executable, "-c", script)
    assert res.returncode == 3
    assert "[p0] hello from 0" in res.stdout and "[p1] hello from 1" in res.stdout
    assert "local.py: process 1 exited with status 3" in res.stderr
    ok = run(sys.executable, LOCAL, "--command", "2", sys.executable, "-c", "pass")
    assert ok.returncode == 0, ok.stderr
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    res = run(sys.executable, LOCAL, "--command", "1", sys.executable, "-c", killed)
    assert res.returncode == 128 + 9  # as a shell reports it
    assert "local.py: process 0 was killed by SIGKILL" in res.stderr


def test_slurm_submit_dry_run_prints_sbatch_and_srun():
    res = run(
        sys.executable,
        LAUNCH / "slurm_submit.py",
        "--nodes=4",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--time=12:00:00",
        "--requeue",
        "--dry-run",
        *TRAIN,
    )
    assert res.returncode == 0, res.stderr
    sbatch, srun = res.stdout.strip().splitlines()
    assert shlex.split(sbatch) == [
        "sbatch",
        "--nodes=4",
        "--ntasks-per-node=1",
        "--job-name=scone-jax",
        "--gpus-per-node=8",
        "--partition=gpu",
        "--time=12:00:00",
        "--requeue",
        str(LAUNCH / "slurm.sbatch"),
        *TRAIN,
    ]
    assert srun.startswith("# on the allocation: ")
    assert shlex.split(srun.removeprefix("# on the allocation: ")) == [
        "srun",
        "--kill-on-bad-exit=1",
        "python3",
        "-m",
        "scone_jax.cli.main",
        *TRAIN,
    ]


def test_slurm_submit_dry_run_with_tasks_per_node_and_an_interpreter():
    res = run(
        sys.executable,
        LAUNCH / "slurm_submit.py",
        "--nodes=1",
        "--tasks-per-node=2",
        "--python=/shared/venv/bin/python",
        "--dry-run",
        *TRAIN,
    )
    assert res.returncode == 0, res.stderr
    sbatch, srun = res.stdout.strip().splitlines()
    assert shlex.split(sbatch)[:4] == [
        "SCONE_PYTHON=/shared/venv/bin/python",
        "sbatch",
        "--nodes=1",
        "--ntasks-per-node=2",
    ]
    assert shlex.split(srun.removeprefix("# on the allocation: "))[2] == "/shared/venv/bin/python"
    bad = run(sys.executable, LAUNCH / "slurm_submit.py", "--tasks-per-node=0", *TRAIN)
    assert bad.returncode == 2 and "--tasks-per-node=0; expected >= 1" in bad.stderr


def test_slurm_batch_script_runs_one_task_per_node():
    res = run(
        "bash",
        LAUNCH / "slurm.sbatch",
        *TRAIN,
        env={"SCONE_DRY_RUN": "1", "SCONE_PYTHON": "/opt/py"},
    )
    assert res.returncode == 0, res.stderr
    assert shlex.split(res.stdout) == [  # srun takes the tasks per node from the allocation
        "srun",
        "--kill-on-bad-exit=1",
        "/opt/py",
        "-m",
        "scone_jax.cli.main",
        *TRAIN,
    ]
    directives = [
        line
        for line in (LAUNCH / "slurm.sbatch").read_text().splitlines()
        if line.startswith("#SBATCH")
    ]
    assert "#SBATCH --ntasks-per-node=1" in directives
    assert "#SBATCH --signal=B:USR1@120" in directives  # the time limit's early warning


def test_tpu_vm_dry_run_prints_the_gcloud_command():
    res = run(
        "bash",
        LAUNCH / "tpu_vm.sh",
        "--tpu",
        "v5p-64",
        "--zone",
        "us-east5-a",
        "--project",
        "p",
        "--env",
        "SCONE_PEER_TIMEOUT=120",
        "--dry-run",
        "--",
        *TRAIN,
    )
    assert res.returncode == 0, res.stderr
    words = shlex.split(res.stdout)
    assert words[:9] == [
        "gcloud",
        "compute",
        "tpus",
        "tpu-vm",
        "ssh",
        "v5p-64",
        "--zone=us-east5-a",
        "--project=p",
        "--worker=all",
    ]
    remote = shlex.split(words[9].removeprefix("--command="))
    assert remote == [
        "cd",
        "~/scone_jax",
        "&&",
        "env",
        "SCONE_DISTRIBUTED=auto",
        "SCONE_PEER_TIMEOUT=120",
        "python3",
        "-m",
        "scone_jax.cli.main",
        *TRAIN,
    ]
    assert detect(env={"SCONE_DISTRIBUTED": "auto"}).source.startswith("jax cluster detection")
    missing = run("bash", LAUNCH / "tpu_vm.sh", "--zone", "z", "--dry-run", "--", "train", "tiny")
    assert missing.returncode == 2 and "--tpu and --zone are required" in missing.stderr
    for option in ("--tpu", "--zone", "--env"):  # last, or followed by another option
        for args in ([option], [option, "--dry-run"]):
            lacking = run("bash", LAUNCH / "tpu_vm.sh", *args)
            assert lacking.returncode == 2, lacking.stderr
            assert lacking.stderr == f"tpu_vm.sh: {option} needs a value\n"
    usage = run("bash", LAUNCH / "tpu_vm.sh", "--help")
    assert usage.returncode == 0 and usage.stdout.splitlines()[-1].startswith("--dry-run prints")


def _jobset(*args):
    res = run(
        sys.executable,
        LAUNCH / "k8s_jobset.py",
        "--name",
        "run1",
        "--image",
        "reg/scone:1",
        *args,
        "--dry-run",
        *TRAIN,
    )
    assert res.returncode == 0, res.stderr
    doc = yaml.safe_load(res.stdout)
    job = doc["spec"]["replicatedJobs"][0]["template"]["spec"]
    return doc, job, job["template"]["spec"]


def test_k8s_jobset_for_a_gpu_pool():
    doc, job, pod = _jobset(
        "--hosts", "4", "--gpus-per-host", "8", "--pvc", "runs", "--peer-timeout", "90"
    )
    assert doc["kind"] == "JobSet" and doc["apiVersion"].startswith("jobset.x-k8s.io/")
    assert (
        doc["spec"]["failurePolicy"]["maxRestarts"] == 3
    )  # a failed pod restarts the set; it resumes
    assert (job["parallelism"], job["completions"], job["completionMode"]) == (4, 4, "Indexed")
    [container] = pod["containers"]
    assert container["command"] == ["python3", "-m", "scone_jax.cli.main", *TRAIN]
    assert container["image"] == "reg/scone:1" and container["resources"]["limits"] == {
        "nvidia.com/gpu": 8
    }
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert container["volumeMounts"][0]["mountPath"] == "/runs"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SCONE_PEER_TIMEOUT"] == "90"
    for index in range(4):  # what each pod makes of it, with the index Kubernetes sets
        assert detect(env={**env, "JOB_COMPLETION_INDEX": str(index)}) == Cluster(
            "run1-workers-0-0.run1:8476", 4, index, "Kubernetes indexed Job"
        )


def test_k8s_jobset_for_a_tpu_pool():
    _, job, pod = _jobset(
        "--hosts",
        "2",
        "--accelerator",
        "tpu",
        "--tpu-type",
        "tpu-v5p-slice",
        "--tpu-topology",
        "2x2x2",
        "--chips-per-host",
        "4",
    )
    assert job["parallelism"] == 2
    assert pod["nodeSelector"] == {
        "cloud.google.com/gke-tpu-accelerator": "tpu-v5p-slice",
        "cloud.google.com/gke-tpu-topology": "2x2x2",
    }
    assert pod["containers"][0]["resources"]["limits"] == {"google.com/tpu": 4}
    assert pod["hostNetwork"] is True
