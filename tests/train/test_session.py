"""How a run names and checks its evaluation sets (train/session.py)."""

import pytest

from scone_jax.errors import UserError
from scone_jax.train.session import HELDOUT, eval_set_names


def test_eval_sets_are_named_by_as_much_of_their_path_as_tells_them_apart(tmp_path):
    a, b = tmp_path / "a" / "test", tmp_path / "b" / "test"
    assert eval_set_names([str(tmp_path / "wiki")]) == ["wiki"]
    assert eval_set_names([str(a), str(b), str(tmp_path / "wiki")]) == ["test", "b/test", "wiki"]
    assert eval_set_names([str(b), str(a)]) == ["test", "a/test"]
    assert eval_set_names([str(tmp_path / "x" / HELDOUT)]) == [f"x/{HELDOUT}"]
    deep = [str(tmp_path / "p" / "q" / "test"), str(tmp_path / "r" / "q" / "test")]
    assert eval_set_names(deep) == ["test", "q/test"]
    with pytest.raises(UserError, match="is given twice"):
        eval_set_names([str(a), str(a)])


def test_one_document_stops_a_run_with_nothing_else_to_evaluate_and_warns_one_with_more(
    tmp_path, capsys
):
    import numpy as np

    from scone_jax.config import load_config
    from scone_jax.train.session import _check_heldout_split
    from tests.conftest import make_dataset

    one = make_dataset(tmp_path / "one", [np.arange(500) % 40 + 3], 64)
    cfg = load_config("tiny")
    with pytest.raises(UserError, match="has 1 document, so no whole document can be held out"):
        _check_heldout_split(cfg, one, np.zeros(0, np.int64), other_eval_sets=False)
    _check_heldout_split(cfg, one, np.zeros(0, np.int64), other_eval_sets=True)
    assert "no held-out split; the run evaluates on its other eval sets" in capsys.readouterr().err
