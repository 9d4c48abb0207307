"""The Beam pipeline produces exactly the local backend's set, on corpora cut into many shards.

These run the FnApi runner in this process (one worker); tests/fgrams/test_beam_workers.py
runs it on several worker processes.
"""

import numpy as np
import pytest

pytest.importorskip("apache_beam")

from scone_jax.fgrams.beam import worker_name  # noqa: E402
from scone_jax.fgrams.build import select_fgrams  # noqa: E402
from scone_jax.fgrams.corpus import Corpus  # noqa: E402
from scone_jax.fgrams.store import FgramSet  # noqa: E402

from ..conftest import make_dataset  # noqa: E402
from .helpers import as_list, corpus_of, random_docs  # noqa: E402
from .reference import brute_select  # noqa: E402


def assert_same(a, b):
    assert as_list(a) == as_list(b)
    assert a.fingerprint == b.fingerprint
    assert (a.keys == b.keys).all()
    for field in ("survivors_per_length", "candidates_per_length", "cutoff_count", "num_fgrams"):
        assert a.meta[field] == b.meta[field], field


def test_beam_equals_local_and_brute_force_on_random_multi_shard_corpora(rng):
    done = 0
    while done < 3:
        docs = random_docs(rng, max_docs=30, max_len=200)
        k, m, s = int(rng.integers(2, 7)), int(rng.integers(1, 4)), int(rng.integers(1, 80))
        if not brute_select(docs, k, s, m):
            continue
        shard = int(rng.integers(1, 400))
        local = select_fgrams(corpus_of(docs), k, s, m, progress=False)
        beam = select_fgrams(
            corpus_of(docs),
            k,
            s,
            m,
            backend="beam",
            workers=1,
            beam_shard_tokens=shard,
            progress=False,
        )
        print(f"K={k} min count {m} S={s} shard {shard} tokens: {sum(map(len, docs))} tokens")
        assert_same(beam, local)
        assert as_list(beam) == brute_select(docs, k, s, m)
        assert beam.meta["beam_worker_tokens"] == {worker_name(): (k - 1) * sum(map(len, docs))}
        assert beam.meta["beam_shuffle_bytes"] > 0
        done += 1


def test_beam_reads_a_dataset_directory_and_cleans_up(tmp_path, rng):
    docs = [rng.integers(0, 7, int(rng.integers(0, 600))) for _ in range(30)]
    ds = make_dataset(tmp_path / "ds", docs, 7)
    corpus = Corpus.from_dataset(ds)
    local = select_fgrams(corpus, 5, 100_000, 3, progress=False)  # S above the number of survivors
    beam = select_fgrams(
        corpus,
        5,
        100_000,
        3,
        backend="beam",
        workers=1,
        beam_shard_tokens=500,
        progress=False,
        tmp_dir=tmp_path,
    )
    assert_same(beam, local)
    assert local.num_fgrams < 100_000
    assert [p.name for p in tmp_path.iterdir()] == ["ds"]  # the pipeline's files are cleaned up


