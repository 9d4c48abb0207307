"""`scone-jax demo`: the whole pipeline on the embedded default corpus, no download needed."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on the embedded default corpus",
        description="Build the default corpus from the installed Python standard library's "
        "docstrings, train a sentencepiece tokenizer, tokenize, count f-grams on the training "
        "split, train the tiny SCONE preset (experiments/demo.yaml) on a device mesh with "
        "checkpoints, export the f-gram table and the backbone, evaluate held-out perplexity with "
        "the live f-gram model and with the table in host RAM, generate a sample, and print where "
        "everything went. Rerunning resumes or reuses.",
    )
    p.add_argument("--out", default="demo_out", help="output directory")
    p.add_argument(
        "overrides", nargs="*", metavar="key=value", help="config overrides for the demo run"
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.artifacts.lock import writing
    from scone_jax.config import load_config

    out = Path(args.out)
    cfg = load_config("demo", [f"run_dir={out / 'run'}", *args.overrides])
    with writing([("--out", out)], args.command_line):
        return _demo(cfg, out)


def _demo(cfg, out: Path) -> int:
    import json

    from scone_jax.artifacts.restore import agreed_checkpoint, run_fingerprint
    from scone_jax.artifacts.run_dir import CONFIG_FILE, checkpoints_dir
    from scone_jax.artifacts.table_store import META, parse_location, read_json
    from scone_jax.cli.generate_cmd import continuation
    from scone_jax.cli.train_cmd import stop_status
    from scone_jax.evaluation.run import evaluate_run
    from scone_jax.export.backbone import export_backbone
    from scone_jax.export.table import export_table
    from scone_jax.serve.engine import engine_from_run
    from scone_jax.serve.generate import generate
    from scone_jax.serve.sampling import Sampling
    from scone_jax.train.loop import train
    from scone_jax.train.session import HELDOUT

    summary = train(cfg)
    if stopped := stop_status(summary):  # train said where it saved; nothing half-trained ships
        print("demo stopped before its exports; rerun the same command to finish it", flush=True)
        return stopped
    run_dir = Path(summary["run_dir"])
    table, backbone = out / "table", out / "backbone"
    # the demo owns its exports: one of another checkpoint (or an older fingerprint) is redone
    checkpoint = agreed_checkpoint(run_dir)
    current = run_fingerprint(run_dir, checkpoint)
    existing = read_json(parse_location(str(table)), META)
    if existing is None or existing.get("checkpoint_fingerprint") != current:
        export_table(
            run_dir,
            str(table),
            step=checkpoint,
            progress=cfg.logging.progress,
            overwrite=existing is not None,
        )
    backbone_meta = backbone / "meta.json"  # its fingerprint, without reading the weights
    if not backbone_meta.is_file() or (
        json.loads(backbone_meta.read_text()).get("checkpoint_fingerprint") != current
    ):
        export_backbone(run_dir, backbone, checkpoint, overwrite=True)
    live = evaluate_run(run_dir)["results"][HELDOUT]
    served = evaluate_run(run_dir, table=str(table), tier="host")["results"][HELDOUT]
    from scone_jax.data.dataset import TokenizedDataset
    from scone_jax.data.tokenize import dataset_tokenizer

    tokenizer = dataset_tokenizer(TokenizedDataset.open(run_dir / "dataset"))
    engine = engine_from_run(run_dir, str(table), "host")
    prompt = "Return the"
    sample = generate(
        engine,
        [tokenizer.encode(prompt)],
        24,
        Sampling(temperature=0.8, top_k=40),
        seed=0,
        eos_id=tokenizer.eos_id,
    )[0]
    print("\nscone-jax demo finished. Outputs:")
    print(f"  run directory      {run_dir}")
    print(f"  resolved config    {run_dir / CONFIG_FILE}")
    print(f"  tokenized dataset  {run_dir / 'dataset'} (tokenizer: dataset/tokenizer.model)")
    print(f"  f-gram set         {run_dir / 'fgrams'} (stats.json, stats.png)")
    print(f"  checkpoints        {checkpoints_dir(run_dir)}")
    print(
        f"  metrics (JSONL)    {run_dir / 'metrics.jsonl'}; tensorboard: {run_dir / 'tensorboard'}"
    )
    print(f"  f-gram table       {table}")
    print(f"  backbone export    {backbone}")
    print(
        f"  held-out perplexity: live f-gram model {live['perplexity']:.2f}, "
        f"exported table {served['perplexity']:.2f} (bits/byte {served['bits_per_byte']:.3f})"
    )
    new = [t for t in sample if t != tokenizer.eos_id]
    print(f"  sample: {prompt!r} -> {continuation(tokenizer, tokenizer.encode(prompt), new)!r}")
    return 0
