"""Sweep files: expansion into points, run directories and commands, for every shipped sweep."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from scone_jax.cli.main import main
from scone_jax.config import load_config, parse_overrides
from scone_jax.config.load import PRESET_DIR
from scone_jax.errors import UserError
from scone_jax.sweep.plan import plan_sweep
from scone_jax.sweep.runner import LAUNCHERS
from scone_jax.sweep.spec import format_value, load_sweep

SWEEPS = sorted((PRESET_DIR / "sweeps").glob("*.yaml"))


def test_paper_and_cpu_sweeps_for_every_axis_are_shipped():
    names = {p.stem for p in SWEEPS}
    for axis in ("num_fgrams", "model_size", "max_n"):
        assert {f"cpu_{axis}", f"paper_{axis}"} <= names


def _expected_points(raw: dict) -> dict[str, dict]:
    """Point name -> overrides, derived independently of the library's expansion."""
    points = {name: dict(o) for name, o in (raw.get("points") or {}).items()}
    grid = raw.get("grid") or {}
    for combo in itertools.product(*grid.values()) if grid else []:
        name = "_".join(f"{k.split('.')[-1]}-{v}" for k, v in zip(grid, combo))
        points[name] = dict(zip(grid, combo))
    return points


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_shipped_sweep_expands_to_its_points(path, tmp_path):
    raw = yaml.safe_load(path.read_text())
    expected = _expected_points(raw)
    plan = plan_sweep(load_sweep(path), tmp_path / "sw")
    assert [pp.point.name for pp in plan.points] == list(expected)
    baselines = 0
    for pp in plan.points:
        cfg = pp.config
        cfg.validate()
        assert Path(cfg.run_dir) == tmp_path / "sw" / "points" / pp.point.name
        for key, value in expected[
            pp.point.name
        ].items():  # each override reached the resolved config
            section, field = key.split(".")
            assert getattr(getattr(cfg, section), field) == value, (pp.point.name, key)
        baselines += not cfg.fgrams.enabled
        if cfg.fgrams.enabled:  # every SCONE point reads a shared f-gram set prepared by the sweep
            assert (
                Path(cfg.fgrams.fgram_set).parent
                == tmp_path / "sw" / "data" / Path(cfg.data.dataset).parent.name / "fgrams"
            )
        assert [Path(p).name for p in cfg.data.eval_datasets] == list(raw["eval_corpora"])
    # the same backbone and the one with twice the non-embedding parameters
    depths = sorted(
        {pp.config.model.n_layers for pp in plan.points if not pp.config.fgrams.enabled}
    )
    assert baselines >= 2 and depths == [depths[0], 2 * depths[0]]
    assert all(
        pp.config.model.n_layers == depths[0] for pp in plan.points if pp.config.fgrams.enabled
    )
    train = [s for s in plan.steps if s.kind == "train"]
    assert len(train) == len(expected) and all(s.argv[0] == "train" for s in train)
    assert {s.kind for s in plan.steps[: len(plan.steps) - len(train)]} <= {"tokenize", "fgrams"}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_dry_run_prints_every_command_and_writes_nothing(launcher, tmp_path, capsys):
    path = PRESET_DIR / "sweeps" / "cpu_num_fgrams.yaml"
    out = tmp_path / "sw"
    assert (
        main(
            [
                "sweep",
                str(path),
                "--dry-run",
                "--out",
                str(out),
                "--launcher",
                launcher,
                "--launcher-args=--nodes 2" if launcher == "slurm" else "--launcher-args=",
            ]
        )
        == 0
    )
    assert not out.exists()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if not ln.startswith("#")]
    plan = plan_sweep(load_sweep(path), out)
    assert len(lines) == len(plan.steps)
    for line, step in zip(lines, plan.steps):
        assert line.endswith(" ".join(step.argv[-2:])) or step.argv[-1] in line
        if step.kind != "train" or launcher == "local":
            assert line.startswith("scone-jax " + step.argv[0])
        else:
            script = {"slurm": "slurm_submit.py", "tpu": "tpu_vm.sh", "k8s": "k8s_jobset.py"}[
                launcher
            ]
            assert line.split()[0].endswith(f"launch/{script}")
            assert f"run_dir={out}/points/{step.point}" in line


