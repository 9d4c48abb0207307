"""The training loop: resume, step, log, evaluate, checkpoint, stop cleanly on a signal.

Order: queue the jitted step, then record the step before it (train/records.py: its metrics
are read while this one runs; a non-finite loss is refused there, before anything is saved).
A step that is evaluated or saved, the last one, or one a signal stops at is recorded at once,
then evaluated, then offered to the checkpointer: a checkpoint comes after every record of its
step, so a resume (which cuts the log back to the checkpoint's step) never loses or repeats one.
"""

from __future__ import annotations

import json
import shutil
import signal
from contextlib import contextmanager, suppress
from pathlib import Path

import jax
from tqdm import tqdm

from scone_jax.artifacts.best import BestCheckpoint
from scone_jax.artifacts.checkpoint import Checkpointer
from scone_jax.artifacts.run_dir import (
    CONFIG_FILE,
    FINAL_EVAL_FILE,
    RUN_INFO_FILE,
    best_checkpoint_dir,
    check_run_dir,
    checkpoints_dir,
    final_eval_record,
    final_results,
    run_id,
    save_run_config,
)
from scone_jax.atomic import abandoned, atomic_write_json, remove_path
from scone_jax.config import Config
from scone_jax.data.dataset import META_FILE
from scone_jax.data.prepare import dataset_path
from scone_jax.errors import Terminated, UserError
from scone_jax.metrics.writers import MetricsWriter
from scone_jax.progress import progress_bar
from scone_jax.runtime.distributed import barrier, report_failure
from scone_jax.signals import raise_lost, take_lost
from scone_jax.train.init_from import initial_state
from scone_jax.train.profile import StepProfiler
from scone_jax.train.records import StepRecorder
from scone_jax.train.session import evaluate, open_session


@contextmanager
def stop_on_signals(signals=(signal.SIGTERM, signal.SIGINT)):
    """Turn SIGTERM/SIGINT into a flag checked between steps, so the loop can save first (one
    whose exception was swallowed before, `scone_jax.signals`, is in it from the start)."""
    lost = take_lost()
    received: list[int] = [] if lost is None else [lost]
    previous = {
        s: signal.signal(s, lambda signum, _frame: received.append(signum)) for s in signals
    }
    try:
        yield received
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _remove_temporaries(run_dir: Path) -> None:
    """What a killed process left half-written in the run dir (`.NAME.tmp-*`: atomic_dir and
    atomic_write's temporaries); train holds the run dir's lock, and its peers wait."""
    for path in run_dir.glob(".*.tmp-*"):
        if abandoned(path):  # a live writer holds its temporary's lock (atomic.hold_temporary)
            remove_path(path)


def _check_same_dataset(run_dir: Path, cfg: Config) -> None:
    """A resumed run must read the tokens it started on: data.dataset may name another path
    (a moved copy), not other text. Checked before set-up, which would tag the other text."""
    dataset = dataset_path(cfg.data, run_dir)
    try:
        started = json.loads((run_dir / RUN_INFO_FILE).read_text())
        now = json.loads((dataset / META_FILE).read_text()).get("tokens_sha256")
    except (OSError, ValueError, AttributeError):
        return  # a run that never got this far, or no dataset there (set-up says so)
    then = started.get("dataset_tokens_sha256") if isinstance(started, dict) else None
    if then and now and then != now:
        raise UserError(
            f"run_dir {run_dir} started on the dataset at {started.get('dataset')} (tokens sha256 "
            f"{then[:12]}), but {dataset} holds other tokens ({now[:12]}); point data.dataset "
            "at the run's dataset, or use a new run_dir"
        )


def _undo_setup(run_dir: Path, fresh: bool, never_started: bool) -> None:
    """Remove what a failed set-up wrote: all of a new run dir; all but the saved config of one
    that never started (as a sweep plans its points), so a corrected config may still use it."""
    if fresh:
        shutil.rmtree(run_dir, ignore_errors=True)
    elif never_started:
        for path in run_dir.iterdir():
            if path.name != CONFIG_FILE:
                remove_path(path)


