"""Dry runs of docs/beam.md's recipes (Dataflow, Flink, Spark, local), without a cluster: each
command parses, its Beam options are all known to this Beam and pass the offline check, and the
pipeline graph builds and serializes with them. And what a worker imports is what the docs say
a worker image needs."""

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

beam = pytest.importorskip("apache_beam")

from apache_beam.options.pipeline_options import PipelineOptions  # noqa: E402
from apache_beam.runners.runner import PipelineRunner  # noqa: E402

from scone_jax.cli.main import build_parser  # noqa: E402
from scone_jax.fgrams.beam import build_pipeline  # noqa: E402
from scone_jax.fgrams.beam_dataset import DatasetRef  # noqa: E402
from scone_jax.fgrams.beam_runner import check_offline, pipeline_options, runner_name  # noqa: E402

from ..conftest import make_dataset  # noqa: E402

DOC = Path(__file__).resolve().parents[2] / "docs" / "beam.md"


def recipes() -> list[list[str]]:
    """The `scone-jax fgrams build ...` commands of the doc's bash blocks, as argv lists."""
    out = []
    for block in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S):
        for command in block.replace("\\\n", " ").splitlines():
            if command.startswith("scone-jax fgrams build") and "--backend beam" in command:
                out.append(shlex.split(command)[1:])
    return out


def test_the_doc_has_a_recipe_per_runner():
    runners = set()
    for argv in recipes():
        args = build_parser().parse_args(argv)
        if args.beam_options and "..." not in args.beam_options:
            runners.add(runner_name(PipelineOptions(shlex.split(args.beam_options))))
    assert {"dataflowrunner", "flinkrunner", "sparkrunner"} <= runners


@pytest.mark.parametrize("argv", recipes(), ids=lambda argv: " ".join(argv)[-60:])
def test_recipe_dry_run(argv, tmp_path, rng):
    args = build_parser().parse_args(argv)
    assert args.backend == "beam"
    if args.beam_options is None:  # the local FnApi runner with --workers processes
        options = pipeline_options(None, args.workers)
    elif "..." in args.beam_options:  # "check on something small first": elided on purpose
        return
    else:
        beam_args = shlex.split(args.beam_options)
        options = PipelineOptions(beam_args)
        known = set(options.get_all_options())
        unknown = set(options.get_all_options(retain_unknown_options=True)) - known
        assert not unknown, f"options Beam does not know: {sorted(unknown)}"
        check_offline(options)
        assert "://" in args.beam_dataset and "://" in args.beam_work_dir
    docs = [rng.integers(0, 9, int(rng.integers(0, 300))) for _ in range(6)]
    ds = DatasetRef(str(make_dataset(tmp_path / "ds", docs, 9).path))  # stands in for the copy
    p = beam.Pipeline(runner=PipelineRunner(), options=options)
    out = args.beam_work_dir or str(tmp_path / "out")
    build_pipeline(p, ds, args.max_n, args.min_count, args.num_fgrams, out, 9, run="dry")
    assert p.to_runner_api().components.transforms  # the graph serializes, DoFns pickled


def _new_third_party_modules(imports: str) -> tuple[set[str], list[str]]:
    """(top-level third-party packages, all modules) that `imports` loads in a fresh
    interpreter already holding apache_beam and numpy."""
    code = (
        "import sys, apache_beam, numpy\n"
        "before = set(sys.modules)\n"
        f"{imports}\n"
        "print('\\n'.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    return {m.split(".")[0] for m in out} - set(sys.stdlib_module_names), out


def test_a_worker_imports_only_what_the_worker_image_holds():
    third_party, out = _new_third_party_modules("import scone_jax.fgrams.beam")
    # numba imports some packages (scipy, cffi, yaml, ...) only where they are installed
    optional, _ = _new_third_party_modules("import numba\nnumba.njit(lambda x: x + 1)(1)")
    needed = {"scone_jax", "tqdm", "numba", "llvmlite"}
    assert needed <= third_party and third_party - needed <= optional | {"numpy"}, third_party
    allowed = ("scone_jax.fgrams", "scone_jax.errors", "scone_jax.progress", "scone_jax.atomic")
    ours = [m for m in out if m.startswith("scone_jax.")]
    assert all(m.startswith(allowed + ("scone_jax.checksums",)) for m in ours), ours
