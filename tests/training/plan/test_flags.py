"""Which runs plan themselves (training/plan/flags.py): a run on the user's data with no size flag."""

from types import SimpleNamespace

import pytest

from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.plan.flags import refuse_plan_only_without_a_plan, wanted


def test_a_size_flag_or_no_data_means_no_plan():
    data = SimpleNamespace(train_file="a.txt", dataset_name=None)
    assert wanted(data, frozenset({"max_train_seconds"}))
    assert not wanted(data, frozenset({"hidden_size"}))
    assert not wanted(data, frozenset({"model_preset"}))
    assert not wanted(SimpleNamespace(train_file=None, dataset_name=None), frozenset())


def test_plan_only_is_refused_where_no_plan_is_made():
    data = SimpleNamespace(train_file="a.txt", dataset_name=None)
    refuse_plan_only_without_a_plan(data, SimpleNamespace(plan_only=True), frozenset())
    with pytest.raises(UserInputError, match="leave out the size flags"):
        refuse_plan_only_without_a_plan(data, SimpleNamespace(plan_only=True), frozenset({"hidden_size"}))
