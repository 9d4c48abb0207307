"""Orbax checkpoints of a train state (the whole state; a kept best, its params): async saves,
keep the last K, resume the latest.

The data position needs no extra state: batches are a pure function of (seed, step), so
restoring `step` restores the data order too (data/pipeline.py). Orbax commits each save
atomically (temporary directory, then rename), so a save torn by a crash is never restored.

Orbax does not check the bytes it reads back, so each committed save is sealed with a
checksum manifest (checksums.json in the step directory). Restoring a named step refuses a
damaged one with a one-line error; training's resume skips damaged ones (see
`restore_newest_intact`). A save killed between orbax's commit and the seal has no manifest
and is restored unchecked, then sealed.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from pathlib import Path

import jax
import orbax.checkpoint as ocp

from scone_jax.atomic import storage_errors
from scone_jax.checksums import ChecksumError, verify_manifest, write_manifest
from scone_jax.errors import UserError
from scone_jax.model.stack import layers_stacked
from scone_jax.runtime.distributed import barrier

DAMAGED_DIR = "damaged_checkpoints"  # beside checkpoints/, out of orbax's sight
ITEM = "default"  # the one item of each step directory: orbax's name for it


class Checkpointer:
    def __init__(
        self, directory: str | os.PathLike, every: int, keep: int, async_save: bool = True
    ):
        self.directory = Path(directory).absolute()
        self.every = every
        options = ocp.CheckpointManagerOptions(
            save_interval_steps=every,
            max_to_keep=keep,
            enable_async_checkpointing=async_save,
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)
        self._unsealed: list[int] = []  # saved by this process, not yet given a manifest
        self._refused = False  # the storage refused a save: no more attempts from this process

    def step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def due(self, step: int) -> bool:
        """Whether `step` is on the save interval."""
        return step % self.every == 0

    def saved_tree(self, step: int):
        """The tree of shapes and dtypes `step` holds, from its metadata (no array is read)."""
        meta = ocp.StandardCheckpointHandler().metadata(self.step_dir(step) / ITEM)
        return getattr(meta, "tree", meta)

    def maybe_save(self, step: int, state, force: bool = False) -> bool:
        """Save if `step` is on the interval (or `force`); returns whether a save started.

        The interval is decided here, not by orbax's policy (which also saves a first step).
        A save the storage refuses (here or, for async saves, at the next call) is a UserError,
        and later calls (the final save after that error) do nothing."""
        self._seal_finished()
        if self._refused or not (force or self.due(step)):
            return False
        with self._storage_errors():
            started = self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        if started:
            self._unsealed.append(step)
            self._seal_finished()  # a synchronous save is committed by now
        return started

    def restore_params(self, step: int, param_shapes, shardings_of):
        """The params of `step`. The rest of the state is described by the step's saved metadata,
        so no optimizer is built to restore a run; `shardings_of(state_shapes)` places it all."""
        verify_manifest(self.step_dir(step))
        saved = jax.tree.map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), self.saved_tree(step)
        )
        state_shapes = {**saved, "params": param_shapes}
        return self._restore(step, state_shapes, shardings_of(state_shapes))["params"]

    def restore(self, state_shapes, shardings, step: int | None = None):
        """Restore onto the given shardings (which may be a different mesh than the save's);
        a checkpoint that fails its checksums is a one-line error naming the damaged file."""
        step = self.latest_step() if step is None else step
        verify_manifest(self.step_dir(step))
        return self._restore(step, state_shapes, shardings)

    def restore_newest_intact(self, state_shapes, shardings):
        """Training's resume: the newest checkpoint that passes its checksums (None if there is
        no checkpoint). Newer damaged ones are moved to RUN_DIR/damaged_checkpoints/ with a
        warning naming the damaged file, so the run saves those steps again; when every
        checkpoint is damaged, a one-line error and nothing is moved."""
        damaged: list[tuple[int, ChecksumError]] = []
        for step in sorted(self.manager.all_steps(), reverse=True):
            try:
                sealed = verify_manifest(self.step_dir(step))
            except ChecksumError as e:
                damaged.append((step, e))
                continue
            self._set_aside(damaged)
            state = self._restore(step, state_shapes, shardings)
            if not sealed:
                self._unsealed.append(step)
                self._seal_finished()
            return state
        if damaged:
            raise UserError(
                f"every checkpoint in {self.directory} is damaged (newest: {damaged[0][1]}); "
                "move them away to train from scratch"
            )
        return None

    def wait(self) -> None:
        with self._storage_errors():
            self.manager.wait_until_finished()
        self._seal_finished()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            reported = self._refused
            try:
                with self._storage_errors():
                    self.manager.close()  # raises a refused save's error again
            except UserError:
                if not reported:
                    raise

    def _restore(self, step: int, state_shapes, shardings):
        self._check_layer_layout(step, state_shapes)
        target = abstract_with_shardings(state_shapes, shardings)
        try:
            return self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except (ValueError, KeyError, FileNotFoundError) as e:
            raise UserError(
                f"checkpoint {self.step_dir(step)} cannot be restored: {str(e).splitlines()[0]}"
            ) from None

    def _check_layer_layout(self, step: int, state_shapes) -> None:
        """A checkpoint saved with the other `model.scan_layers` is refused in one line."""
        saved = layers_stacked(self.saved_tree(step)["params"])
        wanted = layers_stacked(state_shapes["params"])
        if saved is not None and wanted is not None and saved != wanted:
            raise UserError(
                f"checkpoint {self.step_dir(step)} holds its layers "
                f"{'stacked' if saved else 'unrolled'} (model.scan_layers={str(saved).lower()}) "
                f"and this run {'scans' if wanted else 'unrolls'} them: resume it with "
                f"model.scan_layers={str(saved).lower()}"
            )

    def _seal_finished(self) -> None:
        """Write the manifest of each committed save once no save is running (process 0 only)."""
        if not self._unsealed or self.manager.is_saving_in_progress():
            return
        steps, self._unsealed = self._unsealed, []
        if jax.process_index() != 0:
            return
        for step in steps:
            if self.step_dir(step).is_dir():  # absent when the save failed or `keep` dropped it
                write_manifest(self.step_dir(step))

    def _set_aside(self, damaged: list[tuple[int, ChecksumError]]) -> None:
        if not damaged:
            return
        if jax.process_index() == 0:
            aside = self.directory.parent / DAMAGED_DIR
            aside.mkdir(exist_ok=True)
            for step, error in damaged:
                target = Path(tempfile.mkdtemp(prefix=f"{step}.", dir=aside))
                os.replace(self.step_dir(step), target)
                print(
                    f"warning: checkpoint {step} is damaged ({error}); moved it to {target} and "
                    "resuming from the newest intact checkpoint",
                    file=sys.stderr,
                    flush=True,
                )
        barrier("damaged-checkpoints-set-aside")
        self.manager.reload()

    @contextlib.contextmanager
    def _storage_errors(self):
        try:
            with storage_errors(f"a checkpoint in {self.directory}"):
                yield
        except UserError:
            self._refused = True
            raise


def abstract_with_shardings(state_shapes, shardings):
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), state_shapes, shardings
    )
