"""Everything a train or eval run sets up before the first step: data, mesh, state, eval sets.

Shared by `scone-jax train` and `scone-jax eval`, so both see the same splits and shardings.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from scone_jax.artifacts.run_dir import CONFIG_FILE
from scone_jax.config import Config
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.data.pipeline import (
    BatchStream,
    WindowSource,
    eval_batch_count,
    eval_batches,
    split_documents,
)
from scone_jax.data.prepare import dataset_path, prepare_dataset
from scone_jax.errors import UserError
from scone_jax.forest.stats import stats_vector
from scone_jax.metrics.flops import (
    ModelFlops,
    count_fgram_params,
    fgram_forest_forward,
    model_flops,
)
from scone_jax.metrics.perplexity import eval_result
from scone_jax.model.build import build_model_fn
from scone_jax.runtime.distributed import barrier
from scone_jax.sharding.batch import batch_shardings, fgram_groups
from scone_jax.sharding.mesh import make_mesh
from scone_jax.sharding.rules import MeshAxes, make_rules
from scone_jax.train.fgram_inputs import FgramInputs, load_or_build_fgram_set, prepare_fgram_inputs
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import TrainSetup, setup_train_state
from scone_jax.train.step import device_arrays, make_eval_step, make_train_step
from scone_jax.train.votes import process_votes, votes_sharding

CALIBRATION_BATCHES = 8


@dataclass
class Session:
    cfg: Config
    run_dir: Path
    dataset: TokenizedDataset
    vocab_size: int
    mesh: Mesh
    rules: dict[str, MeshAxes]
    setup: TrainSetup
    batch_sharding: dict
    train_stream: BatchStream
    eval_sets: dict[str, list[dict[str, np.ndarray]]]
    flops: ModelFlops
    schedule: object
    tx: object
    fgrams: FgramInputs | None = None

    def to_global(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Process-local rows -> global arrays sharded over the data axes.

        With several processes, every host's forest buffers (blocks and outputs) are padded to
        the largest (all must agree on shapes), and positions point into their own host's slice
        of the outputs.
        """
        forest = local_batch.get("forest")
        if forest is not None and jax.process_count() > 1:
            from jax.experimental import multihost_utils

            have = np.array([forest.nodes.shape[-2], forest.outputs.shape[-1]], np.int64)
            blocks, outputs = np.max(multihost_utils.process_allgather(have), axis=0).tolist()
            local_batch = {
                **local_batch,
                "forest": forest.padded(blocks, outputs).on_global_outputs(jax.process_index()),
            }
        arrays = device_arrays(local_batch)
        return {
            k: jax.make_array_from_process_local_data(sh, np.asarray(arrays[k]))
            for k, sh in self.batch_sharding.items()
        }

    def run_info(self) -> dict:
        info = {
            "vocab_size": self.vocab_size,
            "dataset": str(Path(self.dataset.path).absolute()),
            # what a resume checks the dataset against (the path may move, its tokens may not)
            "dataset_tokens_sha256": self.dataset.meta.get("tokens_sha256"),
            "tokenizer_sha256": self.dataset.tokenizer_sha256,
            "params": self.flops.params_total,
            "params_non_embedding": self.flops.params_non_embedding,
        }
        if self.fgrams is not None:
            info.update(
                fgram_set=str(Path(self.fgrams.fgram_set.path).absolute()),
                fgram_set_fingerprint=self.fgrams.fgram_set.fingerprint,
                params_fgram_model=self.fgram_model_params,
            )
        return info

    @property
    def fgram_model_params(self) -> int:
        """The f-gram model's parameters (trained with the backbone; a table at inference)."""
        return count_fgram_params(self.cfg.fgrams, self.cfg.model) if self.fgrams else 0

    def flops_per_step(self, batch: dict | None = None) -> float:
        """Training FLOPs of one step; the f-gram model counts on the slots of the global
        batch's forest buffers (`to_global`), padding included: what is computed."""
        tokens = self.cfg.train.batch_size * self.cfg.data.seq_len
        flops = self.flops.train_per_token * tokens
        if self.fgrams is not None and batch is not None:
            flops += 3 * fgram_forest_forward(
                self.cfg.fgrams,
                self.cfg.model,
                batch["fgram_nodes"].size,
                batch["fgram_outputs"].size,
            )
        return flops

    def train_step(self):
        return make_train_step(
            self.setup.handle,
            self.tx,
            self.schedule,
            self.mesh,
            self.rules,
            self.setup.shardings,
            self.batch_sharding,
            self.cfg.train.microbatches,
            self.cfg.dropout_seed,
            votes_sharding(self.mesh) if self.votes_across else None,
        )

    @property
    def votes_across(self) -> bool:
        """Whether the train step exchanges the processes' votes (train/votes.py): in a job of
        several processes; one process decides alone, at once."""
        return jax.process_count() > 1

    def votes(self, local_batch: dict, signal_number: int) -> tuple:
        """The train step's extra argument: this process's vote (the signal it got, its f-gram
        counts), or nothing for a single process."""
        if not self.votes_across:
            return ()
        counts = []
        if "fgram_stats" in local_batch:
            ids = local_batch["fgram_ids"]
            counts = stats_vector(local_batch["fgram_stats"], ids.size, int((ids >= 0).sum()))
        return (process_votes(self.mesh, np.array([signal_number, *counts], np.int64)),)

    def eval_step(self):
        return make_eval_step(
            self.setup.handle,
            self.mesh,
            self.rules,
            self.setup.shardings["params"],
            self.batch_sharding,
            self.cfg.train.microbatches,
        )


