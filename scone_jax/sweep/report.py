"""`scone-jax report SWEEP_DIR`: every point's results in one CSV, one markdown table, and plots.

Numbers come from what each run left in its directory (config.yaml, run_info.json,
final_eval.json, metrics.jsonl) and from its f-gram set, so a sweep run by any launcher can
be reported, and a report of an unfinished sweep lists the missing points as incomplete.
"""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

from scone_jax.artifacts.run_dir import CONFIG_FILE, FINAL_EVAL_FILE, RUN_INFO_FILE, load_run_config
from scone_jax.atomic import atomic_dir
from scone_jax.errors import UserError
from scone_jax.metrics.flops import count_fgram_params, count_params, model_flops
from scone_jax.sweep.plan import PLAN_FILE

REPORT_MARKER = "results.md"  # a file every report holds, so --out replaces only a report
REPORT_KIND = "a sweep report"
TABLE_BYTES_PER_VALUE = 4  # float32 rows, `scone-jax export`'s default
COLUMNS = (
    "point",
    "status",
    "scone",
    "combine",
    "num_fgrams",
    "max_n",
    "fgram_model_size",
    "fgram_model_layers",
    "fgram_model_params",
    "accelerator_params",
    "accelerator_params_non_embedding",
    "inference_flops_per_token",
    "table_rows",
    "table_bytes",
    "coverage",
    "mean_match_length",
    "train_steps",
    "steps_done",
    "train_flops",
)


def _read_json(path: Path) -> dict | None:
    """A JSON object file's contents, None where it is missing; anything else is a one-line
    UserError naming it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} holds a JSON {type(data).__name__} (expected an object)")
    return data


def _require(record: dict, keys: tuple[str, ...], where: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise UserError(f"{where} lacks {', '.join(missing)} (expected {', '.join(keys)})")


def _train_log(run_dir: Path) -> tuple[float | None, int]:
    """The sum of each step's FLOPs as logged (resumed runs log every step exactly once), and
    the last step logged (0: none)."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return None, 0
    total, seen, last = 0.0, False, 0
    lines = path.read_text(encoding="utf-8").splitlines()
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except ValueError:
            if number == len(lines):
                break  # a line a killed run left half-written
            raise UserError(
                f"{path} line {number} is not JSON (expected one record per line)"
            ) from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {number} is not a JSON object")
        if record.get("kind") == "train":
            step, flops = record.get("step", 0), record.get("step_flops", 0)
            for key, value in (("step", step), ("step_flops", flops)):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise UserError(f"{path} line {number}: {key} {value!r} is not a number")
            last = max(last, int(step))
            if "step_flops" in record:
                total, seen = total + flops, True
    return (total if seen else None), last


def point_row(name: str, run_dir: Path) -> dict:
    """One point's row: its settings, sizes and costs, and its held-out results per corpus."""
    cfg = load_run_config(run_dir)
    info = _read_json(run_dir / RUN_INFO_FILE) or {}
    final = _read_json(run_dir / FINAL_EVAL_FILE)
    if final is not None:  # a finished run's record: a damaged one is not a finished run
        _require(final, ("step", "results"), str(run_dir / FINAL_EVAL_FILE))
    flops, steps_done = _train_log(run_dir)
    row: dict = {
        "point": name,
        "status": "complete" if final is not None else "incomplete",
        "scone": cfg.fgrams.enabled,
        "train_steps": cfg.train.steps,
        "steps_done": cfg.train.steps if final is not None else steps_done,
        "train_flops": flops,
    }
    vocab = info.get("vocab_size") or cfg.model.vocab_size
    if vocab:
        total, embedding = count_params(cfg.model, vocab)
        row.update(
            accelerator_params=total,
            accelerator_params_non_embedding=total - embedding,
            inference_flops_per_token=model_flops(
                cfg.model, vocab, cfg.data.seq_len
            ).forward_per_token,
        )
    if cfg.fgrams.enabled:
        fgram_model = cfg.fgrams.model_config(cfg.model)
        row.update(
            combine=cfg.fgrams.combine,
            max_n=cfg.fgrams.max_n,
            fgram_model_size=cfg.fgrams.model_size,
            fgram_model_layers=fgram_model.n_layers,
            fgram_model_params=count_fgram_params(cfg.fgrams, cfg.model),
        )
        fgram_dir = Path(info.get("fgram_set") or cfg.fgrams.fgram_set or run_dir / "fgrams")
        meta = _read_json(fgram_dir / "meta.json")
        rows = int(meta["num_fgrams"]) if meta else cfg.fgrams.num_fgrams
        row.update(
            num_fgrams=rows,
            table_rows=rows,
            table_bytes=rows * cfg.model.d_model * TABLE_BYTES_PER_VALUE,
        )
        coverage = (_read_json(fgram_dir / "stats.json") or {}).get("coverage")
        if coverage:
            row.update(
                coverage=coverage["coverage"], mean_match_length=coverage["mean_match_length"]
            )
    else:
        row.update(num_fgrams=0, table_rows=0, table_bytes=0)
    results = (final or {}).get("results", {})
    if not isinstance(results, dict):
        raise UserError(f"{run_dir / FINAL_EVAL_FILE}: results is not a mapping of eval sets")
    for corpus, r in results.items():
        if not isinstance(r, dict):
            raise UserError(f"{run_dir / FINAL_EVAL_FILE}: results.{corpus} is not an object")
        _require(
            r, ("perplexity", "bits_per_byte"), f"{run_dir / FINAL_EVAL_FILE} results.{corpus}"
        )
        row[f"ppl_{corpus}"] = r["perplexity"]
        row[f"bpb_{corpus}"] = r["bits_per_byte"]
    if results:
        # geometric mean (exp of the mean loss): one out-of-domain corpus must not drown the others
        row["ppl_mean"] = math.exp(
            sum(math.log(r["perplexity"]) for r in results.values()) / len(results)
        )
    return row


