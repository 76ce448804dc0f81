"""distributed/cpu_memory.py: 32 MiB of logits page-fault back in every step under glibc's defaults, not once
the process keeps freed memory. Each run is a child process: the settings are process-wide and one-way."""

import json
import os
import platform
import subprocess
import sys

import pytest

from tests.helpers.tiny import REPO_ROOT


pytestmark = [
    pytest.mark.deep,
    pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                       reason="the settings are glibc's (Linux)"),
]

CHILD = """
import json, resource, statistics, sys
import torch
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM
from hf_tinytx_training.distributed.cpu_memory import keep_freed_memory
kept = keep_freed_memory() if sys.argv[1] == "keep" else False
torch.manual_seed(0)
config = TinyTxConfig(vocab_size=4096, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, max_position_embeddings=256)
model = TinyTxForCausalLM(config)
optimizer = torch.optim.AdamW(model.parameters())
batch = torch.randint(0, 4096, (8, 256))
def step():
    model(input_ids=batch, labels=batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
for _ in range(10):  # the heap settles into its peak (with the settings) during the first steps
    step()
faults = []
# the median step: the heap can still grow once after the warm-up (8,192 faults once: seen in CI)
for _ in range(9):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    step()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults_per_step": statistics.median(faults), "faults": faults}))
"""

LOGITS_PAGES = 8 * 256 * 4096 * 4 // 4096  # 8,192 pages of 4 KiB


def faults_per_step(mode: str, **env) -> dict:
    # what the child would take as the user's own allocator settings
    chosen = ("LD_PRELOAD", "GLIBC_TUNABLES")
    environment = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k not in chosen}
    result = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True,
                            env=environment | env, cwd=REPO_ROOT)
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_freed_memory_is_not_faulted_back_in():
    default, kept = faults_per_step("default"), faults_per_step("keep")
    assert not default["kept"] and kept["kept"]
    assert default["faults_per_step"] > LOGITS_PAGES  # glibc unmaps the logits (and more) when they are freed
    assert kept["faults_per_step"] < LOGITS_PAGES / 100


def test_an_allocator_the_user_chose_is_left_alone():
    chosen = faults_per_step("keep", MALLOC_ARENA_MAX="4")
    assert not chosen["kept"]
    assert chosen["faults_per_step"] > LOGITS_PAGES
