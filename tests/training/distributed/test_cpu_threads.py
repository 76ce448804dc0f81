"""pretrain's and finetune's CPU threads (training/distributed/cpu_threads.py): chosen from the cores free at
the start, the user's OMP_NUM_THREADS first, the checkpoint's count on a resume. The choice is tested on given
readings of the load, never on this machine's."""

import json

import pytest
import torch

from hf_tinytx_training import checkpoints
from hf_tinytx_training.distributed.cpu_threads import (
    choose,
    decide,
    idle_cores,
    local_processes,
    set_threads,
    usable_cpus,
    user_threads,
)


def test_the_free_cores_decide_the_threads():
    assert choose(1.95, cores=2) == 2  # idle
    assert choose(1.0, cores=2) == 1  # a busy loop on one core
    assert choose(0.0, cores=2) == 1  # both busy: one thread, which waits on nobody
    assert choose(1.74, cores=2) == 1 and choose(1.75, cores=2) == 2  # a core counts when 3/4 idle
    assert choose(None, cores=8) == 8  # no reading (not Linux): every core, as torch would
    assert choose(15.9, cores=16, processes=2) == 8 and choose(3.0, cores=16, processes=4) == 1
    assert choose(40.0, cores=4) == 4  # never more than this process may use


def test_the_choice_is_the_same_for_the_same_reading_and_says_what_it_saw():
    first, second = decide(None, None, 1.2, cores=2), decide(None, None, 1.2, cores=2)
    assert first == second == (1, "CPU threads: 1 (2 cores, 1.2 idle at the start; OMP_NUM_THREADS sets "
                                   "them); a resume keeps them.")
    threads, line = decide(None, None, 15.9, cores=16, processes=2)
    assert threads == 8 and "shared by 2 processes" in line


def test_the_users_omp_num_threads_wins():
    assert user_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert [user_threads({"OMP_NUM_THREADS": v}) for v in ("", "0", "two", " ")] == [None] * 4
    assert user_threads({}) is None
    assert decide(None, 3, 0.0, cores=2) == (3, "CPU threads: 3 (OMP_NUM_THREADS); a resume keeps them.")


def test_a_resume_keeps_the_recorded_count_or_says_that_another_is_no_longer_exact():
    threads, line = decide(2, None, 0.0, cores=2)  # the machine is busy now: the checkpoint's count still
    assert threads == 2 and "as the checkpoint trained with" in line
    assert decide(2, 2, 0.0, cores=2)[0] == 2
    threads, line = decide(2, 1, 0.0, cores=2)
    assert threads == 1 and line == ("CPU threads: 1 (OMP_NUM_THREADS), but the checkpoint trained with 2: "
                                     "the run goes on, no longer bit for bit as one without the stop.")


def test_the_count_is_read_back_from_either_commands_checkpoint(tmp_path):
    pretrain, finetune, older = (tmp_path / name for name in ("step_2", "checkpoint-5", "step_1"))
    for folder in (pretrain, finetune, older):
        folder.mkdir()
    (pretrain / checkpoints.STATE_FILE).write_text(json.dumps({"step": 2, "torch_threads": 2}))
    (finetune / checkpoints.STATE_FILE).write_text(json.dumps({"global_step": 5}))  # Trainer's
    (finetune / checkpoints.THREADS_FILE).write_text(json.dumps({"torch_threads": 1}))
    (older / checkpoints.STATE_FILE).write_text(json.dumps({"step": 1}))
    read = [checkpoints.recorded_threads(str(folder)) for folder in (pretrain, finetune, older)]
    assert read == [2, 1, None] and checkpoints.recorded_threads(None) is None


@pytest.fixture
def torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_set_threads_sets_torchs_count_and_says_it_once(monkeypatch, torch_threads):
    said = []
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert set_threads(None, True, said.append) == 1 and torch.get_num_threads() == 1
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert set_threads(2, True, said.append) == 2 and torch.get_num_threads() == 2  # the recorded count
    assert len(said) == 2 and said[1].startswith("CPU threads: 2, as the checkpoint trained with")


def test_the_local_processes_and_the_idle_cores_are_read_from_the_system(monkeypatch):
    assert local_processes({}) == 1 and local_processes({"LOCAL_WORLD_SIZE": "4"}) == 4
    assert local_processes({"OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 2
    idle = idle_cores(0.05)
    assert idle is None or 0.0 <= idle <= len(usable_cpus()) + 1e-6


@pytest.mark.deep
def test_a_resume_without_omp_num_threads_keeps_the_count_and_the_weights(run_pretrain, tmp_path):
    """Trained with 2 threads (OMP_NUM_THREADS=2), resumed from the middle with none set: the resume takes
    the checkpoint's 2 whatever the load, and ends with the uninterrupted run's weights, bit for bit."""
    from safetensors.torch import load_file

    from tests.helpers.tiny import pretrain_env

    out, flags = tmp_path / "out", ["--max_train_steps", 4, "--checkpointing_steps", 2, "--num_samples", 0,
                                    "--num_probes_per_kind", 0]
    first = run_pretrain("--output_dir", out, *flags, env=pretrain_env(tmp_path, OMP_NUM_THREADS="2"))
    assert "CPU threads: 2 (OMP_NUM_THREADS)" in first.stdout
    assert json.loads((out / "training_args.json").read_text())["torch_threads"] == 2
    uninterrupted = load_file(out / "model.safetensors")
    env = pretrain_env(tmp_path)
    env.pop("OMP_NUM_THREADS", None)
    middle = out / "checkpoints" / "step_2"
    resumed = run_pretrain("--output_dir", out, *flags, "--resume_from_checkpoint", middle,
                           "--overwrite_output_dir", env=env)
    assert "CPU threads: 2, as the checkpoint trained with" in resumed.stdout
    again = load_file(out / "model.safetensors")
    assert all(torch.equal(uninterrupted[name], again[name]) for name in uninterrupted)
