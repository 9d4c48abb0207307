"""Orbax checkpoints of the whole train state: async saves, keep the last K, resume the latest.

The data position needs no extra state: batches are a pure function of (seed, step), so
restoring `step` restores the data order too (data/pipeline.py). Orbax commits each save
atomically (temporary directory, then rename), so a save torn by a crash is never restored.
"""

from __future__ import annotations

import os
from pathlib import Path

import orbax.checkpoint as ocp

from scone_jax.errors import UserError
from scone_jax.train.state import abstract_with_shardings


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, every: int, keep: int, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every,
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def maybe_save(self, step: int, state, force: bool = False) -> bool:
        """Save if `step` is on the interval (or `force`); returns whether a save started.

        The interval is decided here, not by orbax's policy (which also saves a first step)."""
        if not (force or step % self.every == 0):
            return False
        return self.manager.save(step, args=ocp.args.StandardSave(state), force=True)

    def restore(self, state_shapes, shardings, step: int | None = None):
        """Restore onto the given shardings (which may be a different mesh than the save's)."""
        step = self.latest_step() if step is None else step
        target = abstract_with_shardings(state_shapes, shardings)
        try:
            return self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise UserError(f"checkpoint {self.directory}/{step} cannot be restored: {str(e).splitlines()[0]}") from None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
