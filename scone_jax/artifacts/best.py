"""checkpoint.keep_best: the parameters of the lowest loss so far on one eval set, kept in
RUN_DIR/best_checkpoint/ beside the last-K checkpoints, so a run trained past its best held-out
point still has that point to evaluate and export (`--step best`).

Every eval that improves on the best saves a checkpoint there (orbax keeps one). The losses that
chose them are recorded in RUN_DIR/best_checkpoint.json, written by process 0 before each save
starts, so that a resumed run knows the committed best's loss: the record's loss for the step
orbax holds (a record whose save never committed is ignored). A regular checkpoint at step R
is started only once every best at or before R has committed, so a run resumed from R replays
exactly the evals whose bests may be missing, bit for bit, and keeps the same best as an
uninterrupted one; every process reads the same record (run directories are shared, as orbax
requires) and so takes the same decisions, each save being collective. A resume that measures
the loss otherwise (another eval set, or another train.eval_batches) starts the best afresh:
its losses are not comparable with the record's.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax

from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.run_dir import BEST_RECORD_FILE, best_checkpoint_dir
from scone_jax.atomic import atomic_write_json
from scone_jax.errors import UserError


class BestCheckpoint:
    def __init__(
        self,
        run_dir: str | Path,
        eval_set: str,
        eval_sets,
        eval_batches: int,
        async_save: bool = True,
    ):
        if eval_set not in eval_sets:
            raise UserError(
                f"checkpoint.keep_best={eval_set} is not an eval set of this run (expected one "
                f"of: {', '.join(sorted(eval_sets)) or 'none: set data.eval_fraction > 0'})"
            )
        self.eval_set = eval_set
        self.eval_batches = eval_batches
        self.record_path = Path(run_dir) / BEST_RECORD_FILE
        self.ckpt = Checkpointer(
            best_checkpoint_dir(run_dir), every=1, keep=1, async_save=async_save
        )
        kept = self.ckpt.latest_step()
        record = self._read_record() if kept is not None else {}
        # step -> eval loss of each committed best; a later entry's save never committed, and
        # the resumed run replays its eval
        self.losses = {s: v for s, v in record.items() if s <= kept}
        self.best_loss = self.losses.get(kept, math.inf)

    def offer(self, step: int, results: dict[str, dict[str, float]], state) -> bool:
        """Save `state`'s params if this step's loss on the eval set is the lowest yet; returns
        whether. The optimizer state stays out (twice the params under adam): a best is read
        to evaluate and export, never to resume."""
        loss = results[self.eval_set]["loss"]
        if not loss < self.best_loss:  # also refuses a NaN loss
            return False
        kept = self.ckpt.latest_step()
        if kept is not None and step <= kept:  # a replayed eval of a best already committed
            return False
        self.best_loss = loss
        self.losses = {s: v for s, v in self.losses.items() if s < step} | {step: loss}
        if jax.process_index() == 0:
            atomic_write_json(
                self.record_path,
                {
                    "eval_set": self.eval_set,
                    "eval_batches": self.eval_batches,
                    "loss_at_step": {str(s): v for s, v in self.losses.items()},
                },
            )
        kept_state = {"params": state["params"], "step": state["step"]}
        return self.ckpt.maybe_save(step, kept_state, force=True)

    def wait(self) -> None:
        """Block until the best save in flight commits. The train loop calls this before each
        regular checkpoint, so a run resumed from step R has every best up to R committed."""
        self.ckpt.wait()

    def best_step(self) -> int | None:
        return max(self.losses) if self.losses else None

    def close(self) -> None:
        self.ckpt.close()

    def _read_record(self) -> dict[int, float]:
        if not self.record_path.is_file():
            return {}
        record = json.loads(self.record_path.read_text())
        measured_on = (record.get("eval_set"), record.get("eval_batches"))
        if measured_on != (self.eval_set, self.eval_batches):  # losses not comparable
            return {}
        return {int(s): float(v) for s, v in record["loss_at_step"].items()}
