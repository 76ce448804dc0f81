"""Fixtures shared by the test files; the builders behind them live in tests/helpers/tiny.py."""

import collections
import contextlib
import os
import subprocess
import sys

import pytest
import torch

from tests.helpers.faults import TmpfsUnavailable, tmpfs
from tests.helpers.tiny import (
    REPO_ROOT,
    TINY_PRETRAIN_ARGS,
    build_byte_bpe_tokenizer,
    build_tiny_config,
    build_tiny_model,
    pretrain_env,
)


def pytest_configure(config):
    """Each test process, and each process a test starts, gets its share of the cores' threads: a 2-thread
    OpenMP kernel on a core another process is using waits on it and runs ~10x slower. Set always, as the
    user's choice: pretrain and finetune would otherwise choose it from the load at their start
    (training/distributed/cpu_threads.py), and a reference and its resumed run must train with one count."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None and getattr(config.option, "numprocesses", None):
        return  # pytest-xdist's controller: each worker sets its own share
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1)
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // workers)))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


# The deep stage's longest files, longest first (seconds in CI's --durations, 2026-12-07). With
# --dist loadfile a file runs whole on one worker; handed out last, a long one leaves the other worker idle
# at the end. pyproject.toml's --no-loadscope-reorder keeps this order (xdist would sort by test count).
LONGEST_FIRST = (
    "tests/benchmarks/test_benchmark_scripts.py",  # 291
    "tests/training/test_interruptions.py",  # 236
    "tests/training/distributed/test_cluster.py",  # 228
    "tests/training/distributed/test_scale_out.py",  # 208
    "tests/kill_campaign/test_kill_campaign.py",  # 162
    "tests/training/test_checkpoints.py",  # 159
    "tests/training/distributed/test_preemption.py",  # 155
    "tests/training/publish/test_hub_resume.py",  # 143
    "tests/test_readme.py",  # 133
    "tests/training/test_pretrain_recipe.py",  # 132
    "tests/training/publish/test_replace_a_model.py",  # 125
    "tests/training/data/test_token_store.py",  # 113
)


def pytest_collection_modifyitems(items):
    """The files above first, in that order; then the rest by number of tests, as xdist would."""
    rank = {name: place for place, name in enumerate(LONGEST_FIRST)}
    count = collections.Counter(item.nodeid.split("::")[0] for item in items)

    def key(item):
        name = item.nodeid.split("::")[0]
        return rank.get(name, len(rank)), -count[name], name

    items.sort(key=key)


@pytest.fixture
def mounted():
    """`with mounted(path, size):` a small tmpfs on `path`, unmounted afterwards;
    skips where mounting is denied."""
    @contextlib.contextmanager
    def mount(path, size):
        stack = contextlib.ExitStack()
        try:
            path = stack.enter_context(tmpfs(path, size))
        except TmpfsUnavailable as error:  # raised before anything is mounted
            pytest.skip(str(error))
        with stack:
            yield path

    return mount


@pytest.fixture
def local_hub():
    """A fresh local Hub server (tests/helpers/hub_server.py): talk to it from a subprocess whose environment
    includes `local_hub.client_env(tmp_path / "hf_home")`."""
    from tests.helpers.hub_server import LocalHub

    with LocalHub() as hub:
        yield hub


@pytest.fixture
def tiny_config():
    """`tiny_config(**overrides)` -> TinyTxConfig."""
    return build_tiny_config


@pytest.fixture
def tiny_model():
    """`tiny_model(seed=0, attn_implementation="eager", **config_overrides)` ->
    TinyTxForCausalLM in eval mode."""
    return build_tiny_model


@pytest.fixture
def byte_bpe_tokenizer():
    """`byte_bpe_tokenizer(vocab_size=300)` -> PreTrainedTokenizerFast with <pad>=0, <s>=1, </s>=2."""
    return build_byte_bpe_tokenizer


@pytest.fixture
def run_pretrain(tmp_path):
    """`run_pretrain(*flags, env=None, launcher=None, check=True)`:
    training/pretrain.py with TINY_PRETRAIN_ARGS then `flags`, behind `launcher` (e.g.
    torchrun's argv); returns the CompletedProcess."""
    def run(*flags, env=None, launcher=None, check=True, timeout=300):
        script = str(REPO_ROOT / "training" / "pretrain.py")
        command = [*(launcher or [sys.executable]), script, *TINY_PRETRAIN_ARGS, *map(str, flags)]
        result = subprocess.run(
            command, env=env or pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(
                f"{command} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
            )
        return result

    return run


@pytest.fixture(scope="session")
def reference_pretrain(tmp_path_factory):
    """training/pretrain.py and its reference run (tests/helpers/reference.py),
    trained once per test process."""
    from tests.helpers.reference import pretrain_command

    return pretrain_command(tmp_path_factory)


@pytest.fixture(scope="session")
def reference_finetune(tmp_path_factory):
    """training/finetune.py and its reference run, trained once per test process."""
    from tests.helpers.reference import finetune_command

    return finetune_command(tmp_path_factory)
