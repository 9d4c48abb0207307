import re
from pathlib import Path

import pytest

from scone_jax.config import load_config, parse_overrides, save_config
from scone_jax.config.load import PRESET_DIR
from scone_jax.errors import UserError

SHIPPED = sorted(
    p for p in PRESET_DIR.rglob("*.yaml") if not {"results", "sweeps"} & set(p.parts)
)  # sweeps: tests/sweep


def test_presets_exist():
    assert {"tiny", "small", "demo", "tiny_llama"} <= {p.stem for p in SHIPPED}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(PRESET_DIR)))
def test_every_shipped_config_loads_and_validates(path):
    cfg = load_config(path)
    cfg.validate()


def test_overrides_typed_and_nested():
    cfg = load_config(
        "tiny",
        [
            "train.steps=7",
            "optim.lr=1",
            "data.corpus=[a.txt, 'b/*.txt']",
            "model.family=llama",
            "mesh.rules={mlp: null}",
            "logging.tensorboard=false",
        ],
    )
    assert cfg.train.steps == 7 and isinstance(cfg.optim.lr, float) and cfg.optim.lr == 1.0
    assert cfg.data.corpus == ["a.txt", "b/*.txt"] and cfg.model.family == "llama"
    assert cfg.mesh.rules == {"mlp": None} and cfg.logging.tensorboard is False


def test_exponent_floats_without_a_dot():
    """PyYAML reads 3e-4 as a string; a float field still takes it."""
    assert load_config("tiny", ["optim.lr=3e-4"]).optim.lr == 3e-4
    with pytest.raises(UserError, match="optim.lr='fast'"):
        load_config("tiny", ["optim.lr=fast"])


