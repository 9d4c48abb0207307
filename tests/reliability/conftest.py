"""Shared artifacts for the fault-injection tests, and the tally printed at the end of the run."""

from __future__ import annotations

import numpy as np
import pytest

from scone_jax.export.table import export_table
from tests.reliability.faults import COMPILE_CACHE, TALLY
from tests.scone_run import train_scone_run


@pytest.fixture(scope="session", autouse=True)
def compile_cache(tmp_path_factory):
    """One JAX compilation cache for the processes these tests restart
    (`faulty_cli(compile_cache=True)`)."""
    COMPILE_CACHE[:] = [tmp_path_factory.mktemp("jax_compile_cache")]


@pytest.fixture(scope="session")
def scone_artifacts(tmp_path_factory):
    """A trained tiny SCONE run (checkpoints at steps 5 and 8), its dataset, f-gram set and an
    exported table. Read-only: tests damage copies."""
    root = tmp_path_factory.mktemp("scone_artifacts")
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"scone_artifacts seed: {seed}")
    run_dir = train_scone_run(root, seed=seed, steps=8)
    export_table(run_dir, str(root / "table"), progress=False, range_rows=500)
    return {
        "root": root,
        "run": run_dir,
        "dataset": root / "data",
        "fgrams": run_dir / "fgrams",
        "table": root / "table",
    }


def pytest_terminal_summary(terminalreporter):
    if TALLY:
        shown = ", ".join(f"{name} {count}" for name, count in sorted(TALLY.items()))
        terminalreporter.write_line(f"fault-injection tally: {shown}")