HELDOUT = "heldout"  # the name of the run's own held-out split among its eval sets


def eval_set_names(paths: list[str]) -> list[str]:
    """A name per extra eval dataset: its directory's name, or, for one whose name an earlier
    set or the held-out split took, as many of its trailing path parts as tell it apart (`test`
    and `b/test`). The run's own sets come first, so naming another never renames them."""
    parts = [Path(p).absolute().parts for p in paths]
    for i, p in enumerate(parts):
        if p in parts[:i]:
            raise UserError(f"eval dataset {paths[i]} is given twice")
    depth = [1] * len(paths)
    while True:  # distinct paths: their whole spellings differ, so this ends
        names = ["/".join(p[-d:]) for p, d in zip(parts, depth, strict=True)]
        clashing = [i for i, n in enumerate(names) if n == HELDOUT or n in names[:i]]
        if not clashing:
            return names
        for i in clashing:
            depth[i] += 1


def _named_eval_sets(
    cfg: Config,
    dataset: TokenizedDataset,
    eval_ids: np.ndarray,
    batch: int,
    extra: list[str],
    fgrams: FgramInputs | None,
) -> dict[str, list]:
    pid, nproc = jax.process_index(), jax.process_count()
    sets = {}
    if len(eval_ids):
        sets[HELDOUT] = eval_batches(
            WindowSource(dataset, eval_ids, cfg.data.seq_len),
            batch,
            cfg.train.eval_batches,
            pid,
            nproc,
            transform=fgrams.transform() if fgrams else None,
        )
    spellings: dict[Path, str] = {}  # a dataset named twice (X and ./X too) is evaluated once
    for path in extra:
        spellings.setdefault(Path(path).absolute(), path)
    paths = list(spellings.values())
    for name, path in zip(eval_set_names(paths), paths, strict=True):
        other = TokenizedDataset.open(path)
        if other.tokenizer_sha256 != dataset.tokenizer_sha256:
            raise UserError(
                f"eval dataset {path} was tokenized with tokenizer {other.tokenizer_sha256[:12]}, "
                f"but the run uses {dataset.tokenizer_sha256[:12]}"
            )
        source = WindowSource(other, np.arange(other.num_docs), cfg.data.seq_len)
        eval_batch_count(  # before tagging it
            source,
            batch,
            cfg.train.eval_batches,
            f"eval dataset {path}",
            "use a larger eval dataset, or lower train.batch_size or data.seq_len",
        )
        transform = (
            fgrams.transform(fgrams.batcher_for(other, progress=cfg.logging.progress and pid == 0))
            if fgrams
            else None
        )
        sets[name] = eval_batches(
            source,
            batch,
            cfg.train.eval_batches,
            pid,
            nproc,
            transform=transform,
            name=f"eval dataset {path}",
        )
    return sets


