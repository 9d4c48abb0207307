"""A `jax.profiler` trace of a window of train steps (`train.profile_steps: [a, b]`).

The trace covers the steps that take the state from step a to step b, each marked as a step
(`StepTraceAnnotation`, numbered as the metrics log numbers them: a + 1 .. b) so the viewers
cut the timeline per step. It goes to `RUN_DIR/profile/`
(run_dir.profile_dir): an `.xplane.pb` for TensorBoard's profile plugin or XProf, and a
`perfetto_trace.json.gz` for ui.perfetto.dev. Only `train.profile_process` traces (process 0
by default; -1 = every process, each in its own folder).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import jax

from scone_jax.artifacts.run_dir import profile_dir
from scone_jax.config.schema import TrainConfig


class StepProfiler:
    """Starts the trace before step a runs and stops it once step b is done (or the loop ends)."""

    def __init__(self, run_dir: str | Path, cfg: TrainConfig):
        pid = jax.process_index()
        self.window = tuple(cfg.profile_steps)
        self.enabled = bool(self.window) and cfg.profile_process in (-1, pid)
        self.dir = profile_dir(run_dir, pid)
        self.active = False

    def step(self, done: int):
        """Around the step that takes the state from `done` to `done + 1`."""
        if self.enabled and not self.active and self.window[0] <= done < self.window[1]:
            self.dir.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.dir), create_perfetto_trace=True)
            self.active = True
        if not self.active:
            return contextlib.nullcontext()
        return jax.profiler.StepTraceAnnotation("train", step_num=done + 1)  # as the log counts

    def after(self, done: int, state) -> None:
        """Stop once `done` reaches the window's end, after the state's arrays are computed."""
        if self.active and done >= self.window[1]:
            jax.block_until_ready(state)
            self.close()

    def close(self) -> None:
        if self.active:
            self.active = False
            jax.profiler.stop_trace()
            print(f"profile of steps {list(self.window)} written to {self.dir}", flush=True)