@pytest.mark.parametrize(
    "launcher,extra",
    [
        ("slurm", ["--nodes", "2"]),
        ("k8s", ["--image", "img", "--hosts", "2"]),
        ("tpu", ["--tpu", "t1", "--zone", "z"]),
    ],
)
def test_launcher_commands_are_accepted_by_the_launch_scripts(launcher, extra, tmp_path):
    from scone_jax.sweep.runner import launcher_command

    plan = plan_sweep(load_sweep(PRESET_DIR / "sweeps" / "cpu_model_size.yaml"), tmp_path / "sw")
    step = next(s for s in plan.steps if s.kind == "train")
    command = launcher_command(step, launcher, plan.spec.name, extra)
    command.insert(1, "--dry-run")  # every launch/ script prints instead of submitting
    runner = ["bash"] if command[0].endswith(".sh") else [sys.executable]
    done = subprocess.run(runner + command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"run_dir={tmp_path}/sw/points/{step.point}" in done.stdout


def test_format_value_round_trips_through_overrides(rng):
    values = [
        int(rng.integers(-(10**9), 10**9)),
        float(rng.normal()) * 10 ** int(rng.integers(-8, 8)),
        True,
        "0.5x",
        "a: b",
        "run dir/with space",
        "${x}",
        "",
        ["a.txt", "b c/*.txt"],
        {"mlp": None},
        3e-4,
        [int(v) for v in rng.integers(0, 100, 3)],
    ]
    for value in values:
        assert parse_overrides([f"k={format_value(value)}"])["k"] == value, value


def _write(tmp_path, text: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text,message",
    [
        ("config: tiny\ngrid: {fgrams.num_fgrams: [1, 2]}\nbogus: 1\n", "unknown key"),
        ("grid: {fgrams.num_fgrams: [1, 2]}\n", "missing 'config'"),
        ("config: tiny\n", "no points"),
        ("config: tiny\ngrid: {fgrams.num_fgrams: []}\n", "non-empty list"),
        ("config: tiny\npoints: {a/b: {}}\n", "invalid"),
        ("config: tiny\npoints: {num_fgrams-1: {}}\ngrid: {fgrams.num_fgrams: [1]}\n", "repeated"),
        (
            "config: tiny\n"
            "eval_corpora: {x: '${SCONE_TEST_UNSET_VARIABLE}/a.txt'}\n"
            "points: {a: {}}\n",
            "SCONE_TEST_UNSET_VARIABLE",
        ),
        ("config: no_such_preset\npoints: {a: {}}\n", "no_such_preset"),
        ("config: tiny\npoints: {a: {train.steps: -1}}\n", "sweep point a: .*train.steps=-1"),
        ("config: tiny\npoints: {a: {run_dir: x}}\n", "sweep point a: run_dir is the sweep's"),
        ("config: tiny\npoints: {a: {}, a: {train.steps: 3}}\n", "key 'a' is repeated"),
        ("config: tiny\npoints: !!python/object:os.system {}\n", "not valid YAML"),
    ],
)
def test_bad_sweep_files_are_one_line_errors(tmp_path, text, message, monkeypatch):
    monkeypatch.delenv("SCONE_TEST_UNSET_VARIABLE", raising=False)
    with pytest.raises(UserError, match=message.replace("$", r"\$")) as e:
        plan_sweep(load_sweep(_write(tmp_path, text)), tmp_path / "out")
    assert "\n" not in str(e.value)


def test_a_sweep_planned_from_anywhere_names_the_same_absolute_paths(tmp_path, monkeypatch):
    """A relative --out gives the configs an absolute run_dir and dataset, so the sweep can be
    rerun, evaluated or reported from any working directory."""
    path = _write(tmp_path, "config: tiny\npoints: {a: {data.dataset: ds}}\n")
    monkeypatch.chdir(tmp_path)
    relative = plan_sweep(load_sweep(path), "out").points[0].config
    monkeypatch.chdir(tmp_path.parent)
    absolute = plan_sweep(load_sweep(path), tmp_path / "out").points[0].config
    assert relative.run_dir == absolute.run_dir == str(tmp_path / "out" / "points" / "a")
    assert relative.data.dataset == str(tmp_path / "ds")  # the dataset the planner meant


def test_variables_expand_with_defaults_and_environment(tmp_path, monkeypatch):
    text = "config: tiny\neval_corpora: {x: '${SCONE_TEST_DIR:-fallback}/a.txt'}\npoints: {a: {}}\n"
    monkeypatch.delenv("SCONE_TEST_DIR", raising=False)
    assert load_sweep(_write(tmp_path, text)).eval_corpora == {"x": "fallback/a.txt"}
    monkeypatch.setenv("SCONE_TEST_DIR", "/data")
    assert load_sweep(_write(tmp_path, text)).eval_corpora == {"x": "/data/a.txt"}


def test_changed_point_config_is_refused_before_anything_runs_once_the_point_started(tmp_path):
    """A point that wrote nothing but its config (a sweep stopped before it, by a missing corpus
    say) takes the corrected one; a point that started keeps its own."""
    path = _write(tmp_path, "config: tiny\npoints: {a: {train.steps: 5}}\n")
    plan_sweep(load_sweep(path), tmp_path / "out").write()
    path.write_text("config: tiny\npoints: {a: {train.steps: 6}}\n")
    plan_sweep(load_sweep(path), tmp_path / "out").write()
    assert load_config(tmp_path / "out" / "points" / "a" / "config.yaml").train.steps == 6
    (tmp_path / "out" / "points" / "a" / "metrics.jsonl").write_text("")  # it started
    path.write_text("config: tiny\npoints: {a: {train.steps: 7}}\n")
    with pytest.raises(UserError, match=r"sweep point a: .* \(differs in train.steps\)"):
        plan_sweep(load_sweep(path), tmp_path / "out").write()


def test_grid_is_the_full_cartesian_product(tmp_path, rng):
    sizes = [f"{x}x" for x in sorted(set(rng.choice([0.5, 1, 2, 3], 3).tolist()))]
    counts = sorted({int(v) for v in rng.integers(10, 10**6, 3)})
    text = yaml.safe_dump(
        {"config": "tiny_scone", "grid": {"fgrams.num_fgrams": counts, "fgrams.model_size": sizes}}
    )
    plan = plan_sweep(load_sweep(_write(tmp_path, text)), tmp_path / "out")
    got = {(pp.config.fgrams.num_fgrams, pp.config.fgrams.model_size) for pp in plan.points}
    assert got == set(itertools.product(counts, sizes)) and len(plan.points) == len(got)
    assert len({s.output for s in plan.steps if s.kind == "fgrams"}) == len(
        counts
    )  # shared across sizes
    assert np.all([s.kind == "tokenize" for s in plan.steps[:1]])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--heldout-fraction", "1.5"], "--heldout-fraction 1.5 (expected 0 < F < 1)"),
        (["--heldout-fraction", "-0.1"], "--heldout-fraction -0.1 (expected 0 < F < 1)"),
    ],
)
def test_fgrams_build_heldout_fraction_errors(markov_dataset, tmp_path, capsys, args, message):
    out = tmp_path / "fg"
    assert (
        main(
            ["fgrams", "build", str(markov_dataset.path), "--out", str(out), "--no-progress", *args]
        )
        == 2
    )
    assert message in capsys.readouterr().err and not out.exists()


