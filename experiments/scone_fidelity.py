"""Does SCONE beat its own baseline on text nobody tuned it on? (docs/fidelity.md)

Trains the shipped tiny presets (gpt2 and llama families) with and without SCONE on several
corpora, seeds and step counts, and reports held-out perplexity (mean and spread over seeds),
the gain over the same-family baseline, and each point's training FLOPs.

    python experiments/scone_fidelity.py grid --corpora embedded,shakespeare --variants tiny,tiny_scone \
        --seeds 0,1,2 --steps 400,1500 [--jobs 2] [--out runs/fidelity]
    python experiments/scone_fidelity.py report [--out runs/fidelity] [--results experiments/results/fidelity]

Corpora: `embedded` (the standard library's docstrings, on every install), `wikitext`
(WikiText-2 valid and test), `wikitext_valid` (the valid split alone: about as small as tiny
Shakespeare, so 1500 steps repeat it 8 times; the corpus settings for repeated text are picked
on it, not on Shakespeare), `shakespeare` (tiny Shakespeare), `libdocs` (the docstrings of the
installed numpy and matplotlib, text nobody on the project wrote), `vimdocs` (2 MB of Vim's
help files from Debian's vim-runtime: small, so 1500 steps train it for several epochs),
`pynews` (Python's release notes, NEWS.gz from Debian's python3 docs, one document per
paragraph: added after every choice, a second held-out corpus of many epochs),
`shakespeare_quarter` and `pynews_quarter` (the first quarter of their paragraphs: 1500 steps
train them for over 30 epochs, to find where the gain ends). All
but the first are read from ../shared/data or the environment and are skipped with a note
when absent.
Each corpus is tokenized once (vocab 2048, 5% of documents held out); every run of a corpus
shares that dataset and split (variants ending in _split<N> hold out other documents), and
seeds change the initialization and the data order.
"""  # noqa: E501 (the --help text, printed as is: RawDescriptionHelpFormatter)

from __future__ import annotations

import argparse
import ast
import gzip
import itertools
import json
import os
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data"

COMMON = [
    "train.eval_every=0",
    "train.eval_batches=64",
    "logging.progress=false",
    "logging.tensorboard=false",
    "checkpoint.every=100000",
]

# variant -> (preset, overrides); "<family>" variants are defined for gpt2 (tiny*) and llama
# (tiny_llama*)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "tiny": ("tiny", []),
    "tiny_x2": ("tiny", ["model.n_layers=4"]),
    # about twice the non-embedding parameters by width (d 128 -> 184: 2.07x gpt2, 1.95x llama)
    "tiny_w2": ("tiny", ["model.d_model=184"]),
    "tiny_scone": ("tiny_scone", []),
    "tiny_scone_replace": ("tiny_scone", ["fgrams.combine=replace"]),
    "tiny_scone_add": ("tiny_scone", ["fgrams.combine=add"]),
    "tiny_scone_gated": ("tiny_scone", ["fgrams.combine=gated"]),
    "tiny_scone_shuffled": ("tiny_scone", ["fgrams.permute_rows=true"]),
    "tiny_llama": ("tiny_llama", []),
    "tiny_llama_w2": ("tiny_llama", ["model.d_model=184"]),
    "tiny_llama_x2": ("tiny_llama", ["model.n_layers=4"]),  # twice the layers, for depth
    "tiny_llama_scone": ("tiny_llama_scone", []),  # a 0.5x f-gram model, S = 80K
    "tiny_llama_scone_shuffled": ("tiny_llama_scone", ["fgrams.permute_rows=true"]),
}
for size in ("0.5x", "2x", "3x"):
    VARIANTS[f"tiny_scone_{size}"] = ("tiny_scone", [f"fgrams.model_size={size}"])