def test_single_string_becomes_list():
    assert load_config(None, ["data.corpus=x.txt"]).data.corpus == ["x.txt"]


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["train.stepz=3"], "unknown config key 'train.stepz'"),
        (["nosuch.key=3"], "unknown config key 'nosuch'"),
        (["train.steps=three"], "train.steps='three'"),
        (["train.steps=1.5"], "train.steps=1.5"),
        (["logging.tensorboard=3"], "logging.tensorboard=3"),
        (["model.family=gpt5"], "model.family='gpt5'"),
        (["model.d_model=130", "model.n_heads=4"], "not divisible"),
        (["mesh.data=-1", "mesh.tensor=-1"], "at most one axis may be -1"),
        (["train.steps"], "key=value"),
        (["train..steps=5"], "override 'train..steps=5': its key has an empty part"),
        ([".steps=5"], "its key has an empty part"),
        (["data.seq_len=4096"], "exceeds model.max_seq_len"),
        (
            ["fgrams.max_n=5", "fgrams.block_size=4"],
            "fgrams.block_size=4 (expected >= fgrams.max_n=5)",
        ),
        (["fgrams.drop_rate=1.0"], "fgrams.drop_rate=1.0 (expected 0 <= rate < 1)"),
        (
            ["fgrams.embed_drop_rate=-0.1"],
            "fgrams.embed_drop_rate=-0.1 (expected 0 <= rate < 1)",
        ),
        (["fgrams.model_size=infx"], "fgrams.model_size='infx' (expected e.g."),
        (["optim.eps=.nan"], "optim.eps=nan (expected a finite value > 0)"),
        (["optim.eps=-1"], "optim.eps=-1.0 (expected a finite value > 0)"),
        (["optim.lr=.inf"], "optim.lr=inf (expected a finite value > 0)"),
        (["optim.weight_decay=.inf"], "optim.weight_decay=inf (expected a finite value >= 0)"),
        (["optim.fgram_weight_decay=.nan"], "optim.fgram_weight_decay=nan (expected a finite"),
        (["model.init_std=-5"], "model.init_std=-5.0 (expected a finite value > 0)"),
        (["model.norm_eps=-1"], "model.norm_eps=-1.0 (expected a finite value > 0)"),
        (["model.rope_theta=0"], "model.rope_theta=0.0 (expected a finite value > 0)"),
        (
            ["fgrams.drop_to=prefix"],
            "fgrams.drop_to='prefix' (expected one of ('unmatched', 'suffix'))",
        ),
        (
            ["fgrams.drop_to=suffix"],
            "fgrams.drop_to='suffix' with fgrams.drop_rate=0 (expected a drop_rate > 0",
        ),
    ],
)
def test_bad_values_are_one_line_user_errors(overrides, needle):
    with pytest.raises(UserError) as e:
        load_config("tiny", overrides)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [unclosed\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(bad)
    bad.write_text("train:\n  steps: [1\n  lr: 2\n")  # where and what, not only the parser's state
    with pytest.raises(UserError) as e:
        load_config(bad)
    assert str(e.value).endswith(
        "is not valid YAML: line 3, column 5: expected ',' or ']', but got ':' (while parsing a "
        "flow sequence)"
    )
    listy = tmp_path / "list.yaml"
    listy.write_text("- 1\n- 2\n")
    with pytest.raises(UserError, match="mapping"):
        load_config(listy)


def test_yaml_is_read_safely(tmp_path):
    evil = tmp_path / "evil.yaml"
    evil.write_text("run_dir: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UserError, match="not valid YAML"):
        load_config(evil)


def test_base_chain_and_round_trip(tmp_path):
    child = tmp_path / "child.yaml"
    child.write_text(f"base: {PRESET_DIR / 'tiny.yaml'}\ntrain:\n  steps: 3\n")
    cfg = load_config(child, ["model.n_layers=1"])
    assert cfg.train.steps == 3 and cfg.model.n_layers == 1 and cfg.model.d_model == 128
    save_config(cfg, tmp_path / "saved.yaml")
    assert load_config(tmp_path / "saved.yaml") == cfg
    loop = tmp_path / "loop.yaml"
    loop.write_text("base: loop.yaml\n")
    with pytest.raises(UserError, match="loops"):
        load_config(loop)


def test_base_names_a_preset_or_a_file_beside_it_and_says_which_base_is_missing(tmp_path):
    (tmp_path / "by_name.yaml").write_text("base: tiny_scone\ntrain:\n  steps: 3\n")
    cfg = load_config(tmp_path / "by_name.yaml")
    assert cfg.train.steps == 3 and cfg.fgrams.enabled
    (tmp_path / "mine.yaml").write_text("train:\n  steps: 4\n")
    (tmp_path / "beside.yaml").write_text("base: mine.yaml\n")
    assert load_config(tmp_path / "beside.yaml").train.steps == 4
    (tmp_path / "missing.yaml").write_text("base: nowhere.yaml\n")
    with pytest.raises(UserError, match=r"missing.yaml: base 'nowhere.yaml' is neither a file"):
        load_config(tmp_path / "missing.yaml")


def test_a_preset_name_is_the_preset_beside_a_run_directory_or_file_of_that_name(
    tmp_path, monkeypatch
):
    """`train tiny run_dir=tiny` must resume from where it was started, and `demo` must run
    where a directory named demo is; `./NAME` still names the local file."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tiny").mkdir()
    (tmp_path / "demo").write_text("just notes\n")
    assert load_config("tiny") == load_config(PRESET_DIR / "tiny.yaml")
    assert load_config("demo") == load_config(PRESET_DIR / "demo.yaml")
    (tmp_path / "tiny_scone").write_text("train:\n  steps: 7\n")
    assert load_config("./tiny_scone").train.steps == 7
    (tmp_path / "mine").write_text("train:\n  steps: 9\n")  # no preset of that name
    assert load_config("mine").train.steps == 9


def test_a_repeated_key_is_refused_not_silently_dropped_and_merges_still_work(tmp_path):
    (tmp_path / "twice.yaml").write_text("train:\n  steps: 5\nmodel: {}\ntrain:\n  seed: 2\n")
    with pytest.raises(UserError, match=r"key 'train' is repeated \(line 4\)"):
        load_config(tmp_path / "twice.yaml")
    merge = "train:\n  <<: &base {steps: 5, seed: 2}\n  seed: 3\n"  # a key overrides a merged one
    (tmp_path / "merged.yaml").write_text("base: tiny\n" + merge)
    cfg = load_config(tmp_path / "merged.yaml")
    assert (cfg.train.steps, cfg.train.seed) == (5, 3)


@pytest.mark.parametrize(
    "override, why",
    [
        ("train={steps: 3, steps: 4}", "key 'steps' is repeated"),
        ("data.corpus=[a.txt, b.txt", "expected ',' or ']'"),
        ("train={steps: 3", "expected ',' or '}'"),
    ],
)
def test_a_broken_mapping_or_list_override_names_its_yaml_problem(override, why):
    with pytest.raises(UserError, match=re.escape(f"override {override!r}: {why}")):
        load_config("tiny", [override])


def test_parse_overrides_nesting():
    assert parse_overrides(["a.b=1", "a.c=x", "d=[1, 2]"]) == {"a": {"b": 1, "c": "x"}, "d": [1, 2]}


def test_presets_resolve_by_name():
    assert Path(load_config("tiny").run_dir) == Path("runs/tiny")


def test_an_unknown_combine_rule_is_one_line_naming_the_rules():
    assert load_config("tiny_scone").fgrams.combine == "gated"  # the default since docs/fidelity.md
    with pytest.raises(
        UserError, match=r"fgrams.combine='mix' \(expected one of \('replace', 'add', 'gated'\)\)"
    ):
        load_config("tiny_scone", ["fgrams.combine=mix"])


def test_jsonl_field_is_the_old_name_of_text_field(tmp_path):
    old = tmp_path / "old.yaml"
    old.write_text("data:\n  jsonl_field: body\n")  # a config saved before the rename
    assert load_config(old).data.text_field == "body"
    assert load_config("tiny", ["data.jsonl_field=content"]).data.text_field == "content"
    assert load_config(old, ["data.text_field=x"]).data.text_field == "x"  # the override wins
    with pytest.raises(UserError, match=r"data.jsonl_field='a' and data.text_field='b' disagree"):
        load_config("tiny", ["data.jsonl_field=a", "data.text_field=b"])
