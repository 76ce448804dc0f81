"""training/pretrain.py --push_to_hub against the local Hub server: checkpoints go up in the background under
checkpoints/step_N/, the final model to the repo root, a failing Hub never fails training, and the token stays out
of every file and output."""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load, load_file

from tests.helpers.remote_code import BLOCK_HF_TINYTX
from tests.helpers.tiny import assert_same_weights
from tests.training.test_hub import assert_token_nowhere, client_env, last_json_line, run_python
from tests.training.test_pretrain_recipe import rows


STEPS, EVERY = 4, 2  # checkpoints at steps 2 and 4
FAST_RUN = ["--max_train_steps", STEPS, "--checkpointing_steps", EVERY, "--eval_steps", 100,
            "--num_probes_per_kind", 0, "--num_samples", 0]
MODEL_REPO_FILES = {
    "config.json", "model.safetensors", "generation_config.json", "configuration_tinytx.py", "modeling_tinytx.py",
    "tokenizer.json", "tokenizer_config.json", "README.md",
}
PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth", ".ckpt")


def pretrain_hub_env(local_hub, tmp_path, token="default"):
    """pretrain_env (offline datasets, own caches), but with the Hub pointed at the local server."""
    from tests.helpers.tiny import pretrain_env

    env = {k: v for k, v in pretrain_env(tmp_path).items() if not k.startswith(("HF_TOKEN", "HUGGING_FACE_HUB"))}
    env.update(local_hub.client_env(tmp_path / "hf_home", token=token))
    return env


def test_checkpoints_and_final_model_reach_the_hub_and_load_by_repo_id(local_hub, run_pretrain, tmp_path):
    repo_id = f"{local_hub.user}/tiny"
    output_dir = tmp_path / "model"
    env = pretrain_hub_env(local_hub, tmp_path, token=None)  # no HF_TOKEN: the token `hf auth login` stored
    login = tmp_path / "hf_home" / "token"
    login.parent.mkdir(parents=True, exist_ok=True)
    login.write_text(local_hub.token)
    result = run_pretrain("--output_dir", output_dir, *FAST_RUN, "--push_to_hub", "--hub_model_id", repo_id, env=env)
    assert f"Pushed the final model to the Hub as {repo_id}" in result.stdout
    login.unlink()  # the user's own login file; no other file may hold the token (checked at the end)

    files = local_hub.repo_files(repo_id)
    assert MODEL_REPO_FILES <= set(files), MODEL_REPO_FILES - set(files)
    for name in MODEL_REPO_FILES:  # the root is the final local folder, byte for byte
        assert files[name] == (output_dir / name).read_bytes(), name
    checkpoint_steps = range(EVERY, STEPS + 1, EVERY)
    for step in checkpoint_steps:
        prefix = f"checkpoints/step_{step}/"
        assert {prefix + name for name in MODEL_REPO_FILES} <= set(files)
        # The checkpoint's weights are those of the resumable local checkpoint at that step.
        pushed = load(files[prefix + "model.safetensors"])
        saved = load_file(output_dir / "checkpoints" / f"step_{step}" / "model.safetensors")
        assert set(pushed) == set(saved) and all(torch.equal(pushed[k], saved[k]) for k in pushed)
    # Only model repos: no optimizer, scheduler or RNG state, no trainer state, no other checkpoint files.
    assert not [path for path in files if path.endswith(PICKLE_SUFFIXES) or "trainer_state" in path]
    assert {path.split("/")[1] for path in files if path.startswith("checkpoints/")} == {
        f"step_{step}" for step in checkpoint_steps}
    # Checkpoints in order while training ran, the final model last.
    messages = [commit.message for commit in local_hub.commits(repo_id)]
    assert messages[:-1] == [f"TinyTx pre-trained for {STEPS} steps",
                             *(f"Checkpoint at step {step}" for step in reversed(checkpoint_steps))]
    # The hub exports and the pusher's snapshots are gone; the resumable checkpoints are still there.
    leftovers = [p for p in output_dir.rglob(".hub*")]
    assert not leftovers and (output_dir / "checkpoints" / f"step_{STEPS}" / "optimizer.bin").is_file()

    # A fresh process, cache and folder, without the package: the repo id alone must give the same model.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    load_run = run_python(
        BLOCK_HF_TINYTX,
        f"""
        import json, torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        hub = AutoModelForCausalLM.from_pretrained({repo_id!r}, trust_remote_code=True).eval()
        local = AutoModelForCausalLM.from_pretrained({str(output_dir)!r}, trust_remote_code=True).eval()
        checkpoint = AutoModelForCausalLM.from_pretrained(
            {repo_id!r}, subfolder="checkpoints/step_{EVERY}", trust_remote_code=True).eval()
        tokenizer = AutoTokenizer.from_pretrained({repo_id!r}, trust_remote_code=True)
        input_ids = tokenizer("The dog didn't cross the street because it was too", return_tensors="pt").input_ids
        with torch.no_grad():
            logits = hub(input_ids).logits
            print(json.dumps({{
                "identical": torch.equal(logits, local(input_ids).logits),
                "checkpoint_finite": bool(torch.isfinite(checkpoint(input_ids).logits).all()),
                "module": type(hub).__module__,
                "package_imported": any(m.split(".")[0] == "hf_tinytx" for m in sys.modules),
            }}))
        """,
        env=client_env(local_hub, tmp_path / "fresh_hf_home"),
        cwd=elsewhere,
    )
    report = last_json_line(load_run.stdout)
    assert report["identical"] is True and report["checkpoint_finite"] is True
    assert report["package_imported"] is False and report["module"].startswith("transformers_modules")
    assert local_hub.recorded("GET", f"/{repo_id}/resolve/"), "the model did not come from the local Hub"
    assert_token_nowhere(local_hub.token, [tmp_path],
                         [result.stdout, result.stderr, load_run.stdout, load_run.stderr])


