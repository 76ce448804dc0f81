"""The reference runs under the names the fault tests use: `pretrain`, `finetune`, and `command` (each of the
two; finetune in the deep stage only)."""

import pytest

from tests.helpers.reference import Command


@pytest.fixture
def pretrain(reference_pretrain) -> Command:
    return reference_pretrain


@pytest.fixture
def finetune(reference_finetune) -> Command:
    return reference_finetune


@pytest.fixture(params=["pretrain", pytest.param("finetune", marks=pytest.mark.deep)])
def command(request) -> Command:
    return request.getfixturevalue(f"reference_{request.param}")