def test_fgrams_build_heldout_fraction_needs_a_dataset(tmp_path, capsys):
    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(100) % 7)
    assert (
        main(
            [
                "fgrams",
                "build",
                "--token-ids",
                str(ids),
                "--heldout-fraction",
                "0.1",
                "--out",
                str(tmp_path / "fg"),
                "--no-progress",
            ]
        )
        == 2
    )
    assert "--heldout-fraction needs a tokenized DATASET" in capsys.readouterr().err


def test_report_of_an_unstarted_sweep_lists_points_as_incomplete_or_missing(tmp_path):
    import csv
    import shutil

    from scone_jax.sweep.report import write_report

    path = _write(
        tmp_path,
        "config: tiny_scone\npoints: {base: {fgrams.enabled: false}}\n"
        "grid: {fgrams.num_fgrams: [10, 20]}\n",
    )
    plan = plan_sweep(load_sweep(path), tmp_path / "out")
    plan.write()
    shutil.rmtree(tmp_path / "out" / "points" / "num_fgrams-20")
    report = write_report(tmp_path / "out")
    rows = list(csv.DictReader((report / "results.csv").open()))
    assert [(r["point"], r["status"]) for r in rows] == [
        ("base", "incomplete"),
        ("num_fgrams-10", "incomplete"),
        ("num_fgrams-20", "missing"),
    ]
    assert "| num_fgrams-20 | missing |" in (report / "results.md").read_text()
    assert not list(report.glob("*.png"))  # nothing finished: nothing to plot
    shutil.copytree(tmp_path / "out", tmp_path / "copy")  # a copy reports its own points
    shutil.rmtree(tmp_path / "copy" / "points" / "base")
    rows = list(csv.DictReader((write_report(tmp_path / "copy") / "results.csv").open()))
    assert [r["status"] for r in rows] == ["missing", "incomplete", "missing"]


