"""`scone-jax report` on what runs leave behind, damaged files included (sweep/report.py)."""

import csv
import json

import pytest

from scone_jax.errors import UserError
from scone_jax.sweep.plan import PLAN_FILE, plan_sweep
from scone_jax.sweep.report import write_report
from scone_jax.sweep.spec import load_sweep


@pytest.fixture
def sweep(tmp_path):
    """A planned two-point sweep whose point `a` finished (its final_eval and metrics)."""
    (tmp_path / "s.yaml").write_text("config: tiny\npoints: {a: {}, b: {train.steps: 3}}\n")
    plan_sweep(load_sweep(tmp_path / "s.yaml"), tmp_path / "out").write()
    point = tmp_path / "out" / "points" / "a"
    (point / "final_eval.json").write_text(
        json.dumps({"step": 2, "results": {"heldout": {"perplexity": 9.0, "bits_per_byte": 1.5}}})
    )
    (point / "metrics.jsonl").write_text(
        json.dumps({"kind": "train", "step": 1, "step_flops": 2.0e9}) + "\n"
    )
    return tmp_path / "out"


def rows(report_dir):
    return {r["point"]: r for r in csv.DictReader((report_dir / "results.csv").open())}


def test_a_torn_last_metrics_line_is_what_a_killed_run_leaves_and_is_skipped(sweep):
    metrics = sweep / "points" / "a" / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"kind": "train", "step": 2, "step_fl')
    got = rows(write_report(sweep))
    assert got["a"]["status"] == "complete" and float(got["a"]["ppl_heldout"]) == 9.0
    assert float(got["a"]["train_flops"]) == 2.0e9 and got["b"]["status"] == "incomplete"


def test_an_incomplete_point_shows_how_far_it_got(sweep):
    """A point stopped part way says at which step (the last one its metrics logged), not only
    the steps it was configured for."""
    (sweep / "points" / "b" / "metrics.jsonl").write_text(
        "".join(json.dumps({"kind": "train", "step": s, "step_flops": 1e9}) + "\n" for s in (1, 2))
        + json.dumps({"kind": "eval", "step": 2, "perplexity": 5.0})
        + "\n"
    )
    report = write_report(sweep)
    got = rows(report)
    assert (got["b"]["steps_done"], got["b"]["train_steps"]) == ("2", "3")
    assert (got["a"]["steps_done"], got["a"]["status"]) == (got["a"]["train_steps"], "complete")
    assert "| b | incomplete (step 2 of 3) |" in (report / "results.md").read_text()


@pytest.mark.parametrize(
    "damage, message",
    [
        (("points/a/metrics.jsonl", "not json\n{}\n"), "metrics.jsonl line 1 is not JSON"),
        (("points/a/final_eval.json", "[1, 2]"), "final_eval.json holds a JSON list"),
        (
            ("points/a/final_eval.json", '{"step": 3, "results": {"heldout": {"perplexity": 3}}}'),
            "results.heldout lacks bits_per_byte",
        ),
        (("points/a/final_eval.json", '{"results": {}}'), "final_eval.json lacks step"),
        (("points/a/final_eval.json", "{}"), "final_eval.json lacks step, results"),
        (
            ("points/a/metrics.jsonl", '{"kind": "train", "step": "x"}\n{}\n'),
            "metrics.jsonl line 1: step 'x' is not a number",
        ),
        (
            ("points/a/metrics.jsonl", '{"kind": "train", "step": 1, "step_flops": null}\n'),
            "metrics.jsonl line 1: step_flops None is not a number",
        ),
        ((PLAN_FILE, '{"name": "s"}'), "sweep.json lacks points"),
    ],
)
def test_a_damaged_file_is_one_line_naming_it_and_the_report_is_kept(sweep, damage, message):
    first = write_report(sweep)
    before = (first / "results.md").read_bytes()
    relative, text = damage
    (sweep / relative).write_text(text)
    with pytest.raises(UserError, match=message) as e:
        write_report(sweep)
    assert "\n" not in str(e.value) and (first / "results.md").read_bytes() == before


def test_a_missing_point_is_a_row_of_blank_cells(sweep):
    import shutil

    shutil.rmtree(sweep / "points" / "b")
    report = write_report(sweep)
    assert rows(report)["b"]["status"] == "missing"
    [line] = [
        ln for ln in (report / "results.md").read_text().splitlines() if ln.startswith("| b |")
    ]
    assert {c.strip() for c in line.split("|")[3:-1]} == {""}, line  # no "()" for the unknown
