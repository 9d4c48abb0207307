"""A sweep as an ordered list of commands: prepare shared data once, then train every point.

Layout of SWEEP_DIR:
    sweep.json                   the expansion: points, their overrides and commands
    data/tok-<hash>/train        the tokenized training corpus (one per distinct tokenization)
    data/tok-<hash>/eval/src-<hash>/<corpus>
                                 each `eval_corpora` entry (keyed by its path and its name),
                                 tokenized with the same tokenizer
    data/tok-<hash>/fgrams/...   one f-gram set per distinct (K, S, min count), counted on the
                                 training split only, shared by every point that uses it
    points/<point>/              the point's run directory (its resolved config.yaml first)
    logs/<step>.log              each command's output

A step is done when its output exists (datasets and f-gram sets are written atomically; a run
is done when it has `final_eval.json`), so rerunning the sweep skips finished work and resumes
a killed run from its last checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from scone_jax.artifacts.run_dir import check_run_dir, final_results, save_run_config
from scone_jax.atomic import atomic_write_json
from scone_jax.config import Config, load_config
from scone_jax.data.dataset import META_FILE
from scone_jax.data.tokenizer import FILE_NAME, find_tokenizer_file, tokenizer_file_name
from scone_jax.errors import UserError
from scone_jax.sweep.spec import Point, SweepSpec, format_value

PLAN_FILE = "sweep.json"


@dataclass
class Step:
    """One `scone-jax` command; `output` exists once it has finished."""

    kind: str  # tokenize | fgrams | train
    name: str
    argv: list[str]
    output: Path
    point: str | None = None
    config: Config | None = None  # a train step's planned config

    @property
    def done(self) -> bool:
        if self.kind == "train":  # evaluated with the eval sets and batches the plan names now
            return final_results(self.output, self.config) is not None
        return (self.output / META_FILE).is_file()

    @property
    def log_name(self) -> str:
        return self.name.replace("/", "_").replace(" ", "_") + ".log"


@dataclass
class PointPlan:
    point: Point
    config: Config
    overrides: list[str]


@dataclass
class SweepPlan:
    spec: SweepSpec
    sweep_dir: Path
    steps: list[Step]
    points: list[PointPlan]

    def check(self) -> None:
        """Refuse a point whose run directory holds a run that started with another config (a
        sweep file or overrides changed since): a dry run says so as the real run would."""
        for pp in self.points:
            try:
                check_run_dir(pp.config)
            except UserError as e:
                raise UserError(f"sweep point {pp.point.name}: {e}") from None

    def write(self) -> None:
        """Save the expansion and each point's resolved config (checked against an earlier one
        of a point that started)."""
        self.check()
        for pp in self.points:
            save_run_config(pp.config)  # the same run's, or one that never started
        record = {
            "name": self.spec.name,
            "sweep_file": str(self.spec.path.absolute()),
            "config": str(self.spec.config),
            "eval_corpora": self.spec.eval_corpora,
            "points": [
                {
                    "name": pp.point.name,
                    "axes": pp.point.axes,
                    "overrides": pp.overrides,
                    "run_dir": pp.config.run_dir,
                }
                for pp in self.points
            ],
            "steps": [{"kind": s.kind, "name": s.name, "argv": s.argv} for s in self.steps],
        }
        atomic_write_json(self.sweep_dir / PLAN_FILE, record)


def _tokenization_key(cfg: Config) -> str:
    d = cfg.data
    fields = [
        d.corpus,
        d.doc_split,
        d.text_field,
        d.tokenizer,
        d.tokenizer_vocab_size,
        d.tokenizer_type,
        d.max_default_corpus_mb,
    ]
    return "tok-" + hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:8]


def _tokenize_argv(cfg: Config, corpus: list[str], out: Path, tokenizer: str | None) -> list[str]:
    argv = [
        "tokenize",
        *[a for c in corpus for a in ("--corpus", c)],
        "--doc-split",
        cfg.data.doc_split,
        "--text-field",
        cfg.data.text_field,
        "--out",
        str(out),
        "--no-progress",
    ]
    if tokenizer:
        return argv + ["--tokenizer", tokenizer]
    return argv + [
        "--vocab-size",
        str(cfg.data.tokenizer_vocab_size),
        "--model-type",
        cfg.data.tokenizer_type,
        "--max-default-corpus-mb",
        format_value(cfg.data.max_default_corpus_mb),
    ]


def _fgram_step(cfg: Config, dataset: Path, data_dir: Path) -> Step:
    f, d = cfg.fgrams, cfg.data
    name = f"K{f.max_n}_S{f.num_fgrams}_min{f.min_count}"
    argv = [
        "fgrams",
        "build",
        str(dataset),
        "--max-n",
        str(f.max_n),
        "--num-fgrams",
        str(f.num_fgrams),
        "--min-count",
        str(f.min_count),
        "--no-progress",
    ]
    if d.eval_fraction > 0:  # count on the training split, exactly the documents `train` trains on
        name += f"_heldout{format_value(d.eval_fraction)}_seed{d.seed}"
        argv += ["--heldout-fraction", format_value(d.eval_fraction), "--split-seed", str(d.seed)]
    out = data_dir / "fgrams" / name
    return Step("fgrams", f"fgrams {data_dir.name}/{name}", argv + ["--out", str(out)], out)


def plan_sweep(spec: SweepSpec, sweep_dir: str | Path, extra: list[str] | None = None) -> SweepPlan:
    """Expand `spec` into commands; `extra` overrides (key=value) apply to every point, last."""
    sweep_dir = Path(sweep_dir).absolute()  # the configs it writes hold for any working directory
    common = [f"{k}={format_value(v)}" for k, v in spec.overrides.items()]
    steps: dict[Path, Step] = {}
    points: list[PointPlan] = []
    for point in spec.points:
        own = (
            common
            + [f"{k}={format_value(v)}" for k, v in point.overrides.items()]
            + list(extra or [])
        )
        if any(o.split("=", 1)[0] == "run_dir" for o in own):
            raise UserError(
                f"sweep point {point.name}: run_dir is the sweep's to set (SWEEP_DIR/points/"
                f"{point.name}); remove it from the sweep file or overrides"
            )
        try:
            cfg = load_config(spec.config, own)
        except UserError as e:
            raise UserError(f"sweep point {point.name}: {e}") from None
        managed = [f"run_dir={sweep_dir / 'points' / point.name}"]
        if cfg.data.dataset:
            dataset = Path(cfg.data.dataset).absolute()
            data_dir = (
                sweep_dir / "data" / ("ds-" + hashlib.sha256(str(dataset).encode()).hexdigest()[:8])
            )
            tokenizer = str(find_tokenizer_file(dataset))
        else:
            data_dir = sweep_dir / "data" / _tokenization_key(cfg)
            dataset = data_dir / "train"
            tokenizer = str(dataset / tokenizer_file_name(cfg.data.tokenizer or FILE_NAME))
            steps.setdefault(
                dataset,
                Step(
                    "tokenize",
                    f"tokenize {data_dir.name}/train",
                    _tokenize_argv(cfg, cfg.data.corpus, dataset, cfg.data.tokenizer),
                    dataset,
                ),
            )
        managed.append(f"data.dataset={dataset}")
        eval_sets = list(cfg.data.eval_datasets)
        for corpus_name, corpus in spec.eval_corpora.items():
            # keyed by where the text is too: a name given to another file is tokenized anew
            source = "src-" + hashlib.sha256(os.path.abspath(corpus).encode()).hexdigest()[:8]
            out = data_dir / "eval" / source / corpus_name
            steps.setdefault(
                out,
                Step(
                    "tokenize",
                    f"tokenize {data_dir.name}/{corpus_name}",
                    _tokenize_argv(cfg, [corpus], out, tokenizer),
                    out,
                ),
            )
            eval_sets.append(str(out))
        if spec.eval_corpora:
            managed.append(f"data.eval_datasets={format_value(eval_sets)}")
        if cfg.fgrams.enabled and not cfg.fgrams.fgram_set:
            fgram_step = _fgram_step(cfg, dataset, data_dir)
            steps.setdefault(fgram_step.output, fgram_step)
            managed.append(f"fgrams.fgram_set={fgram_step.output}")
        overrides = own + managed
        cfg = load_config(spec.config, overrides)
        run_dir = Path(cfg.run_dir)
        steps[run_dir] = Step(
            "train",
            f"train {point.name}",
            ["train", str(spec.config), *overrides],
            run_dir,
            point=point.name,
            config=cfg,
        )
        points.append(PointPlan(point=point, config=cfg, overrides=overrides))
    order = {"tokenize": 0, "fgrams": 1, "train": 2}
    ordered = sorted(
        steps.values(), key=lambda s: order[s.kind]
    )  # stable: keeps the spec's point order
    return SweepPlan(spec=spec, sweep_dir=sweep_dir, steps=ordered, points=points)
