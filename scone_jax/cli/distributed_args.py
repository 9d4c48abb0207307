"""The multi-process flags of `train`, `export` and `eval`; absent flags fall back to the
environment."""

from __future__ import annotations

from argparse import SUPPRESS

from scone_jax.runtime.cluster import (
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_TIMEOUTS,
)
from scone_jax.runtime.distributed import Topology, initialize


def add_cli_arguments(parser) -> None:
    """--coordinator/--num-processes/--process-id/--peer-timeout; absent flags fall back to the
    environment."""
    g = parser.add_argument_group(
        "multi-process jobs (docs/launch.md); default: from the environment"
    )
    g.add_argument(
        "--coordinator",
        metavar="HOST:PORT",
        default=SUPPRESS,
        help=f"process 0's address and a free port (env {ENV_COORDINATOR})",
    )
    g.add_argument(
        "--num-processes",
        type=int,
        default=SUPPRESS,
        metavar="N",
        help=f"process count (env {ENV_NUM_PROCESSES})",
    )
    g.add_argument(
        "--process-id",
        type=int,
        default=SUPPRESS,
        metavar="I",
        help=f"this process, 0..N-1 (env {ENV_PROCESS_ID})",
    )
    g.add_argument(
        "--peer-timeout",
        type=float,
        default=SUPPRESS,
        metavar="S",
        help="stop when a peer is silent this long; 0 = no watchdog (env "
        f"{ENV_TIMEOUTS['peer_s']}, default 60)",
    )


def initialize_from_args(args) -> Topology | None:
    return initialize(
        getattr(args, "coordinator", None),
        getattr(args, "num_processes", None),
        getattr(args, "process_id", None),
        peer_timeout_s=getattr(args, "peer_timeout", None),
    )
