"""Which Beam runner a pipeline gets, chosen explicitly and never one that downloads itself.

Beam's default `DirectRunner` first tries the Prism runner, which it downloads (on a machine
without network that can hang), and `FlinkRunner` / `SparkRunner` / `PrismRunner` fetch a job
server jar or binary unless given a local one or a running job service. Those are refused with
one line naming the way out. The default is Beam's FnApi runner, the portable engine that the
DirectRunner falls back to: the driver runs the stages and the shuffle, and with N > 1 workers
the DoFns run in N SDK-harness processes that talk to it over the Fn API (control, data and
state over gRPC, side inputs included), as Flink's, Spark's and Dataflow's workers do.
"""

from __future__ import annotations

import contextlib
import io
import os

from apache_beam.options.pipeline_options import (
    FlinkRunnerOptions,
    PipelineOptions,
    PortableOptions,
    PrismRunnerOptions,
    SparkRunnerOptions,
    StandardOptions,
)
from apache_beam.runners.runner import create_runner

from scone_jax.errors import UserError

_DIRECT = {"directrunner", "switchingdirectrunner", "testdirectrunner"}
_FIX = "--runner=FnApiRunner (--direct_num_workers=N --direct_running_mode=multi_processing)"


def local_args(workers: int) -> list[str]:
    """The FnApi runner on this machine: in the driver for one worker, else that many SDK
    worker processes."""
    if workers <= 1:
        return ["--runner=FnApiRunner"]
    return [
        "--runner=FnApiRunner",
        "--direct_running_mode=multi_processing",
        f"--direct_num_workers={workers}",
    ]


def pipeline_options(args: list[str] | None, workers: int | None = None) -> PipelineOptions:
    """Options for `args` (default: `local_args` with `workers`, else every core), refused
    with one line when the runner would download something first."""
    args = list(args) if args else local_args(workers or os.cpu_count() or 1)
    options = PipelineOptions(args)
    usage = io.StringIO()
    try:
        with contextlib.redirect_stderr(usage):  # Beam's argparse prints its whole usage
            options.get_all_options()
    except SystemExit:
        errors = [line for line in usage.getvalue().splitlines() if "error:" in line]
        why = errors[-1].split("error:", 1)[1].strip() if errors else "could not be parsed"
        raise UserError(f"--beam-options {' '.join(args)!r}: {why}") from None
    check_offline(options)
    given = options.view_as(StandardOptions).runner
    if given:
        try:
            create_runner(given)
        except ValueError:
            raise UserError(
                f"--runner={given} is not a Beam runner (expected e.g. FnApiRunner, "
                "DataflowRunner, FlinkRunner, SparkRunner, PortableRunner, or a PipelineRunner "
                "subclass's qualified name)"
            ) from None
        except ImportError as e:  # a runner whose extra is not installed
            raise UserError(f"--runner={given}: {e}") from None
    return options


def runner_name(options: PipelineOptions) -> str:
    """The runner's class name, lower case with the 'runner' suffix ('flink' -> 'flinkrunner')."""
    name = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1].lower()
    return name if name.endswith("runner") else name + "runner"


def check_offline(options: PipelineOptions) -> None:
    name = runner_name(options)
    given = options.view_as(StandardOptions).runner
    if name in _DIRECT:
        what = f"--runner={given}" if given else "no --runner (Beam picks DirectRunner)"
        raise UserError(
            f"{what}: the DirectRunner first tries to download the Prism runner; use {_FIX} "
            "or a cluster runner"
        )
    if name == "prismrunner" and not _local_path(
        options.view_as(PrismRunnerOptions).prism_location
    ):
        raise UserError(
            "--runner=PrismRunner downloads its binary; give --prism_location=PATH of a local "
            f"prism binary, or use {_FIX}"
        )
    if options.view_as(PortableOptions).job_endpoint:
        return
    jar = {
        "flinkrunner": ("--flink_job_server_jar", FlinkRunnerOptions, "flink_job_server_jar"),
        "sparkrunner": ("--spark_job_server_jar", SparkRunnerOptions, "spark_job_server_jar"),
    }.get(name)
    if jar and not _local_path(getattr(options.view_as(jar[1]), jar[2])):
        raise UserError(
            f"--runner={given} downloads a job server jar; give {jar[0]}=PATH of a local copy "
            "or --job_endpoint=HOST:PORT of a running job server"
        )


def _local_path(location: str | None) -> bool:
    return bool(location) and "://" not in location
