"""Export: the table equals the live f-gram model, resumes after a kill, and is checked on open."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from scone_jax.artifacts.restore import load_run_params
from scone_jax.errors import UserError
from scone_jax.evaluation.run import evaluate_run
from scone_jax.export.table import export_table
from scone_jax.fgrams.store import FgramSet
from scone_jax.serve.tables import open_table
from scone_jax.sharding.mesh import make_mesh
from tests.model.reference import fgram_alone
from tests.model.test_scone import brute_suffix_parent
from tests.reliability.faults import faulty_cli, finish, wait_for_hang
from tests.scone_run import train_scone_run
from tests.train.helpers import cli_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("scone")
    run_dir = train_scone_run(root, seed=int(np.random.SeedSequence().entropy % 2**31))
    return run_dir, root


def live_rows(run_dir):
    """F(w) - T(last token of w) for every f-gram, straight from the model (the reference)."""
    rp = load_run_params(
        run_dir, mesh=make_mesh(devices=jax.devices()[:1])
    )  # an unsharded reference
    model = rp.model()
    fs = FgramSet.load(rp.info["fgram_set"])
    tokens = jnp.asarray(np.maximum(fs.tokens, 0), jnp.int32)
    lengths = jnp.asarray(fs.lengths, jnp.int32)
    f = np.asarray(fgram_alone(model, tokens, lengths), np.float32)
    last = np.asarray(fs.tokens)[np.arange(len(fs.lengths)), np.asarray(fs.lengths) - 1]
    return f - np.asarray(model.backbone.embed_table[...])[last], fs


def test_float32_table_equals_the_fgram_model(run):
    run_dir, root = run
    meta = export_table(run_dir, str(root / "t32"), progress=False, range_rows=500)
    expected, fs = live_rows(run_dir)
    table = open_table(str(root / "t32"), "host")
    got = table.gather(np.arange(table.num_rows))
    assert meta["num_rows"] == fs.num_fgrams > 100 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert not (root / "t32.partial").exists()


def test_a_suffix_rows_table_sums_each_fgrams_suffixes_and_scores_like_the_live_model(tmp_path):
    """fgrams.suffix_rows: row(w) = F(w) + F of each suffix of w in the set - T(last token),
    against F run on each f-gram alone over suffix chains found by brute force; and the table
    scores held-out text as the live model does."""
    seed = int(np.random.SeedSequence().entropy % 2**31)
    print(f"seed {seed}")
    run_dir = train_scone_run(tmp_path, seed=seed, **{"fgrams.suffix_rows": "true"})
    export_table(run_dir, str(tmp_path / "table"), progress=False, range_rows=700, batch_rows=256)
    own, fs = live_rows(run_dir)
    parent = brute_suffix_parent(np.asarray(fs.tokens), np.asarray(fs.lengths))
    last = np.asarray(fs.tokens)[np.arange(fs.num_fgrams), np.asarray(fs.lengths) - 1]
    table_rows = np.asarray(load_run_params(run_dir).model().backbone.embed_table[...])[last]
    alone = own + table_rows  # F(w) itself
    expected, link, suffixes = own.copy(), parent.copy(), 0
    while (link >= 0).any():
        expected += np.where((link >= 0)[:, None], alone[np.maximum(link, 0)], 0)
        suffixes += int((link >= 0).sum())
        link = np.where(link >= 0, parent[np.maximum(link, 0)], -1)
    assert suffixes > fs.num_fgrams // 2  # most rows have a suffix in the set
    got = open_table(str(tmp_path / "table"), "host").gather(np.arange(fs.num_fgrams))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    live = evaluate_run(run_dir)["results"]["heldout"]["perplexity"]
    scored = evaluate_run(run_dir, table=str(tmp_path / "table"))["results"]["heldout"]
    assert abs(scored["perplexity"] - live) / live < 1e-4


def test_a_batch_larger_than_the_table_is_the_whole_table_at_once(run):
    """The buffers are sized by the batch: one of 10**12 rows would not fit in memory."""
    run_dir, root = run
    export_table(run_dir, str(root / "one_batch"), progress=False, batch_rows=10**12)
    expected, _ = live_rows(run_dir)
    got = open_table(str(root / "one_batch"), "host").gather(np.arange(len(expected)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, rel", [("bfloat16", 2**-8), ("int8", 1 / 127)])
def test_low_precision_tables_are_within_their_stated_tolerance(run, dtype, rel):
    """bfloat16: relative error <= 2^-8 per element; int8: <= half a step, i.e. max|row| / 254."""
    run_dir, root = run
    export_table(run_dir, str(root / f"t_{dtype}"), dtype=dtype, progress=False)
    expected, _ = live_rows(run_dir)
    got = open_table(str(root / f"t_{dtype}"), "host").gather(np.arange(len(expected)))
    if dtype == "bfloat16":
        assert np.all(np.abs(got - expected) <= rel * np.abs(expected) + 1e-5)  # + float32 noise
    else:
        bound = np.abs(expected).max(axis=1, keepdims=True) / 254 * (1 + 1e-5) + 1e-5
        assert np.all(np.abs(got - expected) <= bound)


def test_memory_kvstore_url_round_trips(run):
    run_dir, _ = run
    export_table(run_dir, "memory://tables/a", progress=False)
    expected, _ = live_rows(run_dir)
    for tier in ("host", "disk"):
        got = open_table("memory://tables/a", tier).gather(np.arange(len(expected)))
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_an_object_store_table_replaced_is_the_old_one_or_none_or_the_new_one(run, monkeypatch):
    # no rename on an object store: an --overwrite interrupted midway must not leave the old
    # meta.json over a mix of old and new rows (it used to write into the live table)
    run_dir, _ = run
    url, fresh = "memory://tables/replaced", "memory://tables/fresh"
    export_table(run_dir, url, dtype="int8", progress=False, range_rows=64)
    import scone_jax.export.table as table_module

    real, calls = table_module.compute_range, []

    def failing_after_one_range(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("interrupted")
        return real(*args, **kwargs)

    monkeypatch.setattr(table_module, "compute_range", failing_after_one_range)
    with pytest.raises(RuntimeError, match="interrupted"):
        export_table(run_dir, url, progress=False, range_rows=64, overwrite=True)
    with pytest.raises(UserError, match="not a complete f-gram table"):
        open_table(url, "host")
    monkeypatch.setattr(table_module, "compute_range", real)
    resumed = export_table(run_dir, url, progress=False, range_rows=64)  # no table left to refuse
    straight = export_table(run_dir, fresh, progress=False, range_rows=64)
    assert resumed["dtype"] == "float32" and resumed["checksum"] == straight["checksum"]
    np.testing.assert_array_equal(
        open_table(url, "host").gather(np.arange(straight["num_rows"])),
        open_table(fresh, "host").gather(np.arange(straight["num_rows"])),
    )


def test_existing_table_is_reused_when_it_is_this_export_and_never_overwritten(run, monkeypatch):
    """A rerun of the same export (same checkpoint, same dtype) returns the finished table's meta
    and computes nothing; another step or dtype is refused without --overwrite, before the
    checkpoint is restored. Either way the table is untouched."""
    import scone_jax.export.table as table_module

    run_dir, root = run
    first = export_table(run_dir, str(root / "keep"), progress=False)
    before = (root / "keep" / "meta.json").read_bytes()
    again = export_table(run_dir, str(root / "keep"), progress=False)
    assert first["rows_per_s"] > 0 and again["rows_per_s"] is None
    assert again["checksum"] == first["checksum"]

    def never_restored(*args, **kwargs):
        raise AssertionError("the checkpoint was restored before the table was refused")

    monkeypatch.setattr(table_module, "load_run_params", never_restored)
    for other in ({"dtype": "bfloat16"}, {"step": 5}):
        with pytest.raises(UserError, match="already exists, exported from another checkpoint"):
            export_table(run_dir, str(root / "keep"), progress=False, **other)
    assert (root / "keep" / "meta.json").read_bytes() == before


def test_export_killed_midway_resumes_to_the_same_table(run):
    run_dir, root = run
    export_table(run_dir, str(root / "straight"), progress=False, range_rows=50, batch_rows=64)
    url = root / "resumed"
    args = [
        "export",
        str(run_dir),
        "--out",
        str(url),
        "--range-rows",
        "50",
        "--batch-rows",
        "64",
        "--no-progress",
    ]
    proc = faulty_cli(
        args, hang_after_call=("scone_jax.export.table.write_json", 2)
    )  # 2 ranges written
    wait_for_hang(proc)
    proc.kill()
    finish(proc)
    progress = root / "resumed.partial" / "progress.json"
    with pytest.raises(UserError, match="not a complete f-gram table"):
        open_table(str(url), "host")  # no reader opens a half-written table
    assert not url.exists()
    done_before = len(json.loads(progress.read_text())["done"])
    with pytest.raises(UserError, match=r"has another shard_rows .* rerun with the same options"):
        export_table(
            run_dir, str(url), progress=False, range_rows=50, batch_rows=64, shard_rows=512
        )
    assert len(json.loads(progress.read_text())["done"]) == done_before  # the partial table is kept
    res = finish(faulty_cli(args))
    assert res.returncode == 0, res.stderr[-2000:]
    a = open_table(str(root / "straight"), "host")
    b = open_table(str(url), "host")
    assert a.meta["checksum"] == b.meta["checksum"] and done_before < len(b.meta["ranges"])
    np.testing.assert_array_equal(a.stored, b.stored)


def _flip_byte(path, offset=200):
    data = bytearray(path.read_bytes())
    data[min(offset, len(data) - 1)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip_rows", "truncate_rows", "drop_meta", "flip_fgram_set"])
def test_damaged_tables_are_refused_with_one_line(run, damage):
    run_dir, root = run
    url = root / f"damaged_{damage}"
    export_table(run_dir, str(url), progress=False)
    shard = next(p for p in (url / "rows" / "c").rglob("*") if p.is_file())
    if damage == "flip_rows":
        _flip_byte(shard)
    elif damage == "truncate_rows":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "drop_meta":
        (url / "meta.json").unlink()
    else:
        _flip_byte(url / "fgram_set" / "tokens.npy", 300)
    for tier in ("host", "disk"):
        res = cli_run(["eval", str(run_dir), "--table", str(url), "--tier", tier])
        assert res.returncode == 2, res.stderr[-1500:]
        last = res.stderr.strip().splitlines()[-1]
        assert last.startswith("scone-jax eval: error:") and "Traceback" not in res.stderr, last


def test_tables_of_another_checkpoint_or_width_are_refused(run, tmp_path):
    run_dir, root = run
    other = train_scone_run(tmp_path, seed=7, steps=4)
    export_table(other, str(tmp_path / "other"), progress=False)
    res = cli_run(["eval", str(run_dir), "--table", str(tmp_path / "other")])
    assert res.returncode == 2 and "exported from checkpoint" in res.stderr.strip().splitlines()[-1]
    table = open_table(str(tmp_path / "other"), "host")
    with pytest.raises(UserError, match="width"):
        table.check_compatible(table.width + 1)


def test_baseline_run_has_no_table_to_export_but_its_backbone(markov_dataset, tmp_path):
    from scone_jax.cli.main import main
    from scone_jax.config import load_config
    from scone_jax.serve.engine import engine_from_export
    from scone_jax.train.loop import train
    from tests.train.helpers import tiny_overrides

    train(load_config("tiny", tiny_overrides(markov_dataset.path, tmp_path / "base", 2)))
    with pytest.raises(UserError, match="baseline"):
        export_table(tmp_path / "base", str(tmp_path / "t"), progress=False)
    assert not (tmp_path / "t").exists() and not (tmp_path / "t.partial").exists()
    assert main(["export", str(tmp_path / "base"), "--backbone-out", str(tmp_path / "b")]) == 0
    assert engine_from_export(tmp_path / "b", None, "host") is not None


def test_one_export_reads_one_step_even_if_a_checkpoint_lands_midway(run, tmp_path, monkeypatch):
    """The table and the backbone of one `scone-jax export` come from the same checkpoint, also
    when training writes a newer one while the table is being computed."""
    import scone_jax.export.table as table_module
    from scone_jax.artifacts.run_dir import checkpoints_dir
    from scone_jax.cli.main import main

    run_dir, _ = run
    newer = checkpoints_dir(run_dir) / "999"
    real_export_table = table_module.export_table

    def export_then_a_checkpoint_lands(*args, **kwargs):
        meta = real_export_table(*args, **kwargs)
        newer.mkdir()  # the run's latest step now, though no export may read it
        return meta

    monkeypatch.setattr(table_module, "export_table", export_then_a_checkpoint_lands)
    try:
        argv = ["export", str(run_dir), "--out", str(tmp_path / "t"), "--no-progress"]
        assert main([*argv, "--backbone-out", str(tmp_path / "b")]) == 0
    finally:
        newer.rmdir()
    table_step = json.loads((tmp_path / "t" / "meta.json").read_text())["checkpoint_step"]
    backbone_meta = json.loads((tmp_path / "b" / "meta.json").read_text())
    assert backbone_meta["checkpoint_step"] == table_step < 999


def test_an_empty_directory_takes_the_table_with_overwrite_only(run, capsys):
    from scone_jax.cli.main import main

    run_dir, root = run
    empty = root / "empty"
    empty.mkdir()
    args = ["export", str(run_dir), "--out", str(empty), "--no-progress"]
    assert main(args) == 2
    assert "exists and is not an f-gram table" in capsys.readouterr().err
    assert main([*args, "--overwrite"]) == 0
    expected, _ = live_rows(run_dir)
    got = open_table(str(empty), "host").gather(np.arange(len(expected)))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_eval_refuses_a_run_whose_fgram_set_is_gone_and_writes_nothing(run, tmp_path):
    """eval takes no lock: it must not count the f-grams again into a run directory."""
    import shutil

    from scone_jax.evaluation.run import evaluate_run

    run_dir, _ = run
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "fgrams")
    with pytest.raises(UserError, match=r"has no f-gram set at .*copy/fgrams .* builds it again"):
        evaluate_run(copy)
    assert not (copy / "fgrams").exists()