def _require_built(cfg: Config, run_dir: Path) -> None:
    missing = [
        (what, path)
        for what, path, needed in (
            ("dataset", dataset_path(cfg.data, run_dir), not cfg.data.dataset),
            ("f-gram set", run_dir / "fgrams", cfg.fgrams.enabled and not cfg.fgrams.fgram_set),
        )
        if needed and not (path / "meta.json").is_file()
    ]
    if missing:
        what, path = missing[0]
        raise UserError(
            f"run {run_dir} has no {what} at {path} (removed since it trained? `scone-jax train "
            f"{run_dir / CONFIG_FILE}` builds it again)"
        )


def _prepare_dataset(cfg: Config, run_dir: Path) -> TokenizedDataset:
    """Process 0 tokenizes (when the run has no dataset yet); the others wait for it, then open
    it."""
    if jax.process_count() == 1:
        return prepare_dataset(cfg.data, run_dir, progress=cfg.logging.progress)
    barrier(
        "run-dir-checked"
    )  # no process checks the run dir after process 0 starts writing into it
    if jax.process_index() == 0:
        dataset = prepare_dataset(cfg.data, run_dir, progress=cfg.logging.progress)
    barrier("dataset-ready")
    return (
        dataset if jax.process_index() == 0 else prepare_dataset(cfg.data, run_dir, progress=False)
    )


