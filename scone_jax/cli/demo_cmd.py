"""`scone-jax demo`: the whole pipeline on the embedded default corpus, no download needed."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="run the main job end to end on the embedded default corpus",
        description="Build the default corpus from the installed Python standard library's docstrings, "
        "train a sentencepiece tokenizer, tokenize, train the tiny preset (experiments/demo.yaml) on a "
        "device mesh with checkpoints, evaluate held-out perplexity, and print where everything went. "
        "Rerunning resumes (or reports the finished run).",
    )
    p.add_argument("--out", default="demo_out", help="output directory")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides for the demo run")
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.config import load_config
    from scone_jax.train.loop import train

    out = Path(args.out)
    cfg = load_config("demo", [f"run_dir={out / 'run'}", *args.overrides])
    summary = train(cfg)
    run_dir = Path(summary["run_dir"])
    print("\nscone-jax demo finished. Outputs:")
    print(f"  run directory     {run_dir}")
    print(f"  resolved config   {run_dir / 'config.yaml'}")
    print(f"  tokenizer         {run_dir / 'dataset' / 'tokenizer.model'}")
    print(f"  tokenized dataset {run_dir / 'dataset'}")
    print(f"  checkpoints       {run_dir / 'checkpoints'}")
    print(f"  metrics (JSONL)   {run_dir / 'metrics.jsonl'}")
    print(f"  tensorboard       {run_dir / 'tensorboard'}")
    for name, r in summary.get("eval", {}).items():
        print(f"  eval {name}: perplexity {r['perplexity']:.2f}, bits/byte {r['bits_per_byte']:.3f}")
    return 0
