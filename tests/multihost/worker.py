"""One process of a small multi-process job, started by `launch/local.py --command` in the tests.

Joins through `scone_jax.runtime.distributed.initialize()` (SCONE_* environment), then:
- `steps N`: N small collectives over all devices, then a normal exit;
- `data`: each process builds its BatchStream rows and all-gathers the window positions, to
  check they are disjoint and together equal the single-process batch;
- `fail-at K P`: collectives until step K, where process P raises (a Python failure);
- `hang`: collectives until killed from outside (the test kills one process);
- `runtime-error alone|others-die`: process 0 raises a runtime (XLA-like) error at step 10,
  alone or as the others die;
- `barrier-fail P`: process P fails while the others wait at a `distributed.barrier` (as they
  do while process 0 tokenizes the corpus);
- `barrier-hang P`: process P never comes to a `distributed.barrier` the others wait at (the
  test kills it there);
- `agreed-checkpoint RUN_DIR`: every process resolves the run's latest checkpoint, process 1
  seeing a step one interval newer (as when training commits one between two looks).
Prints `PID p PROCESS i` and `STEP k` lines so the test can tell where the job is.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

from scone_jax.cli.main import whole_lines
from scone_jax.runtime import distributed


class JaxRuntimeError(RuntimeError):
    """Named like jax's runtime error, which the watchdog treats as possibly caused by a lost
    peer."""


def collectives(
    steps: int | None,
    fail_at: int | None = None,
    fail_process: int | None = None,
    error: type[Exception] = RuntimeError,
    others_die: bool = False,
) -> None:
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = jax.make_mesh((jax.device_count(),), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    total = jax.jit(lambda x: x.sum(), out_shardings=NamedSharding(mesh, P()))
    local = np.ones(jax.local_device_count(), np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("d")), local)
    step = 0
    while steps is None or step < steps:
        step += 1
        if step == fail_at and jax.process_index() == fail_process:
            raise error(f"injected failure at step {step}")
        if step == fail_at and others_die:
            os._exit(9)  # dies without a word, like a killed process
        assert float(total(x)) == jax.device_count()
        print(f"STEP {step}", flush=True)
        time.sleep(0.05)


def data_split() -> None:
    """Real process indices: disjoint rows per process, union = the single-process batch."""
    import jax
    from jax.experimental import multihost_utils

    from scone_jax.data.dataset import TokenizedDataset
    from scone_jax.data.pipeline import BatchStream, WindowSource

    dataset = TokenizedDataset.open(sys.argv[2])
    source = WindowSource(dataset, np.arange(dataset.num_docs), 16)
    mine = BatchStream(
        source, 8, seed=3, process_index=jax.process_index(), process_count=jax.process_count()
    )
    whole = BatchStream(source, 8, seed=3)
    for step in range(4):
        rows = multihost_utils.process_allgather(
            mine.batch(step)["positions"]
        )  # [processes, B/P, T]
        starts = rows[:, :, 0]
        assert len(set(starts.ravel().tolist())) == starts.size, (
            "processes read overlapping windows"
        )
        np.testing.assert_array_equal(rows.reshape(8, -1), whole.batch(step)["positions"])
    print("DATA OK", flush=True)


def agreed_checkpoint(run_dir: str) -> None:
    import jax

    from scone_jax.artifacts import restore

    if jax.process_index() == 1:
        looked = restore.require_checkpoint(run_dir)
        restore.require_checkpoint = lambda *_: looked._replace(step=looked.step + 2)
    print(f"AGREED STEP {restore.agreed_checkpoint(run_dir).step}", flush=True)


def main() -> None:
    whole_lines(sys.stdout, sys.stderr)  # as `scone-jax` does: gloo writes to this stdout too
    topology = distributed.initialize()
    print(f"PID {os.getpid()} PROCESS {topology.process_id}", flush=True)
    mode = sys.argv[1]
    with distributed.failures_reported():
        if mode == "steps":
            collectives(int(sys.argv[2]))
        elif mode == "data":
            data_split()
        elif mode == "fail-at":
            collectives(None, int(sys.argv[2]), int(sys.argv[3]))
        elif mode == "hang":
            collectives(None)
        elif mode == "runtime-error":
            collectives(None, 10, 0, JaxRuntimeError, others_die=sys.argv[2] == "others-die")
        elif mode == "agreed-checkpoint":
            agreed_checkpoint(sys.argv[2])
        elif mode == "barrier-fail":
            if distributed.initialize().process_id == int(sys.argv[2]):
                time.sleep(1)
                raise RuntimeError("injected failure before the barrier")
            distributed.barrier("test")
        elif mode == "barrier-hang":
            if distributed.initialize().process_id == int(sys.argv[2]):
                print("HANGING", flush=True)
                time.sleep(600)
            distributed.barrier("test")
        else:
            raise SystemExit(f"unknown mode {mode}")
    print("DONE", flush=True)


if __name__ == "__main__":
    main()