def train(cfg: Config) -> dict:
    """Train (or resume) the run described by `cfg`; returns a summary dict."""
    is_main = jax.process_index() == 0
    fresh = not Path(cfg.run_dir).exists()
    never_started = False
    if is_main:  # process 0 checks and prepares the run dir while the others wait
        if (Path(cfg.run_dir) / CONFIG_FILE).is_file():
            _remove_temporaries(Path(cfg.run_dir))  # a killed set-up's, before the checks
        run_dir = check_run_dir(cfg)
        never_started = not fresh and {p.name for p in run_dir.iterdir()} <= {CONFIG_FILE}
        if fresh or never_started:  # a set-up killed outright (SIGKILL) is then resumed
            save_run_config(cfg)
        _check_same_dataset(run_dir, cfg)
    barrier("run-dir-ready")
    if not is_main:
        run_dir = check_run_dir(cfg)
    parts = []  # what set-up opened, closed again if it fails
    try:
        session = open_session(cfg, run_dir)
        best = (
            BestCheckpoint(
                run_dir,
                cfg.checkpoint.keep_best,
                session.eval_sets,
                cfg.train.eval_batches,
                cfg.checkpoint.async_save,
            )
            if cfg.checkpoint.keep_best
            else None
        )
        parts.append(best)
        if is_main:
            save_run_config(cfg)  # a resume's changes (eval sets, cadences) once set-up passed
            atomic_write_json(
                run_dir / RUN_INFO_FILE, {**session.run_info(), "run_id": run_id(run_dir)}
            )
        total = cfg.train.steps
        ckpt = Checkpointer(
            checkpoints_dir(run_dir),
            cfg.checkpoint.every,
            cfg.checkpoint.keep,
            cfg.checkpoint.async_save,
        )
        parts.append(ckpt)
        writer = MetricsWriter(run_dir, tensorboard=cfg.logging.tensorboard, print_fn=tqdm.write)
        parts.append(writer)
        setup = session.setup
        state = ckpt.restore_newest_intact(setup.abstract_state, setup.shardings)
        if state is None:  # model.init_from is read and checked here: still set-up
            state = initial_state(setup, cfg, session.vocab_size, session.dataset.tokenizer_sha256)
            start = 0
        else:
            start = int(jax.device_get(state["step"]))
        raise_lost()  # a signal swallowed during set-up (in jax's gc hook, say) stops it here
    except BaseException as e:
        for part in parts:
            if part is not None:
                with suppress(Exception):
                    part.close()
        # bad input (or Ctrl-C) found during set-up: leave the run dir as it was; a preemption
        # (SIGTERM) keeps what set-up finished, for the same command to go on from
        if is_main and not isinstance(e, Terminated):
            _undo_setup(run_dir, fresh, never_started)
        raise
    writer.truncate_after(start)
    summary = {
        "run_dir": str(run_dir),
        "start_step": start,
        "steps": total,
        "params": session.flops.params_total,
        "params_non_embedding": session.flops.params_non_embedding,
    }
    if is_main:
        print(
            f"run {run_dir}: {session.flops.params_total:,} parameters "
            f"({session.flops.params_non_embedding:,} non-embedding)"
            + (
                f" + {session.fgram_model_params:,} in the f-gram model (training only)"
                if session.fgram_model_params
                else ""
            )
            + f", mesh "
            f"{dict(session.mesh.shape)}, {session.dataset.num_tokens:,} tokens, "
            + (f"resuming at step {start}" if start else "starting from scratch"),
            flush=True,
        )
    if start >= total:
        recorded = final_results(run_dir, cfg, start)
        if recorded is None:  # stopped before the final eval, or its eval sets or batches changed
            had = (run_dir / FINAL_EVAL_FILE).is_file()
            summary["eval"] = evaluate(session, session.eval_step(), state["params"])
            if is_main:
                atomic_write_json(
                    run_dir / FINAL_EVAL_FILE, final_eval_record(cfg, start, summary["eval"])
                )
                if had:
                    print(
                        f"evaluated the finished run again with its eval settings now "
                        f"({', '.join(summary['eval'])}; {cfg.train.eval_batches} batches)",
                        flush=True,
                    )
        else:
            summary["eval"] = recorded
        ckpt.close()
        if best:
            best.close()
        writer.close()
        summary["status"] = "already complete"
        if is_main:
            print(
                f"run {run_dir} is already complete ({total} steps); final evaluation in "
                f"{run_dir / FINAL_EVAL_FILE}",
                flush=True,
            )
        return summary

    train_step, eval_step = session.train_step(), session.eval_step()
    bar = progress_bar(  # off a terminal the metrics lines below are the progress
        "train",
        total=total,
        initial=start,
        unit="step",
        disable=not (cfg.logging.progress and is_main),
        plain_lines=False,
    )
    recorder = StepRecorder(session, writer, bar, summary, ckpt.latest_step, start)
    batches = session.train_stream.iterate(start)
    profiler = StepProfiler(run_dir, cfg.train)
    step, stopped_by = start, None
    logged = (
        start  # the last step whose state is sound and whose records are all written: safe to save
    )
    unread = None  # the step queued last whose metrics are not read yet, with what records it
    clean = False
    # through the final save too: a second SIGTERM (srun ending the step) must not cut it short
    with stop_on_signals() as received:
        try:
            while step < total:
                with profiler.step(step):  # the batch too: SCONE's forest is built on the host
                    batch = next(batches)
                    global_batch = session.to_global(batch)
                    got = received[0] if received else 0
                    state, metrics = train_step(state, global_batch, *session.votes(batch, got))
                step += 1
                profiler.after(step, state)
                # the signal to stop on now (0: none). Processes must all stop at the same step,
                # or they would wait forever in different collectives, and name the same signal
                # (the exit status): in a job of several, the one any process had got when the
                # step read here was queued (train/votes.py), so they stop a step after it
                stop = 0 if session.votes_across else got
                if unread is not None:  # the step before, read while this one runs
                    before, unread = unread, None
                    stop = recorder.record(*before) or stop
                unread = (step, metrics, batch, global_batch)
                evaluating = (cfg.train.eval_every and step % cfg.train.eval_every == 0) or (
                    step == total
                )
                if evaluating or ckpt.due(step) or stop:  # its state is used: record it now
                    current, unread = unread, None
                    stop = recorder.record(*current) or stop
                    if evaluating:
                        results = evaluate(session, eval_step, state["params"])
                        for name, result in results.items():
                            writer.write(step, {"set": name, **result}, kind="eval")
                            summary.setdefault("eval", {})[name] = result
                        if best:
                            best.offer(step, results, state)
                        recorder.restart_window()
                    logged = step
                    if best and ckpt.due(step):
                        best.wait()
                ckpt.maybe_save(step, state)  # saves on its interval; else seals finished saves
                if stop:
                    stopped_by = signal.Signals(stop).name
                    break
            clean = True
        except BaseException as e:
            report_failure(e)  # now: the clean-up below may wait on a peer that is gone
            raise
        finally:
            bar.close()
            profiler.close()
            # a save is collective: after an error on one process its peers cannot join one
            can_save = clean or jax.process_count() == 1
            if can_save and unread is not None:  # failed with a step queued but not recorded
                with suppress(Exception):  # a diverged or broken step is not saved
                    recorder.record(*unread)
                    logged = step
            try:
                if can_save and step > start and logged == step and ckpt.latest_step() != step:
                    if best:
                        best.wait()
                    ckpt.maybe_save(step, state, force=True)
            finally:
                try:
                    ckpt.close()
                finally:
                    if best:
                        best.close()
                    writer.close()
    summary["end_step"] = step
    if best and best.best_step() is not None:
        summary["best"] = {"step": best.best_step(), best.eval_set: {"loss": best.best_loss}}
    if step == total and stopped_by:  # a signal during the last step stops nothing: the run is
        summary["late_signal"], stopped_by = stopped_by, None  # finished (train_cmd: see there)
    summary["status"] = f"stopped by {stopped_by}" if stopped_by else "complete"
    if (
        step == total and is_main
    ):  # only once the last checkpoint is committed: it marks a finished run
        atomic_write_json(
            run_dir / FINAL_EVAL_FILE, final_eval_record(cfg, step, summary.get("eval", {}))
        )
    if is_main:
        msg = (
            f"{stopped_by}: saved step {step} to {checkpoints_dir(run_dir)}; rerun the same "
            "command to resume"
            if stopped_by
            else f"done: {step} steps; checkpoints in {checkpoints_dir(run_dir)}, "
            f"metrics in {run_dir / 'metrics.jsonl'}"
        )
        if "best" in summary:
            msg += (
                f"; lowest {best.eval_set} loss {best.best_loss:.4f} at step "
                f"{best.best_step()}, kept in {best_checkpoint_dir(run_dir)} (--step best)"
            )
        print(msg, flush=True)
    elif stopped_by:  # every process says where it stopped: the same step on all of them
        print(
            f"process {jax.process_index()} of {jax.process_count()}: {stopped_by}: saved step "
            f"{step} with the others",
            flush=True,
        )
    return summary
