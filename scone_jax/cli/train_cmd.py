"""`scone-jax train CONFIG [key=value ...]`."""

from __future__ import annotations

import signal

from scone_jax.cli import DefaultsHelpFormatter, distributed_args
from scone_jax.cli.config_args import add_config_arguments
from scone_jax.config import load_config
from scone_jax.runtime import distributed


def register(sub) -> None:
    p = sub.add_parser(
        "train",
        help="train (or resume) a model from a YAML config",
        description="Train a model described by CONFIG (a YAML file or a preset name from "
        "experiments/, e.g. 'tiny'), with key=value overrides such as train.steps=100 "
        "model.family=llama 'data.corpus=[a.txt, b/*.txt]'. The resolved config is saved as "
        "RUN_DIR/config.yaml; rerunning the same command resumes from the latest checkpoint (the "
        "data order too). SIGTERM/SIGINT save a checkpoint before exiting.",
        formatter_class=DefaultsHelpFormatter,
    )
    add_config_arguments(p)
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument(
        "--count-params",
        action="store_true",
        help="print the parameter counts (backbone, non-embedding, f-gram model) and exit",
    )
    distributed_args.add_cli_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from scone_jax.config import to_dict

    cfg = load_config(args.config, args.overrides)
    if args.print_config:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
        return 0
    if args.count_params:
        print(describe_params(cfg))
        return 0
    from scone_jax.artifacts.lock import writing
    from scone_jax.train.loop import train

    distributed_args.initialize_from_args(args)
    with (
        distributed.failures_reported(cfg.run_dir),
        writing([("run_dir", cfg.run_dir)], args.command_line),
    ):
        summary = train(cfg)
    return stop_status(summary)


def stop_status(summary: dict) -> int:
    """The exit status a training that returned `summary` ends with: 0 when it finished, 143 or
    130 when a SIGTERM or SIGINT stopped it (saved; the same command resumes)."""
    if summary.get("late_signal"):  # finished as the signal came: its sender may send another
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if summary["status"].startswith("stopped by"):
        # saved: a later SIGTERM (srun ending the step once a peer has exited) must not turn this
        # exit into a death by signal during jax's shutdown
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        return 143 if "SIGTERM" in summary["status"] else 130
    return 0


def describe_params(cfg) -> str:
    """Parameter counts from the architecture alone (no tokenizer needed when model.vocab_size is
    set)."""
    from scone_jax.errors import UserError
    from scone_jax.metrics.flops import count_fgram_params, count_params

    if not cfg.model.vocab_size:
        raise UserError("--count-params needs model.vocab_size (0 means 'from the tokenizer')")
    total, embedding = count_params(cfg.model, cfg.model.vocab_size)
    line = (
        f"backbone {total / 1e6:,.1f}M parameters ({(total - embedding) / 1e6:,.1f}M "
        f"non-embedding, {embedding / 1e6:,.1f}M embedding)"
    )
    if cfg.fgrams.enabled:
        fgram = count_fgram_params(cfg.fgrams, cfg.model)
        line += (
            f"; f-gram model {fgram / 1e6:,.1f}M parameters (training only; at inference "
            f"{cfg.fgrams.num_fgrams:,} table rows off the accelerator)"
        )
    return line