@pytest.mark.deep
def test_failing_hub_does_not_fail_training_or_the_local_folder(local_hub, run_pretrain, tmp_path):
    # Every commit is refused with a 4xx, which neither the client nor the pusher retries, so this stays fast.
    local_hub.fail_commits(None, status=422)
    repo_id = f"{local_hub.user}/tiny-down"
    output_dir = tmp_path / "model"
    env = pretrain_hub_env(local_hub, tmp_path, token=None)  # this time the token comes from --hub_token
    result = run_pretrain("--output_dir", output_dir, *FAST_RUN, "--push_to_hub", "--hub_model_id", repo_id,
                          "--hub_token", local_hub.token, "--hub_private_repo", env=env, check=False)

    assert result.returncode == 1  # a push asked for that did not happen: as finetune.py
    warnings = [line for line in result.stderr.splitlines() if "--hub_token puts the token on the command" in line]
    assert len(warnings) == 1 and "HF_TOKEN" in warnings[0] and "hf auth login" in warnings[0], result.stderr[-3000:]
    assert "pretrain.py: error: The final model was NOT pushed" in result.stderr and "hf upload" in result.stderr
    for name in ("Checkpoint at step 2", f"TinyTx pre-trained for {STEPS} steps"):
        assert any(name in line and "422" in line for line in result.stdout.splitlines()), name
    assert set(local_hub.repo_files(repo_id)) == {".gitattributes"}  # created, but no commit went through
    assert local_hub.repo_is_private(repo_id) is True  # --hub_private_repo
    assert local_hub.recorded("POST", f"/api/models/{repo_id}/commit/"), "the pushes never reached the Hub"

    assert MODEL_REPO_FILES <= set(os.listdir(output_dir))
    from transformers import AutoModelForCausalLM

    import hf_tinytx  # noqa: F401

    model = AutoModelForCausalLM.from_pretrained(output_dir)
    assert torch.isfinite(model(torch.tensor([[1, 5, 9]])).logits).all()
    assert not list(output_dir.rglob(".hub*"))
    assert_token_nowhere(local_hub.token, [tmp_path], [result.stdout, result.stderr])


# Two configurations, as a dataset card declares them: so a run must name one (--dataset_config_name).
DATASET_CARD = """---
configs:
- config_name: tiny
  data_files:
  - {split: train, path: train.jsonl}
  - {split: validation, path: validation.jsonl}
- config_name: other
  data_files:
  - {split: train, path: other/train.jsonl}
---
"""


def upload_text_dataset(local_hub, tmp_path, repo_id: str) -> Path:
    """A dataset repo whose configuration "tiny" is train.jsonl and validation.jsonl (the embedded corpus's documents),
    beside a configuration "other"; returns the local copy."""
    from hf_tinytx.corpus import default_corpus

    folder = tmp_path / "dataset"
    (folder / "other").mkdir(parents=True)
    for split, documents in default_corpus(num_documents=300, seed=0).items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps({"text": doc}) + "\n" for doc in documents))
    (folder / "other" / "train.jsonl").write_text(json.dumps({"text": "another dataset altogether"}) + "\n")
    (folder / "README.md").write_text(DATASET_CARD)
    run_python(f"from huggingface_hub import HfApi; api = HfApi(); "
               f"api.create_repo({repo_id!r}, repo_type='dataset'); "
               f"api.upload_folder(folder_path={str(folder)!r}, repo_id={repo_id!r}, repo_type='dataset')",
               env=pretrain_hub_env(local_hub, tmp_path / "uploader"), cwd=tmp_path)
    return folder


@pytest.mark.deep
def test_a_hub_dataset_trains_the_same_model_as_its_files_read_locally(local_hub, run_pretrain, tmp_path):
    repo_id = f"{local_hub.user}/tiny-text"
    folder = upload_text_dataset(local_hub, tmp_path, repo_id)
    flags = ["--max_train_steps", 4, "--num_probes_per_kind", 0, "--num_samples", 0]
    env = {**pretrain_hub_env(local_hub, tmp_path), "HF_DATASETS_OFFLINE": "0"}
    hub = run_pretrain("--output_dir", tmp_path / "hub", "--dataset_name", repo_id, "--dataset_config_name", "tiny",
                       *flags, env=env)
    local = run_pretrain("--output_dir", tmp_path / "local", "--train_file", folder / "train.jsonl",
                         "--validation_file", folder / "validation.jsonl", *flags)
    assert local_hub.recorded("GET", f"/datasets/{repo_id}/resolve/"), "the run did not download the dataset"
    blocks = lambda result: next(line for line in result.stdout.splitlines() if "training and" in line)  # noqa: E731
    assert blocks(hub) == blocks(local)
    assert_same_weights(tmp_path / "hub", tmp_path / "local")
    assert f"the Hub dataset `{repo_id}`" in (tmp_path / "hub" / "README.md").read_text()

    # --streaming reads the same repo as a stream; its validation split (streamed too) is read into memory for the
    # evaluations (once failed: an IterableDataset has no set_format).
    streamed = run_pretrain("--output_dir", tmp_path / "streamed", "--dataset_name", repo_id, "--dataset_config_name",
                            "tiny", "--streaming", *flags, env=env)
    assert "Training for 4 steps" in streamed.stdout
    assert [r["step"] for r in rows(tmp_path / "streamed") if "loss" in r] == [1, 2, 3, 4]
    assert [r for r in rows(tmp_path / "streamed") if r.get("final") and "eval_loss" in r]
