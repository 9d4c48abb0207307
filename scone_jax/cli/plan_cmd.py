"""`scone-jax plan CONFIG [key=value ...] [--devices N] [--device-memory GIB] [--json]`."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from scone_jax.cli import DefaultsHelpFormatter
from scone_jax.cli.config_args import add_config_arguments
from scone_jax.config import load_config
from scone_jax.errors import UserError

DEFAULT_DEVICES = 8
MAX_DEVICES = 1 << 16  # beyond any real mesh (and within what XLA's device-count flag reads)
# set in the child process this command starts with N fake CPU devices, so it never recurses
CHILD_ENV = "SCONE_JAX_PLAN_CHILD"


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="compile a config's train step for N devices: per-device memory, FLOPs, compile time",
        description="Lower and compile CONFIG's real train step (the SCONE one too) for a mesh of "
        "N devices with abstract inputs (nothing the size of the model is allocated), and print "
        "per device the argument, output, temporary and peak bytes from XLA's memory analysis, "
        "the FLOPs per step from XLA's cost analysis beside our own count, the lowering and "
        "compile times, and whether the peak fits --device-memory. Runs on the machine's own "
        "accelerators when it has N of them, else on N fake CPU devices (in a subprocess).",
        formatter_class=DefaultsHelpFormatter,
    )
    add_config_arguments(p)
    p.add_argument(
        "--devices",
        type=int,
        default=None,
        help=f"devices to plan for (default: the config's train.devices, else {DEFAULT_DEVICES})",
    )
    p.add_argument(
        "--device-memory", type=float, default=80.0, metavar="GIB", help="memory per device"
    )
    p.add_argument("--json", action="store_true", help="print the plan as one JSON object")
    p.set_defaults(func=run)


def run(args) -> int:
    cfg = load_config(args.config, args.overrides)
    count = args.devices if args.devices is not None else cfg.train.devices or DEFAULT_DEVICES
    if not 0 < count <= MAX_DEVICES:
        given = f"--devices {count}" if args.devices is not None else f"train.devices={count}"
        raise UserError(f"plan {given} (expected 1..{MAX_DEVICES})")
    if not (math.isfinite(args.device_memory) and args.device_memory > 0):
        raise UserError(
            f"plan --device-memory {args.device_memory:g} (expected a finite size > 0 GiB)"
        )
    import jax

    devices = jax.devices()
    if len(devices) < count:
        if os.environ.get(CHILD_ENV):
            raise UserError(f"plan needs {count} devices and this process has {len(devices)}")
        return run_on_fake_devices(args, count)
    from scone_jax.train.plan import plan_text, plan_train_step

    plan = plan_train_step(cfg, devices[:count], args.device_memory)
    if devices[0].platform != "cpu":
        stats = devices[0].memory_stats() or {}
        if "bytes_limit" in stats:  # what this accelerator really has, beside the asked limit
            plan["device_bytes_limit"] = int(stats["bytes_limit"])
    print(json.dumps(plan) if args.json else plan_text(args.config, plan), flush=True)
    return 0


def run_on_fake_devices(args, count: int) -> int:
    """The same command in a fresh process with `count` fake CPU devices (XLA reads its device
    count once, when it starts)."""
    flags = os.environ.get("XLA_FLAGS", "").split()
    flags = [f for f in flags if not f.startswith("--xla_force_host_platform_device_count")]
    env = {
        **os.environ,
        CHILD_ENV: "1",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join([*flags, f"--xla_force_host_platform_device_count={count}"]),
    }
    argv = [sys.executable, "-m", "scone_jax.cli.main", "plan", *sys_args(args, count)]
    return subprocess.call(argv, env=env)


def sys_args(args, count: int) -> list[str]:
    out = [args.config, *args.overrides, "--devices", str(count)]
    out += ["--device-memory", repr(args.device_memory)]
    return out + (["--json"] if args.json else [])
