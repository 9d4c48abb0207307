"""`make demo`'s path end to end at a few steps (`scone-jax demo`), then `scone-jax generate` from
its run directory and from its exported backbone + table, each printing what the engine decodes."""

import re

import pytest

from scone_jax.cli.generate_cmd import continuation
from scone_jax.data.tokenizer import Tokenizer
from scone_jax.serve.engine import engine_from_export, engine_from_run
from scone_jax.serve.generate import generate
from tests.train.helpers import cli_run

TINY = [
    "data.max_default_corpus_mb=0.5",
    "data.tokenizer_vocab_size=512",
    "train.steps=4",
    "train.eval_every=2",
    "train.eval_batches=2",
    "checkpoint.every=2",
    "logging.progress=false",
    "logging.tensorboard=false",
]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    res = cli_run(["demo", "--out", str(out), *TINY], timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return out, res.stdout


def test_demo_trains_exports_evaluates_and_samples(demo):
    out, stdout = demo
    assert "scone-jax demo finished. Outputs:" in stdout
    for name in (
        "run/config.yaml",
        "run/dataset/tokenizer.model",
        "run/fgrams/meta.json",
        "run/checkpoints/4",
        "run/final_eval.json",
        "table/meta.json",
        "backbone/params.npz",
        "backbone/tokenizer.model",
    ):
        assert (out / name).exists(), name
    live, table = map(
        float, re.search(r"live f-gram model ([\d.]+), exported table ([\d.]+)", stdout).groups()
    )
    assert (
        1 < live < 512 and abs(table - live) / live < 1e-3
    )  # the float32 table scores like the live model
    # a non-empty repr: double-quoted when the sample holds an apostrophe
    assert re.search(r"""sample: 'Return the' -> (?:'.+'|".+")""", stdout)


@pytest.mark.parametrize("source", ["run_dir", "backbone"])
def test_generate_prints_what_the_engine_decodes(demo, source):
    out, _ = demo
    prompts = ["Return the", "The"]
    model = [str(out / "run")] if source == "run_dir" else ["--backbone", str(out / "backbone")]
    res = cli_run(
        [
            "generate",
            *model,
            "--table",
            str(out / "table"),
            "--max-new-tokens",
            "8",
            *[a for p in prompts for a in ("--prompt", p)],
        ]
    )
    assert res.returncode == 0, res.stderr[-3000:]
    tokenizer = Tokenizer.load(out / "run" / "dataset" / "tokenizer.model")
    engine = (
        engine_from_run(out / "run", str(out / "table"))
        if source == "run_dir"
        else engine_from_export(out / "backbone", str(out / "table"))
    )
    new = generate(engine, [tokenizer.encode(p) for p in prompts], 8, eos_id=tokenizer.eos_id)
    want = [
        p + continuation(tokenizer, tokenizer.encode(p), [t for t in row if t != tokenizer.eos_id])
        for p, row in zip(prompts, new)
    ]
    assert res.stdout == "".join(
        f"--- prompt {i + 1} of 2 ---\n{text}\n" for i, text in enumerate(want)
    )  # each prompt and its continuation
    assert any(len(text) > len(p) for text, p in zip(want, prompts))  # something was generated


def test_generate_uses_the_checkpoint_step_asks_for(demo, tmp_path):
    """`--step 2` generates with step 2's backbone and takes step 2's table (step 4's, the
    latest's, is refused: it was exported from another checkpoint)."""
    out, _ = demo
    table = tmp_path / "table2"
    res = cli_run(["export", str(out / "run"), "--step", "2", "--out", str(table)])
    assert res.returncode == 0, res.stderr[-3000:]
    args = ["generate", str(out / "run"), "--max-new-tokens", "8", "--prompt", "The"]
    res = cli_run([*args, "--step", "2", "--table", str(table)])
    assert res.returncode == 0, res.stderr[-3000:]
    tokenizer = Tokenizer.load(out / "run" / "dataset" / "tokenizer.model")
    engine = engine_from_run(out / "run", str(table), step=2)
    assert engine.step == 2
    [new] = generate(engine, [tokenizer.encode("The")], 8, eos_id=tokenizer.eos_id)
    ids = tokenizer.encode("The")
    assert (
        res.stdout
        == "The" + continuation(tokenizer, ids, [t for t in new if t != tokenizer.eos_id]) + "\n"
    )
    res = cli_run([*args, "--step", "2", "--table", str(out / "table")])
    assert res.returncode == 2 and "was exported from checkpoint" in res.stderr, res.stderr[-3000:]


def test_a_rerun_redoes_exports_that_another_checkpoint_made(demo, tmp_path):
    """Exports left by an older version, or of a run since changed, are the demo's own to redo:
    a copy whose run now has another identity reruns to completion with fresh exports."""
    import json
    import shutil

    from scone_jax.artifacts.restore import agreed_checkpoint, run_fingerprint

    out = tmp_path / "out"
    shutil.copytree(demo[0], out)
    info = json.loads((out / "run" / "run_info.json").read_text())
    (out / "run" / "run_info.json").write_text(json.dumps({**info, "run_id": "another run"}))
    res = cli_run(["demo", "--out", str(out), *TINY], timeout=900)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    current = run_fingerprint(out / "run", agreed_checkpoint(out / "run"))
    for meta in (out / "table" / "meta.json", out / "backbone" / "meta.json"):
        assert json.loads(meta.read_text())["checkpoint_fingerprint"] == current


def test_a_demo_stopped_by_a_signal_exports_nothing_and_says_so(tmp_path):
    import signal

    from tests.train.helpers import cli, wait_for_step

    out = tmp_path / "out"
    steps = [a for a in TINY if not a.startswith("train.steps=")] + ["train.steps=400"]
    proc = cli(["demo", "--out", str(out), *steps])
    wait_for_step(out / "run", 2, proc)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 143, stdout[-2000:] + stderr[-3000:]
    assert "SIGTERM: saved step" in stdout
    assert "demo stopped before its exports; rerun the same command to finish it" in stdout
    assert "demo finished" not in stdout
    assert not (out / "table").exists() and not (out / "backbone").exists()
