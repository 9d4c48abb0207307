"""Multi-process export: each process writes whole shards of its own, and the table is the one a
single process writes, bit for bit; the whole pipeline (train, stop, resume, export) on
2 processes x 4 devices matches 1 process x 8 devices.

Training reduces across processes through gloo, so the two runs agree to float rounding (the
tolerances below); an export computes each row on one process's devices with the same tensor
split and rows per device as the whole mesh, so tables of one checkpoint agree exactly.
"""

import json
import math
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.config import load_config
from scone_jax.export.table import assigned_ranges, export_table, row_ranges
from scone_jax.serve.tables import open_table
from scone_jax.train.loop import train
from scone_jax.train.session import open_session
from tests.conftest import make_dataset, markov_documents
from tests.multihost.helpers import Job, scone_job
from tests.train.helpers import losses, read_metrics, tiny_overrides

STEPS = 6
SCONE = {
    "fgrams.max_n": 4,
    "fgrams.num_fgrams": 3000,
    "fgrams.min_count": 2,
    "fgrams.n_layers": 1,
    "mesh.data": 2,
    "mesh.fsdp": 2,
    "mesh.tensor": 2,
    "checkpoint.every": 2,
}
RANGE_ROWS, SHARD_ROWS = 64, 256  # small enough that both processes get several shards
EXPORT = {"range_rows": RANGE_ROWS, "shard_rows": SHARD_ROWS, "progress": False}
EXPORT_FLAGS = ["--range-rows", str(RANGE_ROWS), "--shard-rows", str(SHARD_ROWS), "--no-progress"]
# seen over runs: losses within 2e-7 relative, params within 1e-5, tables within 2e-6 (rows up to
# ~3)
LOSS_RTOL = 2e-5
PARAM_ATOL, PARAM_RTOL = 1e-4, 1e-3
TABLE_ATOL = 1e-4


