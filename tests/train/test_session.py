"""How a run names and checks its evaluation sets (train/session.py)."""

import pytest

from scone_jax.errors import UserError
from scone_jax.train.session import HELDOUT, eval_set_names


def test_eval_sets_are_named_by_as_much_of_their_path_as_tells_them_apart(tmp_path):
    a, b = tmp_path / "a" / "test", tmp_path / "b" / "test"
    assert eval_set_names([str(tmp_path / "wiki")]) == ["wiki"]
    assert eval_set_names([str(a), str(b), str(tmp_path / "wiki")]) == ["a/test", "b/test", "wiki"]
    assert eval_set_names([str(tmp_path / "x" / HELDOUT)]) == [f"x/{HELDOUT}"]
    deep = [str(tmp_path / "p" / "q" / "test"), str(tmp_path / "r" / "q" / "test")]
    assert eval_set_names(deep) == ["p/q/test", "r/q/test"]
    with pytest.raises(UserError, match="is given twice"):
        eval_set_names([str(a), str(a)])