def test_an_eval_corpus_name_given_to_another_file_is_tokenized_anew(tmp_path):
    """The eval corpora's datasets are keyed by their files too: renaming `x` from a.txt to
    b.txt must not serve the old tokens under the new file's name (the set keeps its name)."""
    text = "config: tiny\neval_corpora: {{x: {path}}}\npoints: {{a: {{}}}}\n"
    first = plan_sweep(
        load_sweep(_write(tmp_path, text.format(path=tmp_path / "a.txt"))), tmp_path / "sw"
    )
    (tokenized,) = [s for s in first.steps if s.name.endswith("/x")]
    tokenized.output.mkdir(parents=True)
    (tokenized.output / "meta.json").write_text("{}")  # as if it had run
    assert tokenized.done
    again = plan_sweep(
        load_sweep(_write(tmp_path, text.format(path=tmp_path / "b.txt"))), tmp_path / "sw"
    )
    (retokenize,) = [s for s in again.steps if s.name.endswith("/x")]
    assert retokenize.output != tokenized.output and not retokenize.done
    assert retokenize.output.name == "x" and str(tmp_path / "b.txt") in retokenize.argv
    (cfg,) = [pp.config for pp in again.points]
    assert cfg.data.eval_datasets == [str(retokenize.output)]


def test_a_dry_run_warns_of_a_corpus_a_real_run_would_stop_at(tmp_path, capsys):
    (tmp_path / "here.txt").write_text("some text\n")
    here, gone = tmp_path / "here.txt", tmp_path / "gone.txt"
    text = f"config: tiny\neval_corpora: {{here: {here}, gone: {gone}}}\npoints: {{a: {{}}}}\n"
    assert (
        main(["sweep", str(_write(tmp_path, text)), "--dry-run", "--out", str(tmp_path / "sw")])
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    warnings = [ln for ln in out if ln.startswith("# warning")]
    assert (
        len(warnings) == 1 and f"corpus path {tmp_path / 'gone.txt'} does not exist" in warnings[0]
    )
    gone = out.index(warnings[0])
    assert out[gone - 1].startswith("# [todo] tokenize") and out[gone - 1].endswith("/gone")
    assert not (tmp_path / "sw").exists()