def test_cli_beam_backend_matches_local_and_refuses_a_runner_that_downloads(tmp_path, rng, capsys):
    from scone_jax.cli.main import main

    docs = [rng.integers(0, 6, int(rng.integers(0, 300))) for _ in range(8)]
    a = make_dataset(tmp_path / "a", docs, 6)
    b = make_dataset(tmp_path / "b", docs[::-1], 6)
    common = ["--max-n", "4", "--num-fgrams", "60", "--min-count", "2", "--no-progress"]
    common.append("--no-stats")
    assert main(["fgrams", "build", str(a.path), "--out", str(tmp_path / "local"), *common]) == 0
    beam = ["fgrams", "build", str(a.path), "--backend", "beam", "--beam-dataset", str(a.path)]
    assert main([*beam, "--out", str(tmp_path / "beam"), "--workers", "1", *common]) == 0
    capsys.readouterr()
    main(["fgrams", "dump", str(tmp_path / "local")])
    local = capsys.readouterr().out
    main(["fgrams", "dump", str(tmp_path / "beam")])
    assert capsys.readouterr().out == local and local

    def refused(*extra):
        code = main([*beam, "--out", str(tmp_path / "bad"), *extra, *common])
        err = capsys.readouterr().err
        assert code == 2 and not (tmp_path / "bad").exists()
        return err

    assert "not a copy" in refused("--beam-dataset", str(b.path), "--workers", "1")
    err = refused("--beam-options=--runner=DirectRunner --direct_num_workers=2")
    assert "download the Prism runner" in err and len(err.strip().splitlines()) == 1
    code = main(
        ["fgrams", "build", str(a.path), "--out", str(tmp_path / "bad"), "--beam-work-dir", "x"]
        + common
    )
    assert code == 2 and "need --backend beam" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, refused",
    [
        ([], "no --runner"),
        (["--runner=DirectRunner"], "Prism"),
        (["--runner=apache_beam.runners.direct.direct_runner.SwitchingDirectRunner"], "Prism"),
        (["--runner=PrismRunner"], "--prism_location"),
        (["--runner=PrismRunner", "--prism_location=https://x/prism.zip"], "--prism_location"),
        (["--runner=FlinkRunner", "--flink_master=host:8081"], "--flink_job_server_jar"),
        (["--runner=flink", "--flink_job_server_jar=https://x/a.jar"], "--flink_job_server_jar"),
        (["--runner=SparkRunner"], "--spark_job_server_jar"),
        (["--runner=FnApiRunner"], None),
        (["--runner=FnApiRunner", "--direct_running_mode=multi_processing"], None),
        (["--runner=FlinkRunner", "--flink_job_server_jar=/opt/flink-js.jar"], None),
        (["--runner=FlinkRunner", "--job_endpoint=localhost:8099"], None),
        (["--runner=SparkRunner", "--spark_job_server_jar=/opt/spark-js.jar"], None),
        (["--runner=PortableRunner", "--job_endpoint=localhost:8099"], None),
        (["--runner=PrismRunner", "--prism_location=/opt/prism"], None),
        (["--runner=DataflowRunner", "--project=p", "--region=r"], None),
    ],
)
def test_runners_that_would_download_are_refused_in_one_line(args, refused):
    from apache_beam.options.pipeline_options import PipelineOptions

    from scone_jax.errors import UserError
    from scone_jax.fgrams.beam_runner import check_offline

    if refused is None:
        check_offline(PipelineOptions(args))
        return
    with pytest.raises(UserError) as e:
        check_offline(PipelineOptions(args))
    assert refused in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--beam-options=--runner=NoSuchRunner"], "--runner=NoSuchRunner is not a Beam runner"),
        (["--beam-options=--runner='FnApiRunner"], "No closing quotation"),
        (
            ["--beam-options=--runner=FnApiRunner --direct_num_workers=abc"],
            "argument --direct_num_workers: invalid int value: 'abc'",
        ),
        (["--beam-work-dir", "{tmp}/a_file"], "a_file is a file (expected an existing directory)"),
        (["--beam-work-dir", "{tmp}/nope/work"], "work does not exist (expected an existing"),
    ],
)
def test_bad_beam_settings_are_refused_in_one_line_before_anything_runs(
    tmp_path, rng, capsys, extra, needle
):
    from scone_jax.cli.main import main

    ds = make_dataset(tmp_path / "ds", [rng.integers(0, 6, 200) for _ in range(4)], 6)
    (tmp_path / "a_file").write_text("not a directory\n")
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    argv = ["fgrams", "build", str(ds.path), "--backend", "beam", "--out", str(tmp_path / "set")]
    code = main([*argv, "--min-count", "2", "--no-progress", *extra])
    err = capsys.readouterr().err
    print(err)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "set").exists()


def test_workers_count_a_training_split_from_the_whole_datasets_copy(tmp_path, rng, capsys):
    """`--heldout-fraction` with `--beam-dataset`: the workers read the shared copy of the whole
    dataset and skip the held-out documents, giving the local count of the training split; a
    copy whose documents differ is refused."""
    from scone_jax.cli.main import main

    docs = [rng.integers(0, 6, int(rng.integers(0, 300))) for _ in range(40)]
    ds = make_dataset(tmp_path / "ds", docs, 6)
    regrouped = make_dataset(tmp_path / "regrouped", [np.concatenate(docs)], 6)
    seed = int(rng.integers(0, 1000))
    common = ["--max-n", "4", "--num-fgrams", "80", "--min-count", "2", "--no-progress"]
    common += ["--no-stats", "--heldout-fraction", "0.3", "--split-seed", str(seed)]
    print("split seed", seed)
    build = ["fgrams", "build", str(ds.path)]
    assert main([*build, "--out", str(tmp_path / "local"), *common]) == 0
    beam = [*build, "--backend", "beam", "--workers", "1", "--beam-dataset", str(ds.path)]
    assert main([*beam, "--out", str(tmp_path / "beam"), *common]) == 0
    local, counted = (FgramSet.load(tmp_path / name) for name in ("local", "beam"))
    assert_same(counted, local)
    assert counted.meta["num_tokens"] == local.meta["num_tokens"] < sum(map(len, docs))
    capsys.readouterr()
    code = main(
        [*build, "--backend", "beam", "--workers", "1", "--beam-dataset", str(regrouped.path)]
        + ["--out", str(tmp_path / "bad"), *common]
    )
    assert code == 2 and "different documents" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()
