"""Where metrics go: stdout, `metrics.jsonl` and tensorboard, written by process 0 only.

On resume the JSONL log is cut back to the restored step, so it never has gaps or
duplicated steps.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import jax

from scone_jax.atomic import storage_errors


def _clean(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value  # numpy / jax scalars
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class MetricsWriter:
    def __init__(self, run_dir: str | os.PathLike, tensorboard: bool = True, print_fn=print):
        self.enabled = jax.process_index() == 0
        self.path = Path(run_dir) / "metrics.jsonl"
        self.print_fn = print_fn
        self._tb = None
        self._tb_dir = Path(run_dir) / "tensorboard" if tensorboard and self.enabled else None
        self._file = None

    def _tensorboard(self, purge_after: int | None = None):
        """The tensorboard writer, opened on first use; `purge_after`: a resume from that step,
        so tensorboard hides the later steps a killed run had logged (as `truncate_after` drops
        them from metrics.jsonl) instead of drawing them twice."""
        if self._tb is None and self._tb_dir is not None:
            from tensorboardX import SummaryWriter

            purge = purge_after + 1 if purge_after is not None else None
            # a file of its own even when a restart comes within the second (names hold seconds)
            unique = f".{time.time_ns()}"
            self._tb = SummaryWriter(str(self._tb_dir), purge_step=purge, filename_suffix=unique)
        return self._tb

    def truncate_after(self, step: int) -> None:
        """Drop records with step > `step` (left by a run that died after its last checkpoint),
        here and in tensorboard."""
        if not self.enabled:
            return
        self._tensorboard(purge_after=step)
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a torn last line from a killed process
            if record.get("step", 0) <= step:
                kept.append(line)
        tmp = self.path.with_suffix(".jsonl.tmp")
        with storage_errors(str(self.path)):
            tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
            os.replace(tmp, self.path)

    def write(
        self, step: int, metrics: dict[str, Any], kind: str = "train", echo: bool = True
    ) -> None:
        """Append one record to the JSONL log and tensorboard; also print it when `echo`."""
        if not self.enabled:
            return
        record = {"step": int(step), "kind": kind, **{k: _clean(v) for k, v in metrics.items()}}
        with storage_errors(str(self.path)):
            try:
                if self._file is None:
                    self.path.parent.mkdir(parents=True, exist_ok=True)
                    self._file = open(self.path, "a", encoding="utf-8")
                self._file.write(json.dumps(record) + "\n")
                self._file.flush()
            except OSError:  # a torn last line is dropped by truncate_after on resume
                file, self._file = self._file, None
                if file is not None:
                    with contextlib.suppress(
                        OSError
                    ):  # closes the file even when its flush fails again
                        file.close()
                raise
        if (tb := self._tensorboard()) is not None:
            for key, value in record.items():
                if isinstance(value, int | float) and key != "step":
                    tb.add_scalar(f"{kind}/{key}", value, step)
        if echo:
            shown = " ".join(
                f"{k}={_fmt(v)}" for k, v in record.items() if k not in ("step", "kind")
            )
            self.print_fn(f"[{kind} step {step}] {shown}")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