# llama variants measured before its preset took S = 80K (2026-12-03): each keeps S = 20K
LLAMA_S20K: dict[str, list[str]] = {
    "tiny_llama_scone_s20k": [],  # the preset until then
    "tiny_llama_scone_s20k_shuffled": ["fgrams.permute_rows=true"],
    # the llama preset's earlier 1x f-gram model, and the control measured with it
    "tiny_llama_scone_1x": ["fgrams.model_size=1x"],
    "tiny_llama_scone_1x_shuffled": ["fgrams.model_size=1x", "fgrams.permute_rows=true"],
    "tiny_llama_scone_2x": ["fgrams.model_size=2x"],
    "tiny_llama_scone_3x": ["fgrams.model_size=3x"],
    # an f-gram model about twice the 1x one's parameters by width instead of depth
    # (projections in and out of the backbone's d 128)
    "tiny_llama_scone_w2": ["fgrams.model_size=1x", "fgrams.d_model=184", "fgrams.n_heads=4"],
    # fewer, more frequent f-grams, a shorter K, f-gram dropout (a share of matched training
    # positions fed without their f-gram): for corpora that training repeats many times
    "tiny_llama_scone_m6": ["fgrams.min_count=6"],
    "tiny_llama_scone_m12": ["fgrams.min_count=12"],
    "tiny_llama_scone_k3": ["fgrams.max_n=3"],
    "tiny_llama_scone_drop0.1": ["fgrams.drop_rate=0.1"],
    "tiny_llama_scone_drop0.3": ["fgrams.drop_rate=0.3"],
    # the presets' earlier recipe (20 warmup steps, not 100, and llama's 1x f-gram model)
    "tiny_llama_scone_warmup20": ["fgrams.model_size=1x", "optim.warmup_steps=20"],
}
for name, overrides in LLAMA_S20K.items():
    VARIANTS[name] = ("tiny_llama_scone", ["fgrams.num_fgrams=20000", *overrides])
# how many f-grams (min count 3): S = 80K is the preset; on the small corpora it keeps every
# f-gram seen 3 times (58-64K)
for size in (5, 40):
    VARIANTS[f"tiny_llama_scone_s{size}k"] = ("tiny_llama_scone", [f"fgrams.num_fgrams={size}000"])
# a narrower f-gram model (projections in and out of the backbone's d 128), since a wider one
# lost (tiny_llama_scone_w2)
for width in (64, 96):
    VARIANTS[f"tiny_llama_scone_d{width}"] = (
        "tiny_llama_scone",
        [f"fgrams.d_model={width}", "fgrams.n_heads=2"],
    )
# the f-gram model's learning rate as a multiple of the backbone's
for scale in ("0.3", "3"):
    VARIANTS[f"tiny_llama_scone_flr{scale}"] = (
        "tiny_llama_scone",
        [f"optim.fgram_lr_scale={scale}"],
    )
# f-gram dropout at a lower rate than section 4's, and K (the longest f-gram) either side of 5,
# on the S = 80K preset
VARIANTS["tiny_llama_scone_drop0.05"] = ("tiny_llama_scone", ["fgrams.drop_rate=0.05"])
for k in (4, 8):
    VARIANTS[f"tiny_llama_scone_k{k}"] = ("tiny_llama_scone", [f"fgrams.max_n={k}"])
# K = 3 was level with K = 5 at S = 20K (tiny_llama_scone_k3): the same at the preset's S = 80K
VARIANTS["tiny_llama_scone_k3_s80k"] = ("tiny_llama_scone", ["fgrams.max_n=3"])
# f-gram backoff dropout: a dropped position takes its f-gram's longest proper suffix in the
# set (a shorter context) instead of no f-gram
for rate in ("0.15", "0.3"):
    VARIANTS[f"tiny_llama_scone_backoff{rate}"] = (
        "tiny_llama_scone",
        [f"fgrams.drop_rate={rate}", "fgrams.drop_to=suffix"],
    )
# the 1x (2-layer) f-gram model with the preset's S = 80K: 0.5x was picked at S = 20K, and more
# f-grams might give a deeper model more to do; 2x and 3x for the size sweep where depth helps
for size in ("1x", "2x", "3x"):
    VARIANTS[f"tiny_llama_scone_{size}_s80k"] = ("tiny_llama_scone", [f"fgrams.model_size={size}"])
# the f-gram model's own weight decay (the backbone keeps the presets' 0.1)
for decay in ("0.3", "1.0"):
    VARIANTS[f"tiny_llama_scone_fwd{decay}"] = (
        "tiny_llama_scone",
        [f"optim.fgram_weight_decay={decay}"],
    )