def gather(sweep_dir: str | Path) -> tuple[dict, list[dict]]:
    sweep_dir = Path(sweep_dir)
    plan = _read_json(sweep_dir / PLAN_FILE)
    if plan is None:
        raise UserError(
            f"{sweep_dir} is not a sweep directory (no {PLAN_FILE}; expected the --out of "
            "`scone-jax sweep`)"
        )
    _require(plan, ("name", "points"), str(sweep_dir / PLAN_FILE))
    rows = []
    for point in plan["points"]:
        if not isinstance(point, dict):
            raise UserError(f"{sweep_dir / PLAN_FILE}: a point is not an object")
        _require(point, ("name", "axes"), f"{sweep_dir / PLAN_FILE} point")
        run_dir = sweep_dir / "points" / point["name"]  # where the sweep put it, wherever it moved
        if (run_dir / CONFIG_FILE).is_file():
            row = point_row(point["name"], run_dir)
        else:  # its directory was removed, or the sweep was expanded elsewhere
            row = {"point": point["name"], "status": "missing", "scone": None}
        row.update({f"axis:{k}": v for k, v in point["axes"].items()})
        rows.append(row)
    return plan, rows


def _columns(rows: list[dict]) -> list[str]:
    extra = sorted({k for r in rows for k in r} - set(COLUMNS))
    results = [k for k in extra if k.startswith(("ppl_", "bpb_")) and k != "ppl_mean"]
    axes = [k for k in extra if k.startswith("axis:")]
    return [
        *COLUMNS[:2],
        *axes,
        *COLUMNS[2:],
        *results,
        *(["ppl_mean"] if any("ppl_mean" in r for r in rows) else []),
    ]


def to_csv(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(
        out, fieldnames=_columns(rows), extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def _fmt(value, kind: str = "") -> str:
    if value is None or value == "" or (isinstance(value, float) and math.isnan(value)):
        return ""
    if kind == "M":
        return f"{value / 1e6:,.2f}M"
    if kind == "ratio":
        return f"{value:.1%}"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1e4 else f"{value:.3g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def to_markdown(plan: dict, rows: list[dict], plots: list[str]) -> str:
    corpora = sorted({k[4:] for r in rows for k in r if k.startswith("ppl_") and k != "ppl_mean"})
    header = [
        "point",
        "status",
        *[f"ppl {c}" for c in corpora],
        "ppl mean",
        "f-grams",
        "K",
        "f-gram model",
        "accelerator params (non-emb.)",
        "inference MFLOPs/token",
        "table size",
        "coverage",
        "mean match",
        "train FLOPs",
    ]
    lines = [
        f"# Sweep `{plan['name']}`",
        "",
        f"{len(rows)} points ({sum(r['status'] == 'complete' for r in rows)} complete). Perplexity "
        "on each held-out corpus and their geometric mean; accelerator parameters are those kept "
        "on the accelerator at inference (the f-gram table lives in host RAM or on disk); the "
        "table size is for float32 rows; coverage and mean match length are measured on the "
        "training text.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for r in rows:
        fgram_model = (
            f"{r.get('fgram_model_size')} ({r.get('fgram_model_layers')} "
            f"layer{'' if r.get('fgram_model_layers') == 1 else 's'}, "
            f"{_fmt(r.get('fgram_model_params'), 'M')})"
            if r["scone"]
            else ""
        )
        cells = [
            r["point"],
            r["status"]
            if r["status"] != "incomplete"
            else f"incomplete (step {r['steps_done']:,} of {r['train_steps']:,})",
            *[_fmt(r.get(f"ppl_{c}")) for c in corpora],
            _fmt(r.get("ppl_mean")),
            _fmt(r.get("num_fgrams")),
            _fmt(r.get("max_n")),
            fgram_model,
            f"{_fmt(r['accelerator_params'], 'M')} "
            f"({_fmt(r['accelerator_params_non_embedding'], 'M')})"
            if r.get("accelerator_params") is not None
            else "",
            _fmt((r.get("inference_flops_per_token") or 0) / 1e6 or None),
            f"{r['table_bytes'] / 2**20:,.1f} MiB" if r.get("table_bytes") else "",
            _fmt(r.get("coverage"), "ratio"),
            _fmt(r.get("mean_match_length")),
            f"{r['train_flops']:.3g}" if r.get("train_flops") else "",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += [""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(lines) + "\n"


def write_report(sweep_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write results.csv, results.md and the plots to `out` (default SWEEP_DIR/report),
    atomically."""
    from scone_jax.sweep.plots import draw_plots

    plan, rows = gather(sweep_dir)
    out = Path(out) if out else Path(sweep_dir) / "report"
    with atomic_dir(out, overwrite=True, marker=REPORT_MARKER, kind=REPORT_KIND) as tmp:
        plots = draw_plots(rows, tmp, title=plan["name"])
        (tmp / "results.csv").write_text(to_csv(rows), encoding="utf-8")
        (tmp / "results.md").write_text(to_markdown(plan, rows, plots), encoding="utf-8")
    return out
