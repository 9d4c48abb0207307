"""`scone-jax train CONFIG [key=value ...]`."""

from __future__ import annotations

import argparse

from scone_jax.config import load_config


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train (or resume) a model from a YAML config",
        description="Train a model described by CONFIG (a YAML file or a preset name from experiments/, "
        "e.g. 'tiny'), with key=value overrides such as train.steps=100 model.family=llama "
        "'data.corpus=[a.txt, b/*.txt]'. The resolved config is saved as RUN_DIR/config.yaml; "
        "rerunning the same command resumes from the latest checkpoint (the data order too). "
        "SIGTERM/SIGINT save a checkpoint before exiting.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("config", help="YAML config path or preset name (experiments/<name>.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, values parsed as YAML")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.config import to_dict

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    from scone_jax.train.loop import train

    summary = train(cfg)
    if summary["status"].startswith("stopped by"):
        return 143 if "SIGTERM" in summary["status"] else 130
    return 0
