"""Each training step's record: its metrics read from the device, checked, timed and written.

The loop reads a step's metrics only once the next step is queued (`StepRecorder.record` is
called one step late), so the accelerator runs that step while the host reads, checks and writes
this one; reading them at once would leave it idle for that host work every step. A step whose
state is needed (an evaluation, a checkpoint, the last one, a stop) is recorded before anything
uses its state, so nothing is saved before its loss was found finite.
"""

from __future__ import annotations

import math
import time

import jax

from scone_jax.errors import UserError
from scone_jax.forest.stats import combine_vectors
from scone_jax.metrics.flops import peak_flops
from scone_jax.train.votes import read_votes


class TrainingDiverged(UserError):
    pass


class StepRecorder:
    """Turns a finished step's device metrics into its record line; keeps the timing window
    (the first step, which compiles, is left out) and the running f-gram overflow count."""

    def __init__(self, session, writer, bar, summary: dict, latest_checkpoint, start: int):
        self.session, self.writer, self.bar, self.summary = session, writer, bar, summary
        self.latest_checkpoint = latest_checkpoint
        self.start = start
        self.log_every = session.cfg.train.log_every
        self.total = session.cfg.train.steps
        self.tokens_per_step = session.cfg.train.batch_size * session.cfg.data.seq_len
        self.peak = peak_flops()
        self.overflows = 0
        self.restart_window()

    def restart_window(self) -> None:
        """Time from now on (after an evaluation, which is not a training step)."""
        self.window_start, self.window_steps, self.window_flops = time.perf_counter(), 0, 0.0

    def record(self, step: int, device_metrics: dict, batch: dict, global_batch: dict) -> int:
        """Read, check and write step `step` (counted from 1); a non-finite loss raises
        `TrainingDiverged` before anything of that step is written. Returns the signal any
        process had got when the step was queued (train/votes.py; 0: none, or no votes)."""
        fetched = dict(jax.device_get(device_metrics))
        votes = read_votes(fetched)
        metrics = {k: float(v) for k, v in fetched.items()}
        if "fgram_stats" in batch:
            # each process built the forests of its own rows: the global batch's metrics come
            # from every process's counts, summed in the step
            stats = batch["fgram_stats"] if votes is None else combine_vectors(votes[1][None])
            self.overflows += stats["fgram_overflow"]
            metrics.update(stats, fgram_overflow=self.overflows)
        metrics["step_flops"] = self.session.flops_per_step(global_batch)
        self.window_steps += 1
        self.window_flops += metrics["step_flops"]
        if step == self.start + 1:  # the first step includes compilation: keep it out of timings
            self.restart_window()
        if not math.isfinite(metrics["loss"]):
            raise TrainingDiverged(
                f"loss is {metrics['loss']} at step {step} (lr={metrics['lr']:.3g}, "
                f"grad_norm={metrics['grad_norm']:.3g}); last checkpoint: step "
                f"{self.latest_checkpoint()}"
            )
        log_now = step % self.log_every == 0 or step == self.total
        if log_now and self.window_steps:
            elapsed = time.perf_counter() - self.window_start
            step_time = elapsed / self.window_steps
            achieved = self.window_flops / elapsed / len(jax.devices())
            metrics.update(
                step_time_s=step_time,
                tokens_per_s=self.tokens_per_step / step_time,
                tflops_per_device=achieved / 1e12,
            )
            if self.peak:
                metrics["mfu"] = achieved / self.peak
            self.restart_window()
            self.bar.set_postfix(
                loss=f"{metrics['loss']:.4f}", tok_s=f"{metrics['tokens_per_s']:.0f}"
            )
        self.writer.write(step, metrics, echo=log_now)
        self.summary["final_loss"] = metrics["loss"]
        self.bar.update(1)
        return 0 if votes is None else votes[0]
