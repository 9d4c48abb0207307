"""The command line's own parsing (cli/main.py): overrides may follow options."""

import pytest
import yaml

from scone_jax.cli.main import main


def test_overrides_after_an_option_are_overrides_and_anything_else_is_refused(capsys):
    assert main(["train", "tiny", "--print-config", "train.steps=3", "model.n_layers=1"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["train"]["steps"] == 3 and printed["model"]["n_layers"] == 1
    for stray in (["--bogus"], ["stray"]):
        with pytest.raises(SystemExit) as e:
            main(["train", "tiny", "--print-config", *stray])
        assert e.value.code == 2
        assert f"unrecognized arguments: {stray[0]}" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # a command without overrides takes none
        main(["report", "runs/x", "train.steps=3"])
    assert "unrecognized arguments: train.steps=3" in capsys.readouterr().err