@pytest.mark.parametrize(
    "num_rows, range_rows, shard_rows, processes",
    [
        (1731, 64, 256, 2),
        (1731, 256, 512, 3),
        (100_000, 65536, 65536, 4),
        (5000, 300, 512, 2),
        (10, 64, 256, 8),
    ],
)
def test_processes_get_disjoint_whole_shards_that_cover_the_table(
    num_rows, range_rows, shard_rows, processes
):
    ranges = row_ranges(num_rows, range_rows)
    block = math.lcm(range_rows, shard_rows)
    shares = [assigned_ranges(ranges, block, p, processes) for p in range(processes)]
    assert sorted(r for share in shares for r in share) == ranges
    writers = {}  # shard index -> the processes writing into it
    for p, share in enumerate(shares):
        for a, b in share:
            for shard in range(a // shard_rows, (b - 1) // shard_rows + 1):
                writers.setdefault(shard, set()).add(p)
    assert all(len(w) == 1 for w in writers.values())
    if num_rows >= 2 * block:
        assert all(shares[:2])  # the work is spread


def wait_until(condition, job: Job, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert job.proc.poll() is None, f"job ended before {what}:\n{job.output[-3000:]}"
        try:
            if condition():
                return
        except (FileNotFoundError, ValueError):  # a file not yet (completely) written
            pass
        time.sleep(0.05)
    raise AssertionError(f"no {what}:\n{job.output[-3000:]}")


def stop_with_sigterm(job: Job) -> None:
    """launch/local.py passes SIGTERM on to every process."""
    job.proc.send_signal(signal.SIGTERM)
    assert job.finish(120) == 128 + signal.SIGTERM, job.output[-3000:]


def run_job(job: Job) -> Job:
    assert job.finish(300) == 0, job.output[-3000:]
    return job


def table_rows(url: Path) -> np.ndarray:
    table = open_table(str(url), "host")
    return table.gather(np.arange(table.num_rows))


def assert_same_table(a: Path, b: Path) -> None:
    np.testing.assert_array_equal(table_rows(a), table_rows(b))
    assert (
        json.loads((a / "meta.json").read_text())["checksum"]
        == json.loads((b / "meta.json").read_text())["checksum"]
    )


def final_params(run_dir: Path, session) -> list[np.ndarray]:
    ckpt = Checkpointer(run_dir / "checkpoints", 1, 10, False)
    state = ckpt.restore(session.setup.abstract_state, session.setup.shardings, STEPS)
    ckpt.close()
    return [np.asarray(jax.device_get(x)) for x in jax.tree.leaves(state["params"])]


def export_two_processes_failing_then_resumed(run_dir: Path, out: Path) -> None:
    """Process 1 fails at its second shard (shard 3: shards are dealt round-robin) where a directory
    stands in for the shard's file, after recording its first shard in its own progress file;
    process 0 stops too, and the rerun resumes from the ranges both recorded."""
    args = ["export", str(run_dir), "--out", str(out), *EXPORT_FLAGS]
    partial = Path(f"{out}.partial")
    blocker = partial / "rows" / "c" / "3" / "0"  # zarr3's key of shard 3
    job = scone_job(2, *args)
    wait_until(lambda: (partial / "rows" / "zarr.json").is_file(), job, "the rows array")
    blocker.mkdir(parents=True)  # long before process 1 has computed shard 1 (it compiles first)
    assert job.finish(300) != 0
    job.wait_for(r"^\[p1\] ValueError: .*Is a directory")
    job.wait_for(r"^\[p0\] scone-jax: process 1 of 2 failed \(ValueError: ")
    recorded = json.loads((partial / "progress.1.json").read_text())["done"]
    assert [(a, b) for a, b, _ in recorded] == row_ranges(2 * SHARD_ROWS, RANGE_ROWS)[
        SHARD_ROWS // RANGE_ROWS :
    ]
    assert not out.exists()
    blocker.rmdir()
    again = run_job(scone_job(2, *args))
    assert any(line.startswith(f"[p0] table {out}: ") for line in again.lines)
    assert not any(line.startswith("[p1] table") for line in again.lines)  # process 0 reports
    assert not partial.exists() and not list(out.glob("progress*"))


@pytest.mark.slow
def test_two_processes_train_resume_and_export_like_one_process(tmp_path, rng):
    dataset = make_dataset(tmp_path / "data", markov_documents(rng, 48, 60, 400), 48)
    single, multi = tmp_path / "single", tmp_path / "multi"
    single_cfg = load_config("tiny_scone", tiny_overrides(dataset.path, single, STEPS, **SCONE))
    assert len(jax.devices()) == 8
    train(single_cfg)

    train_args = ["train", "tiny_scone", *tiny_overrides(dataset.path, multi, STEPS, **SCONE)]
    job = scone_job(2, *train_args)
    wait_until(lambda: any(r["step"] >= 2 for r in read_metrics(multi)), job, "step 2")
    stop_with_sigterm(job)
    saved = max(int(p.name) for p in (multi / "checkpoints").iterdir() if p.name.isdigit())
    assert 2 <= saved < STEPS
    resumed = run_job(scone_job(2, *train_args))
    resumed.wait_for(rf"^\[p0\] run .*resuming at step {saved}$")

    a, b = losses(single), losses(multi)
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    np.testing.assert_allclose([b[s] for s in a], [a[s] for s in a], rtol=LOSS_RTOL)
    # the f-gram metrics describe the global batch, not process 0's rows
    for key in ("match_rate", "mean_match_length"):
        one, two = ({r["step"]: r[key] for r in read_metrics(run)} for run in (single, multi))
        np.testing.assert_allclose([two[s] for s in a], [one[s] for s in a], rtol=1e-6, err_msg=key)
    session = open_session(single_cfg, single)
    for x, y in zip(final_params(multi, session), final_params(single, session), strict=True):
        np.testing.assert_allclose(x, y, atol=PARAM_ATOL, rtol=PARAM_RTOL)

    for run_dir in (single, multi):
        export_table(run_dir, str(tmp_path / f"{run_dir.name}_1p"), **EXPORT)
    run_job(
        scone_job(2, "export", str(single), "--out", str(tmp_path / "single_2p"), *EXPORT_FLAGS)
    )
    export_two_processes_failing_then_resumed(multi, tmp_path / "multi_2p")
    assert_same_table(tmp_path / "single_2p", tmp_path / "single_1p")
    assert_same_table(tmp_path / "multi_2p", tmp_path / "multi_1p")
    np.testing.assert_allclose(
        table_rows(tmp_path / "multi_2p"), table_rows(tmp_path / "single_1p"), atol=TABLE_ATOL
    )