# embedding dropout: a share of the f-gram embedding's features zeroed at each matched training
# position, a gentler regularizer than dropping whole positions (fgrams.drop_rate)
for rate in ("0.1", "0.3"):
    VARIANTS[f"tiny_llama_scone_edrop{rate}"] = (
        "tiny_llama_scone",
        [f"fgrams.embed_drop_rate={rate}"],
    )
# T trained by the backbone's path alone: F reads its rows without sending gradients back
VARIANTS["tiny_llama_scone_detach"] = ("tiny_llama_scone", ["fgrams.detach_table=true"])
# every f-gram seen twice or more
VARIANTS["tiny_llama_scone_m2_all"] = (
    "tiny_llama_scone",
    ["fgrams.num_fgrams=1000000", "fgrams.min_count=2"],
)
# the earlier recipe's baselines, each SCONE variant ending in _warmup20 against its own
for name in ("tiny", "tiny_scone", "tiny_llama"):
    VARIANTS[f"{name}_warmup20"] = (name, ["optim.warmup_steps=20"])
VARIANTS["tiny_lr1.5e-3_warmup20"] = ("tiny", ["optim.lr=1.5e-3", "optim.warmup_steps=20"])
# recipes run on both llama models alike, each SCONE variant against the baseline of the same
# recipe (`<name>_<tag><value>`): another held-out 5% of documents (data.seed draws the split;
# f-grams are counted on each run's own training split: how much of a corpus's result is its
# one split), the peak learning rate (the presets': 3e-3) and AdamW's weight decay (0.1)
BOTH_MODELS = {
    "split": ("data.seed", ("1", "2")),
    "lr": ("optim.lr", ("1e-3", "1.5e-3", "2e-3", "4.5e-3")),
    "wd": ("optim.weight_decay", ("0.03", "0.3", "1.0")),
}
for tag, (key, values) in BOTH_MODELS.items():
    for value in values:
        for name in ("tiny_llama", "tiny_llama_scone"):
            VARIANTS[f"{name}_{tag}{value}"] = (name, [f"{key}={value}"])
# suffix rows: a matched position reads the sum of F over its f-gram and its suffixes in the
# set; the llama preset since 2026-12-07 (docs/fidelity.md section 16), with its control
VARIANTS["tiny_llama_scone_suffix"] = ("tiny_llama_scone", ["fgrams.suffix_rows=true"])
VARIANTS["tiny_llama_scone_suffix_shuffled"] = (
    "tiny_llama_scone",
    ["fgrams.suffix_rows=true", "fgrams.permute_rows=true"],
)
VARIANTS["tiny_scone_suffix"] = ("tiny_scone", ["fgrams.suffix_rows=true"])
# every other llama SCONE variant was measured before the preset took suffix rows: each keeps
# them off, so it reruns as recorded (`tiny_llama_scone` is the preset as it was until then)
for name, (preset, overrides) in list(VARIANTS.items()):
    if preset == "tiny_llama_scone" and not name.startswith("tiny_llama_scone_suffix"):
        VARIANTS[name] = (preset, ["fgrams.suffix_rows=false", *overrides])
# a variant ending in one of these is paired with its family's baseline of the same recipe
RECIPE_SUFFIXES = (
    "_warmup20",
    *(f"_{tag}{value}" for tag, (_, values) in BOTH_MODELS.items() for value in values),
)


def baseline_of(variant: str) -> str:
    family = "tiny_llama" if variant.startswith("tiny_llama") else "tiny"
    return family + next((s for s in RECIPE_SUFFIXES if variant.endswith(s)), "")


# plain-text corpora under ../shared/data, cut into documents at blank lines; WikiText-2's
# train split is not on these machines, so `wikitext` is valid + test and `wikitext_valid` the
# valid split alone (as small as Shakespeare, other text)
SHARED_TEXT = {
    "wikitext": ("wikitext-2/valid.txt", "wikitext-2/test.txt"),
    "wikitext_valid": ("wikitext-2/valid.txt",),
    "shakespeare": ("tinyshakespeare/input.txt",),
}
# the first quarter of a corpus's paragraphs: four times the epochs at the same steps
QUARTER, QUARTERED = "_quarter", ("shakespeare", "pynews")
CORPORA = (
    "embedded",
    *SHARED_TEXT,
    "libdocs",
    "vimdocs",
    "pynews",
    *(name + QUARTER for name in QUARTERED),
)
SYSTEM_SHARE = Path("/usr/share")  # where Debian packages put vimdocs' and pynews' text


