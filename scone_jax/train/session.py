"""Everything a train or eval run sets up before the first step: data, mesh, state, eval sets.

Shared by `scone-jax train` and `scone-jax eval`, so both see the same splits and shardings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from jax.sharding import Mesh

from scone_jax.config import Config
from scone_jax.data.dataset import TokenizedDataset
from scone_jax.data.pipeline import BatchStream, WindowSource, eval_batches, split_documents
from scone_jax.data.prepare import prepare_dataset
from scone_jax.dist.mesh import make_mesh
from scone_jax.dist.rules import MeshAxes, make_rules
from scone_jax.errors import UserError
from scone_jax.metrics.flops import ModelFlops, model_flops
from scone_jax.model import Transformer
from scone_jax.train.optimizer import make_optimizer
from scone_jax.train.state import TrainSetup, setup_train_state
from scone_jax.train.step import batch_shardings, make_eval_step, make_train_step


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

    def to_global(self, local_batch: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        """Process-local rows -> global arrays sharded over the data axes."""
        return {k: jax.make_array_from_process_local_data(sh, np.asarray(local_batch[k]))
                for k, sh in self.batch_sharding.items()}

    def train_step(self):
        return make_train_step(self.setup.handle, self.tx, self.schedule, self.mesh, self.rules,
                               self.setup.shardings, self.batch_sharding)

    def eval_step(self):
        return make_eval_step(self.setup.handle, self.mesh, self.rules, self.setup.shardings["params"],
                              self.batch_sharding)


def _named_eval_sets(cfg: Config, dataset: TokenizedDataset, eval_ids: np.ndarray, batch: int,
                     extra: list[str]) -> dict[str, list]:
    pid, nproc = jax.process_index(), jax.process_count()
    sets = {}
    if len(eval_ids):
        sets["heldout"] = eval_batches(WindowSource(dataset, eval_ids, cfg.data.seq_len), batch,
                                       cfg.train.eval_batches, pid, nproc)
    for path in extra:
        other = TokenizedDataset.open(path)
        if other.tokenizer_sha256 != dataset.tokenizer_sha256:
            raise UserError(f"eval dataset {path} was tokenized with tokenizer {other.tokenizer_sha256[:12]}, "
                            f"but the run uses {dataset.tokenizer_sha256[:12]}")
        name = Path(path).name
        sets[name] = eval_batches(WindowSource(other, np.arange(other.num_docs), cfg.data.seq_len), batch,
                                  cfg.train.eval_batches, pid, nproc)
    return sets


def open_session(cfg: Config, run_dir: Path, extra_eval: list[str] | None = None) -> Session:
    dataset = prepare_dataset(cfg.data, run_dir, progress=cfg.logging.progress and jax.process_index() == 0)
    vocab = cfg.model.vocab_size or dataset.vocab_size
    if vocab < dataset.vocab_size:
        raise UserError(f"model.vocab_size={vocab} is smaller than the dataset's vocabulary ({dataset.vocab_size})")
    mesh = make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    data_parallel = mesh.shape["data"] * mesh.shape["fsdp"]
    if cfg.train.batch_size % data_parallel:
        raise UserError(f"train.batch_size={cfg.train.batch_size} is not divisible by the data-parallel "
                        f"mesh size data*fsdp={data_parallel}")
    rules = make_rules(cfg.mesh.rules)
    tx, schedule = make_optimizer(cfg.optim, cfg.train.steps)
    setup = setup_train_state(lambda rngs: Transformer(cfg.model, vocab, rngs=rngs), tx, cfg.train.seed,
                              mesh, rules)
    train_ids, eval_ids = split_documents(dataset.num_docs, cfg.data.eval_fraction, cfg.data.seed)
    stream = BatchStream(WindowSource(dataset, train_ids, cfg.data.seq_len), cfg.train.batch_size,
                         seed=cfg.train.seed, process_index=jax.process_index(),
                         process_count=jax.process_count())
    eval_sets = _named_eval_sets(cfg, dataset, eval_ids, cfg.train.batch_size,
                                 list(cfg.data.eval_datasets) + list(extra_eval or []))
    return Session(cfg=cfg, run_dir=run_dir, dataset=dataset, vocab_size=vocab, mesh=mesh, rules=rules,
                   setup=setup, batch_sharding=batch_shardings(mesh, rules, cfg.train.batch_size, cfg.data.seq_len),
                   train_stream=stream, eval_sets=eval_sets,
                   flops=model_flops(cfg.model, vocab, cfg.data.seq_len), schedule=schedule, tx=tx)


def evaluate(session: Session, eval_step, params) -> dict[str, dict[str, float]]:
    """Perplexity and bits per byte on every named eval set."""
    token_bytes = jax.numpy.asarray(np.pad(session.dataset.token_bytes,
                                           (0, session.vocab_size - len(session.dataset.token_bytes))))
    results = {}
    for name, batches in session.eval_sets.items():
        nats = tokens = nbytes = 0.0
        for batch in batches:
            out = jax.device_get(eval_step(params, session.to_global(batch), token_bytes))
            nats, tokens, nbytes = nats + float(out["nats"]), tokens + float(out["tokens"]), nbytes + float(out["bytes"])
        loss = nats / tokens
        results[name] = {"loss": loss, "perplexity": float(np.exp(loss)),
                         "bits_per_byte": float(nats / np.log(2) / max(nbytes, 1.0)), "tokens": tokens}
    return results
