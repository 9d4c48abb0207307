"""`make bench`: run every `benchmarks/bench_*.py` and write BENCHMARKS.md.

Each benchmark module defines `run(quick: bool) -> str`, returning a markdown section whose
figures are ratios measured side by side in the same run (absolute times drift on shared
machines; ratios much less). `--only NAME` runs one; `--quick` shrinks sizes for a smoke run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import os
import platform
import sys
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent


def machine_line() -> str:
    import jax

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, jax {jax.__version__}, "
        f"devices: {', '.join(sorted({d.device_kind for d in jax.devices()}))}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", default="BENCHMARKS.md")
    parser.add_argument(
        "--only", action="append", default=[], help="run only bench_NAME (repeatable)"
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, for a smoke run")
    args = parser.parse_args()
    names = sorted(p.stem for p in BENCH_DIR.glob("bench_*.py"))
    if args.only:
        names = [n for n in names if n.removeprefix("bench_") in args.only or n in args.only]
    sections = []
    for name in names:
        print(f"== {name}", file=sys.stderr, flush=True)
        start = time.perf_counter()
        module = importlib.import_module(f"benchmarks.{name}")
        sections.append(module.run(quick=args.quick).rstrip() + "\n")
        print(f"   {name} took {time.perf_counter() - start:.0f}s", file=sys.stderr, flush=True)
    header = (
        "# Benchmarks\n\n"
        f"Written by `make bench` on {datetime.date.today().isoformat()} ({machine_line()}).\n"
        "Every figure that compares two things is a ratio measured side by side in this one run.\n"
    )
    Path(args.out).write_text(header + "\n" + "\n".join(sections), encoding="utf-8")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