def corpus_args(name: str, work: Path) -> list[str] | None:
    """`scone-jax tokenize` arguments for a corpus, or None when it is not on this machine."""
    if name == "embedded":
        return ["--max-default-corpus-mb", "12"]
    if name in SHARED_TEXT:
        paths = [SHARED / rel for rel in SHARED_TEXT[name]]
        if not all(p.is_file() for p in paths):
            return None
        return [
            *itertools.chain.from_iterable(("--corpus", str(p)) for p in paths),
            "--doc-split",
            "blank_line",
        ]
    if name == "libdocs":
        out = work / "libdocs.jsonl"
        if not out.is_file():
            write_library_docstrings(out, ("numpy", "matplotlib"), max_bytes=12_000_000)
        return ["--corpus", str(out)]
    if name == "vimdocs":  # Vim's help (Debian's vim-runtime): small, so trained many epochs
        out = work / "vimdocs.jsonl"
        if not out.is_file():
            files = sorted(SYSTEM_SHARE.glob("vim/vim*/doc/*.txt"))
            if not files:
                return None
            write_text_files(out, files, max_bytes=2_000_000)
        return ["--corpus", str(out)]
    if name == "pynews":  # Python's release notes (Debian's python3.X docs): small, many epochs
        out = work / "pynews.txt"
        if not out.is_file():
            files = sorted(SYSTEM_SHARE.glob("doc/python3.*/NEWS.gz"))
            if not files:
                return None
            tmp = out.with_suffix(".tmp")
            tmp.write_bytes(gzip.decompress(files[-1].read_bytes()))
            tmp.rename(out)
        return ["--corpus", str(out), "--doc-split", "blank_line"]
    if name.endswith(QUARTER) and name.removesuffix(QUARTER) in QUARTERED:
        whole = corpus_args(name.removesuffix(QUARTER), work)
        if whole is None:
            return None
        out = work / f"{name}.txt"
        if not out.is_file():
            text = Path(whole[1]).read_text(encoding="utf-8")
            paragraphs = [p for p in text.split("\n\n") if p.strip()]
            tmp = out.with_suffix(".tmp")
            tmp.write_text("\n\n".join(paragraphs[: len(paragraphs) // 4]) + "\n")
            tmp.rename(out)
        return ["--corpus", str(out), "--doc-split", "blank_line"]
    raise SystemExit(f"unknown corpus {name!r} (expected one of {', '.join(CORPORA)})")


def write_text_files(out: Path, files: list[Path], max_bytes: int) -> None:
    """One JSON line per text file, in the given order, until `max_bytes` of text."""
    budget, lines = max_bytes, []
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace").strip()
        if text and budget > 0:
            lines.append(json.dumps({"text": text[:budget]}))
            budget -= len(text[:budget].encode())
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(out)


def write_library_docstrings(out: Path, packages: tuple[str, ...], max_bytes: int) -> None:
    """One JSON line per module of the installed `packages`: its docstrings, in source order."""
    import importlib.util

    budget, lines = max_bytes, []
    for package in packages:
        spec = importlib.util.find_spec(package)
        root = Path(spec.origin).parent
        for path in sorted(root.rglob("*.py")):
            if "tests" in path.parts:
                continue
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            docs = [
                ast.get_docstring(n)
                for n in ast.walk(tree)
                if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            ]
            text = "\n\n".join(d.strip() for d in docs if d and d.strip())
            if text and budget > 0:
                lines.append(json.dumps({"text": text}))
                budget -= len(text.encode())
    tmp = out.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.rename(out)


def scone_jax(*args: str, log: Path | None = None) -> None:
    cmd = [sys.executable, "-m", "scone_jax.cli.main", *args]
    # one device, one thread: several runs side by side on a few cores waste less to contention
    env = {
        **os.environ,
        "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
    }
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    with open(log or os.devnull, "w") as fh:
        code = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    if code:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}; log: {log}")


def dataset_for(corpus: str, out: Path) -> Path | None:
    target = out / "data" / corpus
    if (target / "meta.json").is_file() or (target / "tokens.bin").exists():
        return target
    args = corpus_args(corpus, out)
    if args is None:
        print(f"skipping corpus {corpus}: not on this machine", flush=True)
        return None
    target.parent.mkdir(parents=True, exist_ok=True)
    scone_jax(
        "tokenize",
        *args,
        "--vocab-size",
        "2048",
        "--out",
        str(target),
        "--no-progress",
        log=out / "data" / f"{corpus}.log",
    )
    return target


def run_point(out: Path, dataset: Path, corpus: str, variant: str, seed: int, steps: int) -> Path:
    preset, overrides = VARIANTS[variant]
    run_dir = out / "runs" / corpus / f"{variant}_s{seed}_{steps}"
    if not (run_dir / "final_eval.json").is_file():
        scone_jax(
            "train",
            preset,
            *COMMON,
            *overrides,
            f"data.dataset={dataset}",
            f"train.seed={seed}",
            f"train.steps={steps}",
            f"run_dir={run_dir}",
            log=run_dir.parent / f"{run_dir.name}.log",  # the name may hold a dot (drop0.1)
        )
    return run_dir


def grid(args) -> None:
    out = Path(args.out)
    points = []
    for corpus in args.corpora.split(","):
        dataset = dataset_for(corpus, out)
        if dataset is None:
            continue
        for variant, seed, steps in itertools.product(
            args.variants.split(","), args.seeds.split(","), args.steps.split(",")
        ):
            points.append((dataset, corpus, variant, int(seed), int(steps)))
    points.sort(
        key=lambda p: (p[4], p[3])
    )  # shorter runs and lower seeds first: partial grids are balanced

    def one(point):
        run_dir = run_point(out, *point)
        print(f"done {run_dir}: {summarize_run(run_dir)['perplexity']:.2f}", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        for _ in pool.map(one, points):
            pass


def summarize_run(run_dir: Path) -> dict:
    final = json.loads((run_dir / "final_eval.json").read_text())["results"]["heldout"]
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if m.get("kind", "train") == "train" and "step_flops" in m]
    return {
        "perplexity": final["perplexity"],
        "bits_per_byte": final["bits_per_byte"],
        "train_flops": float(sum(m["step_flops"] for m in train)),
        "match_rate": float(np.mean([m["match_rate"] for m in train]))
        if train and "match_rate" in train[0]
        else 0.0,
        "final_train_loss": float(np.mean([m["loss"] for m in train[-20:]])),
    }


def point_key(row: dict) -> tuple:
    return row["corpus"], row["variant"], row["seed"], row["steps"]


def report(args) -> None:
    """Tables of every finished run: those under `--out`, plus the rows `runs.json` already
    records from runs whose folders live on another machine (a fresh run of a point wins)."""
    out, results = Path(args.out), Path(args.results)
    recorded = results / "runs.json"
    earlier = json.loads(recorded.read_text()) if recorded.is_file() else []
    rows = []
    for run_dir in sorted((out / "runs").glob("*/*_s*_*")):
        if not (run_dir / "final_eval.json").is_file():
            continue
        variant_seed, steps = run_dir.name.rsplit("_", 1)
        variant, seed = variant_seed.rsplit("_s", 1)
        rows.append(
            {
                "corpus": run_dir.parent.name,
                "variant": variant,
                "seed": int(seed),
                "steps": int(steps),
                **summarize_run(run_dir),
            }
        )
    fresh = {point_key(r) for r in rows}
    rows = sorted([*rows, *(r for r in earlier if point_key(r) not in fresh)], key=point_key)
    results.mkdir(parents=True, exist_ok=True)
    recorded.write_text(json.dumps(rows, indent=1) + "\n")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["corpus"], r["steps"], r["variant"]), []).append(r)
    lines = [
        "| corpus | steps | variant | seeds | held-out perplexity (mean ± sd) | vs baseline (mean, "
        "min..max over seeds) | training FLOPs vs baseline | match rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    summary = []
    for (corpus, steps, variant), runs in sorted(groups.items()):
        ppl = np.array([r["perplexity"] for r in runs])
        base = {r["seed"]: r for r in groups.get((corpus, steps, baseline_of(variant)), [])}
        paired = [
            r["perplexity"] / base[r["seed"]]["perplexity"] - 1 for r in runs if r["seed"] in base
        ]
        flops = (
            np.mean([r["train_flops"] for r in runs])
            / np.mean([b["train_flops"] for b in base.values()])
            if base
            else float("nan")
        )
        gain = (
            f"{100 * np.mean(paired):+.1f}% ({100 * min(paired):+.1f}..{100 * max(paired):+.1f})"
            if paired and variant != baseline_of(variant)
            else ""
        )
        seeds = f"{len(runs)}" + (f" ({len(paired)} paired)" if 0 < len(paired) < len(runs) else "")
        lines.append(
            f"| {corpus} | {steps} | {variant} | {seeds} | {ppl.mean():.2f} ± "
            f"{ppl.std(ddof=1) if len(ppl) > 1 else 0:.2f} | {gain} | {flops:.2f}x | "
            f"{np.mean([r['match_rate'] for r in runs]):.2f} |"
        )
        summary.append(
            {
                "corpus": corpus,
                "steps": steps,
                "variant": variant,
                "seeds": len(runs),
                "perplexity_mean": float(ppl.mean()),
                "perplexity_sd": float(ppl.std(ddof=1)) if len(ppl) > 1 else 0.0,
                "change_vs_baseline": float(np.mean(paired)) if paired else None,
                "change_range": [float(min(paired)), float(max(paired))] if paired else None,
                "paired_seeds": len(paired),
                "train_flops_vs_baseline": float(flops),
            }
        )
    plot_changes(summary, results / "change_vs_baseline.png")
    (results / "presets.md").write_text(preset_table(summary) + "\n")
    plot_cost_curve(rows, "wikitext", 1500, results / "cost_curve_wikitext_llama.png")
    (results / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (results / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


# the proof's corpora (docs/fidelity.md, "At a glance"): the quarter corpora and the picking
# split wikitext_valid are diagnoses, not proof
PROOF_CORPORA = ("embedded", "wikitext", "shakespeare", "libdocs", "vimdocs", "pynews")
# the shipped presets' variants: llama's preset has suffix rows since 2026-12-07
SHIPPED = {"gpt2": ("tiny", "tiny_scone"), "llama": ("tiny_llama", "tiny_llama_scone_suffix")}


def preset_table(summary: list[dict]) -> str:
    """The shipped SCONE presets against their baselines on the proof's corpora: one row per
    (corpus, steps), each family's mean perplexities and its paired change over the seeds both
    ran (the seeds column counts those pairs)."""
    cell = {(r["corpus"], r["steps"], r["variant"]): r for r in summary}
    header = "| corpus | steps |" + "".join(
        f" {family} baseline | {family} SCONE | {family} change (mean; min..max) | seeds |"
        for family in SHIPPED
    )
    lines = [header, "|---|---|" + "---|---|---|---|" * len(SHIPPED)]
    for steps in sorted({r["steps"] for r in summary}):
        for corpus in PROOF_CORPORA:
            parts = []
            for baseline, scone in SHIPPED.values():
                base, ours = cell.get((corpus, steps, baseline)), cell.get((corpus, steps, scone))
                if base is None or ours is None or ours["change_range"] is None:
                    parts.append(" | | | |")
                    continue
                low, high = (100 * x for x in ours["change_range"])
                parts.append(
                    f" {base['perplexity_mean']:.2f} | {ours['perplexity_mean']:.2f} | "
                    f"{100 * ours['change_vs_baseline']:+.1f}% ({low:+.1f}..{high:+.1f}) | "
                    f"{ours['paired_seeds']} |"
                )
            if any(part != " | | | |" for part in parts):
                lines.append(f"| {corpus} | {steps} |" + "".join(parts))
    return "\n".join(lines)


# the plot shows the shipped presets (and llama's earlier one); summary.md has every variant
PLOTTED = ("tiny_scone", "tiny_llama_scone", "tiny_llama_scone_s20k")


def plot_changes(summary: list[dict], out: Path) -> None:
    """One bar per (corpus, steps) and plotted variant: held-out perplexity change against the
    baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [r for r in summary if r["change_vs_baseline"] is not None and r["variant"] in PLOTTED]
    if not points:
        return
    cells = sorted({(r["corpus"], r["steps"]) for r in points})
    variants = sorted({r["variant"] for r in points})
    width = 0.8 / len(variants)
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(cells)), 4))
    for k, variant in enumerate(variants):
        values = {
            (r["corpus"], r["steps"]): 100 * r["change_vs_baseline"]
            for r in points
            if r["variant"] == variant
        }
        xs = [i + k * width for i, c in enumerate(cells) if c in values]
        ax.bar(xs, [values[c] for c in cells if c in values], width, label=variant)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.axhline(-5, color="gray", linewidth=0.8, linestyle="--", label="-5% target")
    ax.set_xticks(
        [i + 0.4 - width / 2 for i in range(len(cells))], [f"{c}\n{s} steps" for c, s in cells]
    )
    ax.set_ylabel("held-out perplexity vs baseline (%)")
    ax.set_title("SCONE against its own baseline (mean over seeds; lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


# section 14's setting: llama's backbone doubled two ways, and the f-gram model from 0.5x to 3x at
# the preset's S = 80K and at S = 20K
COST_CURVE_SERIES = {
    "baseline, doubled by depth or width": ("tiny_llama", "tiny_llama_x2", "tiny_llama_w2"),
    "SCONE, S = 80K, f-gram model 0.5x..3x": (
        "tiny_llama_scone",
        *(f"tiny_llama_scone_{size}_s80k" for size in ("1x", "2x", "3x")),
    ),
    "SCONE, S = 20K, f-gram model 0.5x..3x": (
        "tiny_llama_scone_s20k",
        *(f"tiny_llama_scone_{size}" for size in ("1x", "2x", "3x")),
    ),
}


def plot_cost_curve(rows: list[dict], corpus: str, steps: int, out: Path) -> None:
    """Held-out perplexity against training FLOPs (relative to the baseline's) for each series
    of COST_CURVE_SERIES, seeds as dots and their means joined: which way to spend compute, a
    bigger backbone or a bigger f-gram model."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [r for r in rows if r["corpus"] == corpus and r["steps"] == steps]
    base_flops = [r["train_flops"] for r in runs if r["variant"] == "tiny_llama"]
    if not base_flops:
        return
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, (label, variants) in enumerate(COST_CURVE_SERIES.items()):
        color, means = f"C{k}", []
        for variant in variants:
            points = [r for r in runs if r["variant"] == variant]
            if not points:
                continue
            x = np.mean([r["train_flops"] for r in points]) / np.mean(base_flops)
            y = [r["perplexity"] for r in points]
            ax.plot([x] * len(y), y, "o", color=color, alpha=0.3, markersize=4)
            name = {"tiny_llama": "baseline", "tiny_llama_scone": "the SCONE preset"}.get(
                variant, variant.removeprefix("tiny_llama_")
            )
            ax.annotate(
                name, (x, np.mean(y)), fontsize=7, xytext=(4, 4), textcoords="offset points"
            )
            means.append((x, np.mean(y)))
        if means:
            style = "s-" if label.startswith("SCONE") else "s"
            ax.plot(*zip(*means), style, color=color, label=label)
    ax.set_xlabel("training FLOPs vs the baseline")
    ax.set_ylabel("held-out perplexity (seeds as dots)")
    ax.set_title(f"llama on {corpus}, {steps} steps: where extra compute goes (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("grid", help="train every (corpus, variant, seed, steps) point not yet done")
    g.add_argument("--corpora", default="embedded,wikitext,shakespeare,libdocs")
    g.add_argument("--variants", default="tiny,tiny_scone,tiny_llama,tiny_llama_scone")
    g.add_argument("--seeds", default="0,1,2")
    g.add_argument("--steps", default="400,1500")
    g.add_argument("--jobs", type=int, default=2)
    g.add_argument("--out", default="runs/fidelity")
    r = sub.add_parser("report", help="tables of what has finished")
    r.add_argument("--out", default="runs/fidelity")
    r.add_argument("--results", default=str(REPO / "experiments" / "results" / "fidelity"))
    args = parser.parse_args()
    grid(args) if args.command == "grid" else report(args)


if __name__ == "__main__":
    main()
