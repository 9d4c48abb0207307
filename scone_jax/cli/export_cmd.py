"""`scone-jax export RUN_DIR [--out TABLE_URL] [--backbone-out DIR] [--hf-out DIR]`."""

from __future__ import annotations

import os
from pathlib import Path

from scone_jax.cli import distributed_args
from scone_jax.cli.step_arg import add_step_argument
from scone_jax.runtime import distributed


def register(sub) -> None:
    p = sub.add_parser(
        "export",
        help="write the f-gram table (and the backbone) of a trained SCONE run for serving",
        description="Run the f-gram model of RUN_DIR's checkpoint over every f-gram and write the "
        "[S, d] table with tensorstore (zarr3) to --out: a local path or a kvstore URL (file://, "
        "memory://, gs://BUCKET/PATH, s3://BUCKET/PATH). The table becomes visible only when "
        "complete; rerunning an interrupted export resumes it. --backbone-out also writes the "
        "backbone's parameters as params.npz + config.yaml + meta.json (readable without orbax). "
        "--hf-out writes a Hugging Face checkpoint (model.safetensors + config.json for "
        "GPT2LMHeadModel or LlamaForCausalLM, the tokenizer, and for a SCONE run the rows and "
        "keys of the table written to --out, with scone.json); a baseline run takes --hf-out "
        "alone. In a multi-process job "
        "(docs/launch.md) each process computes and writes its own shards of the table, and "
        "process 0 commits it.",
    )
    p.add_argument("run_dir", help="a run directory made by `scone-jax train`")
    p.add_argument("--out", default=None, help="table location (path or kvstore URL)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16", "int8"),
        help="row dtype; int8 stores a float32 scale per row",
    )
    add_step_argument(p, "to export")
    p.add_argument("--batch-rows", type=int, default=1024, help="f-grams per f-gram-model batch")
    p.add_argument("--range-rows", type=int, default=65536, help="rows per resumable range")
    p.add_argument(
        "--shard-rows",
        type=int,
        default=65536,
        help="rows per file of the table (a multiple of 256 keeps the inner chunks at their "
        "full 256 rows; others shrink them to a divisor); a multi-process export deals "
        "whole shards to the processes",
    )
    p.add_argument(
        "--backbone-out", default=None, help="also export the backbone to this directory"
    )
    p.add_argument(
        "--hf-out", default=None, metavar="DIR", help="also write a Hugging Face checkpoint here"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace an existing table or backbone export"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    distributed_args.add_cli_arguments(p)
    p.set_defaults(func=run)


MAX_ROWS = 2**32  # beyond any table (S < 2**31): tensorstore refuses shards far larger


def run(args) -> int:
    from scone_jax.artifacts.lock import writing
    from scone_jax.artifacts.restore import agreed_checkpoint
    from scone_jax.artifacts.run_dir import load_run_config
    from scone_jax.artifacts.table_store import parse_location
    from scone_jax.errors import UserError
    from scone_jax.export.backbone import export_backbone
    from scone_jax.export.hf import export_hf
    from scone_jax.export.table import export_table

    for name in ("batch_rows", "range_rows", "shard_rows"):
        if not 0 < getattr(args, name) <= MAX_ROWS:
            raise UserError(
                f"--{name.replace('_', '-')}={getattr(args, name)} (expected 1..2**32; a table "
                "holds at most 2**31 rows)"
            )
    if not (args.out or args.backbone_out or args.hf_out):
        raise UserError(
            "give --out TABLE_URL (the f-gram table), --backbone-out DIR, --hf-out DIR, or several"
        )
    table = parse_location(args.out) if args.out else None  # on an object store: a lease
    outputs = [("--out", table), ("--backbone-out", args.backbone_out), ("--hf-out", args.hf_out)]
    check_apart(outputs)  # before the locks, which create their parent directories
    topology = distributed_args.initialize_from_args(args)
    with distributed.failures_reported(args.run_dir), writing(outputs, args.command_line):
        check_outputs(args)
        # one step for every export of this command, on every process, even while the run
        # still trains (a newer best or latest between two reads would mix two checkpoints)
        checkpoint = agreed_checkpoint(args.run_dir, args.step)
        scone = load_run_config(args.run_dir).fgrams.enabled
        if scone and args.hf_out and not args.out:
            raise UserError(
                f"run {args.run_dir} is a SCONE run: --hf-out takes its table's rows, so give "
                "--out TABLE_URL too"
            )
        if args.out:
            meta = export_table(
                args.run_dir,
                args.out,
                args.dtype,
                checkpoint,
                args.batch_rows,
                args.range_rows,
                shard_rows=args.shard_rows,
                progress=not args.no_progress,
                overwrite=args.overwrite,
            )
        if args.backbone_out:
            export_backbone(args.run_dir, args.backbone_out, checkpoint, args.overwrite)
        if args.hf_out:
            export_hf(args.run_dir, args.hf_out, args.out, checkpoint, args.overwrite)
    if topology and topology.process_id != 0:
        return 0  # every process takes part (the restore, its rows); process 0 reports
    if args.out:
        print(
            f"table {args.out}: {meta['num_rows']:,} rows x {meta['width']} {meta['dtype']} "
            f"({meta['combine']} mode, step {meta['checkpoint_step']}), "
            + (
                f"{meta['rows_per_s']:,.0f} rows/s"
                if meta.get("rows_per_s")
                else "already computed"
            )
        )
    if args.backbone_out:
        written = sorted(f.name for f in Path(args.backbone_out).iterdir())
        print(f"backbone {args.backbone_out}: {', '.join(written)}")
    if args.hf_out:
        print(
            f"Hugging Face checkpoint {args.hf_out}: model.safetensors, config.json, tokenizer"
            + (", fgram_table.safetensors, scone.json" if scone else "")
        )
    return 0


def check_apart(outputs) -> None:
    """Each output is its own directory: none may be another, or lie inside another (each is
    written whole and renamed into place)."""
    from scone_jax.errors import UserError

    named = []
    for flag, where in outputs:
        if where is None:
            continue
        if not isinstance(where, str):  # a table Location
            where = str(where.local_path) if where.local_path is not None else where.url
        where = where.rstrip("/")
        named.append((flag, where if "://" in where else os.path.abspath(where)))
    for i, (flag, path) in enumerate(named):
        for other, other_path in named[i + 1 :]:
            if path == other_path:
                raise UserError(f"{flag} and {other} are both {path} (expected separate outputs)")
            for inner, inner_path, outer, outer_path in (
                (flag, path, other, other_path),
                (other, other_path, flag, path),
            ):
                if inner_path.startswith(outer_path + "/"):
                    raise UserError(
                        f"{inner} {inner_path} lies inside {outer} {outer_path} (expected "
                        "separate outputs: each is written whole and moved into place)"
                    )


def check_outputs(args) -> None:
    """Refuse unusable output paths before the f-gram model runs: a local --out that exists but is
    neither a table nor, with --overwrite, an empty directory (anything else is never replaced),
    a --backbone-out or --hf-out that exists
    without --overwrite, and with it one that is not an export of its kind or holds the working
    directory (`check_replaceable`)."""
    from scone_jax.artifacts.backbone import BACKBONE_KIND, BACKBONE_MARKER
    from scone_jax.artifacts.hf_checkpoint import CONFIG, HF_KIND
    from scone_jax.artifacts.table_store import META, parse_location
    from scone_jax.atomic import check_output_path, check_replaceable
    from scone_jax.errors import UserError

    table = parse_location(args.out).local_path if args.out else None
    if table is not None:
        check_output_path(table, "--out")
        empty = table.is_dir() and not any(table.iterdir())
        if table.exists() and not (table / META).is_file() and not (args.overwrite and empty):
            raise UserError(
                f"--out {args.out} exists and is not an f-gram table (expected a new path, "
                "or an exported table or empty directory to replace with --overwrite)"
            )
    for flag, out, marker, kind in (
        ("--backbone-out", args.backbone_out, BACKBONE_MARKER, BACKBONE_KIND),
        ("--hf-out", args.hf_out, CONFIG, HF_KIND),
    ):
        if out:
            check_output_path(out, flag)
            if Path(out).exists() and not args.overwrite:  # the message names the flag
                raise UserError(f"{flag} {out} already exists (remove it or pass --overwrite)")
            check_replaceable(out, args.overwrite, marker, kind)
