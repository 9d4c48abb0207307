"""The plots of a sweep report: held-out perplexity against each axis the sweep varied.

Against the number of f-grams, the f-gram model size and K, SCONE points form one line per
setting of the other axes and the baselines are horizontal lines (the paper's Figure 2); against
accelerator-resident parameters every point is drawn and the baselines are marked (Figure 4).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

AXES = (  # (file, x column, the column whose variation calls for the plot, x label, log x,
    #        columns that tell the lines apart)
    (
        "ppl_vs_num_fgrams.png",
        "num_fgrams",
        "num_fgrams",
        "number of f-grams (table rows)",
        True,
        ("fgram_model_size", "max_n", "combine"),
    ),
    (
        "ppl_vs_fgram_model_size.png",
        "fgram_model_params",
        "fgram_model_layers",  # not K's position rows
        "f-gram model parameters (training only)",
        False,
        ("num_fgrams", "max_n", "combine"),
    ),
    (
        "ppl_vs_max_n.png",
        "max_n",
        "max_n",
        "maximum f-gram length K",
        False,
        ("num_fgrams", "fgram_model_size", "combine"),
    ),
)
LABELS = {"fgram_model_size": "f-gram model", "max_n": "K", "combine": "", "num_fgrams": "S"}


def _complete(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == "complete" and r.get("ppl_mean") is not None]


def _series_label(key: tuple, names: tuple[str, ...], varying: set[str]) -> str:
    parts = [
        f"{LABELS[n]} {v}".strip() if LABELS[n] else str(v)
        for n, v in zip(names, key)
        if n in varying
    ]
    return ", ".join(parts) or "SCONE"


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _panels(rows: list[dict]) -> list[tuple[str, str]]:
    """(column, title): the geometric mean, then each corpus when there are several."""
    corpora = sorted({k for r in rows for k in r if k.startswith("ppl_") and k != "ppl_mean"})
    mean = [("ppl_mean", "geometric mean over held-out corpora")]
    return mean + [(c, c[4:]) for c in corpora] if len(corpora) > 1 else mean


def _axis_plot(
    rows: list[dict],
    path: Path,
    x: str,
    varies: str,
    xlabel: str,
    log_x: bool,
    group_by: tuple[str, ...],
    title: str,
) -> bool:
    scone = [r for r in rows if r["scone"] and r.get(x) is not None]
    if len({r.get(varies) for r in scone}) < 2:
        return False
    varying = {n for n in group_by if len({r.get(n) for r in scone}) > 1}
    lines = defaultdict(list)
    for r in scone:
        lines[tuple(r.get(n) for n in group_by)].append(r)
    panels = _panels(rows)
    plt = _plt()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (column, panel_title) in zip(axes[0], panels):
        for key, points in sorted(lines.items(), key=lambda kv: str(kv[0])):
            points.sort(key=lambda r: r[x])
            ax.plot(
                [r[x] for r in points],
                [r[column] for r in points],
                "o-",
                label=_series_label(key, group_by, varying),
            )
        for i, r in enumerate(r for r in rows if not r["scone"]):
            ax.axhline(
                r[column],
                ls="--",
                color=f"C{7 + i % 3}",
                label=f"{r['point']} ({r['accelerator_params_non_embedding'] / 1e6:,.2f}M "
                "non-emb.)",
            )
        if log_x:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out perplexity")
        ax.set_title(panel_title)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)
    return True


def _params_plot(rows: list[dict], path: Path, title: str) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in rows:
        marker, color = ("o", "C0") if r["scone"] else ("X", "k")
        ax.scatter(r["accelerator_params"] / 1e6, r["ppl_mean"], marker=marker, color=color, s=45)
        ax.annotate(
            r["point"],
            (r["accelerator_params"] / 1e6, r["ppl_mean"]),
            fontsize=7,
            xytext=(4, 3),
            textcoords="offset points",
        )
    ax.scatter([], [], marker="o", color="C0", label="SCONE (f-gram table off the accelerator)")
    ax.scatter([], [], marker="X", color="k", label="baseline")
    ax.set_xlabel("accelerator-resident parameters at inference (M)")
    ax.set_ylabel("held-out perplexity (geometric mean over corpora)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)


def draw_plots(rows: list[dict], out_dir: Path, title: str) -> list[str]:
    """Draw every plot the finished points support; returns the file names written."""
    rows = _complete(rows)
    written = []
    for name, x, varies, xlabel, log_x, group_by in AXES:
        if _axis_plot(rows, out_dir / name, x, varies, xlabel, log_x, group_by, title):
            written.append(name)
    sized = [r for r in rows if "accelerator_params" in r]  # a run_info.json says its vocabulary
    if sized:
        _params_plot(sized, out_dir / "ppl_vs_accelerator_params.png", title)
        written.append("ppl_vs_accelerator_params.png")
    return written
