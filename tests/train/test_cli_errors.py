"""Bad input to `scone-jax train`: one line, exit 2, no traceback, nothing overwritten."""

import pytest

from tests.train.helpers import cli_run, tiny_overrides


def assert_one_line_error(res, needle):
    assert res.returncode == 2, res.stderr[-2000:]
    assert "Traceback" not in res.stderr
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("scone-jax train: error:") and needle in last, last


@pytest.fixture
def bad_utf8(tmp_path):
    path = tmp_path / "bad.txt"
    path.write_bytes(b"fine text\n" * 50 + b"broken \xff\xfe here\n")
    return path


@pytest.mark.parametrize(
    "case",
    [
        "missing_corpus",
        "empty_corpus",
        "invalid_utf8",
        "unknown_key",
        "wrong_type",
        "mesh_does_not_fit",
        "batch_does_not_split",
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(case, tmp_path, bad_utf8, markov_dataset):
    run_dir = tmp_path / "run"
    empty = tmp_path / "empty.txt"
    empty.write_text("  \n\n")
    base = tiny_overrides(markov_dataset.path, run_dir, 2)
    no_dataset = [o for o in base if not o.startswith("data.dataset=")]
    args, needle = {
        "missing_corpus": (no_dataset + [f"data.corpus=[{tmp_path / 'nope.txt'}]"], "nope.txt"),
        "empty_corpus": (no_dataset + [f"data.corpus=[{empty}]"], "empty corpus"),
        "invalid_utf8": (no_dataset + [f"data.corpus=[{bad_utf8}]"], "bad.txt"),
        "unknown_key": (base + ["train.stepz=3"], "train.stepz"),
        "wrong_type": (base + ["train.batch_size=many"], "train.batch_size='many'"),
        "mesh_does_not_fit": (base + ["mesh.data=3"], "mesh data=3"),
        "batch_does_not_split": (
            base + ["train.batch_size=4", "mesh.data=8"],
            "train.batch_size=4",
        ),
    }[case]
    res = cli_run(["train", "tiny", *args])
    assert_one_line_error(res, needle)
    assert not run_dir.exists()


def test_existing_run_is_never_overwritten_by_another_config(tmp_path, markov_dataset):
    run_dir = tmp_path / "run"
    ok = cli_run(["train", "tiny", *tiny_overrides(markov_dataset.path, run_dir, 2)])
    assert ok.returncode == 0, ok.stderr[-2000:]
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    res = cli_run(
        ["train", "tiny", *tiny_overrides(markov_dataset.path, run_dir, 2), "model.n_layers=3"]
    )
    assert_one_line_error(res, "model.n_layers")
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    other = tmp_path / "not_a_run"
    other.mkdir()
    (other / "precious.txt").write_text("keep me")
    res = cli_run(["train", "tiny", *tiny_overrides(markov_dataset.path, other, 2)])
    assert_one_line_error(res, "not a scone_jax run directory")
    assert (other / "precious.txt").read_text() == "keep me" and len(list(other.iterdir())) == 1


def test_help_is_complete():
    for cmd in ("train", "eval", "tokenize", "demo", "fgrams"):
        res = cli_run([cmd, "--help"])
        assert res.returncode == 0 and "usage: scone-jax " + cmd in res.stdout