def check_batch_layout(cfg: Config, data_parallel: int) -> None:
    """The global batch divides over the data shards, and each shard's rows over the
    microbatches (so a microbatch is spread evenly over the shards)."""
    batch, micro = cfg.train.batch_size, cfg.train.microbatches
    if batch % data_parallel:
        raise UserError(
            f"train.batch_size={batch} is not divisible by the data-parallel mesh size "
            f"data*fsdp={data_parallel}"
        )
    if (batch // data_parallel) % micro:
        raise UserError(
            f"train.microbatches={micro} does not divide the {batch // data_parallel} rows of "
            f"each data shard (train.batch_size={batch} over data*fsdp={data_parallel})"
        )


def _check_heldout_split(
    cfg: Config, dataset: TokenizedDataset, eval_ids: np.ndarray, other_eval_sets: bool
) -> None:
    """A run asked to hold text out gets a held-out split it can evaluate, or stops saying why:
    documents are held out whole, so a corpus of one file (one document) has none to give. A
    run with other eval sets is only warned: it has something to evaluate on."""
    if cfg.data.eval_fraction > 0 and dataset.num_docs == 1:  # none at all: no windows either
        if other_eval_sets:
            print(
                f"warning: dataset {dataset.path} has 1 document, so no held-out split; the "
                "run evaluates on its other eval sets only",
                file=sys.stderr,
            )
            return
        raise UserError(
            f"dataset {dataset.path} has 1 document, so no whole document "
            f"can be held out (data.eval_fraction={cfg.data.eval_fraction}); split the text into "
            "documents (data.doc_split=blank_line: one per paragraph), or train without a "
            "held-out split (data.eval_fraction=0)"
        )
    if len(eval_ids):
        source = WindowSource(dataset, eval_ids, cfg.data.seq_len)
        eval_batch_count(source, cfg.train.batch_size, cfg.train.eval_batches)


def open_session(
    cfg: Config, run_dir: Path, extra_eval: list[str] | None = None, build: bool = True
) -> Session:
    """The run's data, model and steps; training builds a missing dataset or f-gram set into the
    run directory, a reader (`build=False`: eval) refuses it in one line, since it takes no lock
    and must not write there."""
    if not build:
        _require_built(cfg, run_dir)
    dataset = _prepare_dataset(cfg, run_dir)
    vocab = cfg.model.vocab_size or dataset.vocab_size
    if vocab < dataset.vocab_size:
        raise UserError(
            f"model.vocab_size={vocab} is smaller than the dataset's vocabulary "
            f"({dataset.vocab_size})"
        )
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    check_batch_layout(cfg, data_parallel)
    rules = make_rules(cfg.mesh.rules)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(build_model_fn(cfg, vocab), tx, cfg.train.seed, mesh, rules)
    train_ids, eval_ids = split_documents(dataset.num_docs, cfg.data.eval_fraction, cfg.data.seed)
    extra = list(cfg.data.eval_datasets) + list(extra_eval or [])
    _check_heldout_split(cfg, dataset, eval_ids, bool(extra))  # before the f-grams are counted
    fgrams = None
    if cfg.fgrams.enabled:
        main_process = jax.process_index() == 0
        if main_process:  # process 0 counts the f-gram set (into the run dir) while the others wait
            load_or_build_fgram_set(cfg.fgrams, dataset, train_ids, run_dir, cfg.logging.progress)
        barrier("fgram-set-ready")
        fgrams = prepare_fgram_inputs(  # every process tags its share of the dataset
            cfg.fgrams,
            dataset,
            train_ids,
            run_dir,
            positions_per_host=cfg.train.batch_size // jax.process_count() * cfg.data.seq_len,
            groups=max(fgram_groups(mesh, rules) // jax.process_count(), 1),
            progress=cfg.logging.progress and main_process,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
            barrier=barrier,
            microbatches=cfg.train.microbatches,
            seed=cfg.train.seed,
        )
    stream = BatchStream(
        WindowSource(dataset, train_ids, cfg.data.seq_len),
        cfg.train.batch_size,
        seed=cfg.train.seed,
        process_index=jax.process_index(),
        process_count=jax.process_count(),
        transform=fgrams.train_transform() if fgrams else None,
    )
    if fgrams is not None:
        # deterministic: the first batches of the run, whatever step a resume starts at
        fgrams.transform().calibrate(stream.raw_batch(k) for k in range(CALIBRATION_BATCHES))
    eval_sets = _named_eval_sets(
        cfg,
        dataset,
        eval_ids,
        cfg.train.batch_size,
        extra,
        fgrams,
    )
    return Session(
        cfg=cfg,
        run_dir=run_dir,
        dataset=dataset,
        vocab_size=vocab,
        mesh=mesh,
        rules=rules,
        setup=setup,
        batch_sharding=batch_shardings(
            mesh,
            rules,
            cfg.train.batch_size,
            cfg.data.seq_len,
            cfg.fgrams.max_n if cfg.fgrams.enabled else None,
            cfg.train.microbatches,
            cfg.fgrams.index_links,
        ),
        train_stream=stream,
        eval_sets=eval_sets,
        flops=model_flops(cfg.model, vocab, cfg.data.seq_len),
        schedule=schedule,
        tx=tx,
        fgrams=fgrams,
    )


def evaluate(session: Session, eval_step, params) -> dict[str, dict[str, float]]:
    """Perplexity and bits per byte on every named eval set."""
    token_bytes = jax.numpy.asarray(
        np.pad(
            session.dataset.token_bytes, (0, session.vocab_size - len(session.dataset.token_bytes))
        )
    )
    results = {}
    for name, batches in session.eval_sets.items():
        nats = tokens = nbytes = 0.0
        for batch in batches:
            out = jax.device_get(eval_step(params, session.to_global(batch), token_bytes))
            nats, tokens, nbytes = (
                nats + float(out["nats"]),
                tokens + float(out["tokens"]),
                nbytes + float(out["bytes"]),
            )
        results[name] = eval_result(nats, tokens, nbytes)
    return results
