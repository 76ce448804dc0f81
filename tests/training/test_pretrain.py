"""training/pretrain.py end to end: a short run on the embedded corpus leaves a
complete, loadable model folder."""

import json
import os
import platform
import re
import subprocess
import sys

import pytest
import yaml

from tests.helpers.remote_code import BLOCK_HF_TINYTX


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory):
    """One 40-step run shared by the tests below (the run is the expensive part)."""
    from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env

    tmp_path = tmp_path_factory.mktemp("pretrain")
    output_dir = tmp_path / "model"
    command = [
        sys.executable, os.path.join(REPO_ROOT, "training", "pretrain.py"), *TINY_PRETRAIN_ARGS,
        "--output_dir", str(output_dir), "--max_train_steps", "40", "--eval_steps", "20",
        "--learning_rate", "3e-3",
    ]
    result = subprocess.run(command, env=pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-5000:]
    return output_dir, result


def test_loss_falls_and_metrics_are_logged(trained_folder):
    output_dir, result = trained_folder
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]
    train_losses = [row["loss"] for row in rows if "loss" in row]
    eval_losses = [row["eval_loss"] for row in rows if "eval_loss" in row]
    assert len(train_losses) == 40
    # From ln(320) ~ 5.8 at initialisation; the average of the last 5 steps must be well below the first 5.
    assert sum(train_losses[-5:]) / 5 < sum(train_losses[:5]) / 5 - 1.0
    assert len(eval_losses) == 2 and eval_losses[-1] < eval_losses[0]
    final = [row for row in rows if "bits_per_byte" in row][-1]
    assert 0 < final["bits_per_byte"] < 8 and final["perplexity"] > 1
    assert "probe accuracy: coref" in result.stdout
    assert "sample:" in result.stdout
    # On a CPU under glibc the run keeps freed memory for the next step (test_cpu_memory.py: what that does).
    assert ("Freed memory stays in the process" in result.stdout) == (platform.libc_ver()[0] == "glibc")


def test_folder_is_a_complete_model_repo(trained_folder):
    output_dir, _ = trained_folder
    names = set(os.listdir(output_dir))
    expected = {
        "model.safetensors", "config.json", "generation_config.json", "configuration_tinytx.py",
        "modeling_tinytx.py", "tokenizer.json", "tokenizer_config.json", "README.md", "loss_curve.png",
        "training_args.json", "metrics.jsonl", "coref_head.png",
    }
    assert expected <= names, expected - names
    assert ".lock" not in names  # released (and removed) by the finished run
    # Weights only as safetensors: no pickled files among the model files.
    assert not [name for name in names if name.endswith((".bin", ".pt", ".pth", ".pkl", ".ckpt"))]
    config = json.loads((output_dir / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_tinytx.TinyTxForCausalLM"
    assert "hub_token" not in (output_dir / "training_args.json").read_text()
    assert (output_dir / "loss_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # No export leftovers next to the folder.
    assert not [name for name in os.listdir(output_dir.parent) if "export-tmp" in name]


def test_model_card_parses_with_metadata(trained_folder):
    from huggingface_hub import ModelCard

    output_dir, _ = trained_folder
    card = ModelCard.load(output_dir / "README.md")
    data = card.data.to_dict()
    assert data["license"] == "apache-2.0"
    assert data["library_name"] == "transformers"
    assert data["pipeline_tag"] == "text-generation"
    assert "tinytx" in data["tags"]
    results = data["model-index"][0]["results"]
    metric_types = {metric["type"] for result in results for metric in result["metrics"]}
    assert {"loss", "perplexity", "bits_per_byte", "accuracy"} <= metric_types
    assert "loss_curve.png" in card.text and "trust_remote_code=True" in card.text
    # The optimizer the run used (TINY_PRETRAIN_ARGS: --optimizer adamw); a Muon run's: the test below.
    assert "- **Optimizer:** AdamW (lr 0.003, betas (0.9, 0.95)" in card.text


def test_the_cards_optimizer_line_names_muon_for_a_muon_run():
    """It said AdamW whatever the run used (issue 67)."""
    import jinja2

    from tests.helpers.tiny import REPO_ROOT

    template = (REPO_ROOT / "model_cards" / "tinytx_model_card.md").read_text()
    line = next(line for line in template.splitlines() if line.startswith("- **Optimizer:**"))
    settings = dict(learning_rate=0.005, muon_learning_rate=None, adam_beta2=0.95, weight_decay=0.1,
                    lr_scheduler_type="cosine", num_warmup_steps=30, max_grad_norm=1.0)
    muon = jinja2.Template(line).render(hyperparameters={**settings, "optimizer": "muon"})
    assert muon.startswith(
        "- **Optimizer:** Muon on the hidden weight matrices (lr 0.005, weight decay 0.1), AdamW on the rest "
        "(lr 0.005, betas (0.9, 0.95)), cosine schedule"
    ), muon
    adamw = jinja2.Template(line).render(hyperparameters={**settings, "optimizer": "adamw"})
    assert adamw.startswith("- **Optimizer:** AdamW (lr 0.005, betas (0.9, 0.95), weight decay 0.1"), adamw


def test_the_card_draws_the_head_the_head_search_finds_for_it(trained_folder):
    """The head leaning most from the last "The" to the noun "it" means: named,
    and drawn in coref_head.png."""
    output_dir, result = trained_folder
    found = re.search(r'^the head that resolves "it": layer (\d+) head (\d+); from the last "The" it puts '
                      r'(\d\.\d\d) of its attention on the noun "it" means and (\d\.\d\d) on the other',
                      result.stdout, re.MULTILINE)
    assert found, result.stdout[-3000:]
    layer, head, referent, other = found.groups()
    text = (output_dir / "README.md").read_text()
    assert f"layer {layer}, head {head}. From the last \"The\"" in text
    assert f'it puts {referent} of its attention on the noun "it" means and\n{other} on the other one' in text
    assert "(coref_head.png)" in text
    assert (output_dir / "coref_head.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_model_card_gives_each_probe_its_chance_level_and_the_samples(trained_folder):
    """A probe at 0.25 reads as learning unless the card says what guessing scores."""
    from hf_tinytx.corpus import make_probes
    from hf_tinytx.probes import chance_levels

    output_dir, result = trained_folder
    text = (output_dir / "README.md").read_text()
    assert "| Probe | Accuracy | Chance |" in text
    rows = dict(re.findall(r"^\| (\S+) \| [0-9.]+ \| ([0-9.]+) \|$", text, re.M))
    chance = chance_levels(make_probes(num_per_kind=4))  # TINY_PRETRAIN_ARGS: --num_probes_per_kind 4
    assert rows and rows == {key: f"{value:.2f}" for key, value in chance.items()}
    assert rows["coref"] == "0.50" and float(rows["copy"]) < 0.5  # one distractor for "it", more for copying
    printed = [
        line.removeprefix("sample: ") for line in result.stdout.splitlines() if line.startswith("sample: ")
    ]
    assert printed and all(f"- {sample}" in text for sample in printed)


def test_folder_loads_natively_and_generates(trained_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import hf_tinytx  # noqa: F401

    output_dir, _ = trained_folder
    model = AutoModelForCausalLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert type(model).__name__ == "TinyTxForCausalLM"
    inputs = tokenizer("The dog didn't cross the street because it was too", return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert output.shape[1] == inputs["input_ids"].shape[1] + 5 or output[0, -1] == tokenizer.eos_token_id
    assert torch.isfinite(model(**inputs).logits).all()


def test_folder_loads_as_remote_code_without_the_package(trained_folder, tmp_path):
    from tests.training.publish.test_hub import run_python

    output_dir, _ = trained_folder
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = run_python(
        BLOCK_HF_TINYTX,
        f"""
        import sys
        from transformers import AutoModelForCausalLM, AutoTokenizer
        model = AutoModelForCausalLM.from_pretrained({str(output_dir)!r}, trust_remote_code=True)
        tokenizer = AutoTokenizer.from_pretrained({str(output_dir)!r}, trust_remote_code=True)
        inputs = tokenizer("Repeat: red blue. Again:", return_tensors="pt")
        output = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        assert not any(name.startswith("hf_tinytx") for name in sys.modules)
        print("REMOTE", type(model).__module__, output.shape[1] - inputs["input_ids"].shape[1])
        """,
        env={**env, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"},
        cwd=tmp_path,
        timeout=300,
    )
    line = [line for line in result.stdout.splitlines() if line.startswith("REMOTE")][0]
    module, new_tokens = line.split()[1:]
    assert module.startswith("transformers_modules") and 1 <= int(new_tokens) <= 4


@pytest.mark.deep
def test_report_to_every_tracker_writes_the_logged_rows(run_pretrain, tmp_path):
    """TensorBoard, trackio and wandb (offline) get metrics.jsonl's rows and the
    arguments, never the Hub token."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from tests.helpers.tiny import pretrain_env
    from tests.helpers.trackers import trackio_rows, wandb_rows

    out = tmp_path / "run"
    offline = {"TRACKIO_DIR": tmp_path / "trackio", "WANDB_MODE": "offline", "WANDB_DIR": tmp_path / "wandb",
               "WANDB_CONFIG_DIR": tmp_path / "wandb_config", "WANDB_CACHE_DIR": tmp_path / "wandb_cache"}
    run_pretrain("--output_dir", out, "--max_train_steps", 4, "--eval_steps", 2, "--num_probes_per_kind", 0,
                 "--num_samples", 0, "--report_to", "tensorboard,trackio,wandb",
                 env=pretrain_env(tmp_path, **{name: str(value) for name, value in offline.items()}))
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    losses = [(row["step"], row["loss"]) for row in logged if "loss" in row]
    evaluated = [(row["step"], row["eval_loss"]) for row in logged if "eval_loss" in row]
    assert len(losses) == 4 and len(evaluated) == 2

    events = EventAccumulator(str(out / "runs" / "tinytx-pretrain"))
    events.Reload()
    assert [(e.step, round(e.value, 5)) for e in events.Scalars("loss")] == losses
    assert [e.step for e in events.Scalars("eval_loss")] == [step for step, _ in evaluated]
    hparams = yaml.safe_load(next((out / "runs").rglob("hparams.yml")).read_text())

    trackio, trackio_config = trackio_rows(tmp_path / "trackio" / "tinytx-pretrain.db")
    assert [(step, row["loss"]) for step, row in trackio if "loss" in row] == losses
    assert [(step, row["eval_loss"]) for step, row in trackio if "eval_loss" in row] == evaluated

    (wandb_file,) = (tmp_path / "wandb").rglob("offline-run-*/*.wandb")
    wandb, wandb_config = wandb_rows(wandb_file)
    assert [(step, row["loss"]) for step, row in wandb if "loss" in row] == losses
    assert [(step, row["eval_loss"]) for step, row in wandb if "eval_loss" in row] == evaluated

    for config in (hparams, trackio_config, wandb_config):
        assert config["max_train_steps"] == 4 and config["report_to"] == "tensorboard,trackio,wandb"
        assert "hub_token" not in config


SIZE_FLAGS = ("--hidden_size", "--intermediate_size", "--num_hidden_layers", "--num_attention_heads")


def test_init_from_continues_from_the_saved_weights_and_tokenizer(trained_folder, tmp_path):
    """At a learning rate of 1e-9 two steps move no weight by more than ~2e-9."""
    import torch
    from safetensors.torch import load_file

    from tests.helpers.tiny import TINY_PRETRAIN_ARGS, pretrain_env

    source, _ = trained_folder
    # Without the size overrides: --init_from keeps the saved architecture and refuses them.
    flags = [arg for i, arg in enumerate(TINY_PRETRAIN_ARGS)
             if arg not in SIZE_FLAGS and (i == 0 or TINY_PRETRAIN_ARGS[i - 1] not in SIZE_FLAGS)]
    # The README's other spelling, from a folder outside the checkout.
    command = [sys.executable, "-m", "hf_tinytx_training.pretrain", *flags, "--init_from", str(source),
               "--output_dir", str(tmp_path / "more"), "--max_train_steps", "2", "--learning_rate", "1e-9",
               "--num_probes_per_kind", "0", "--num_samples", "0"]
    result = subprocess.run(command, env=pretrain_env(tmp_path), cwd=tmp_path, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Training a byte-level BPE tokenizer" not in result.stdout
    before, after = load_file(source / "model.safetensors"), load_file(
        tmp_path / "more" / "model.safetensors"
    )
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=1e-7, msg=name)
    assert (tmp_path / "more" / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()


def test_a_named_tokenizer_a_text_column_and_a_token_budget(run_pretrain, trained_folder, tmp_path):
    """--max_train_tokens plans the steps: 3 x 8 x 64 tokens."""
    from transformers import AutoTokenizer

    from tests.helpers.tiny import REPO_ROOT

    source, _ = trained_folder
    rows = [{"content": f"Document {i}: the animal did not cross the street because it was tired."}
            for i in range(200)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "run"
    # Launched as the README's one-process Accelerate command.
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                str(REPO_ROOT / "training" / "configs" / "accelerate-cpu.yaml")]
    result = run_pretrain(
        "--output_dir", out, "--tokenizer_name", source, "--train_file", tmp_path / "docs.jsonl",
        "--text_column", "content", "--max_train_tokens", 3 * 8 * 64, "--num_probes_per_kind", 0,
        "--num_samples", 0, launcher=launcher,
    )
    assert "1 process(es) on cpu" in result.stdout
    assert "Training a byte-level BPE tokenizer" not in result.stdout
    assert (out / "tokenizer.json").read_text() == (source / "tokenizer.json").read_text()
    assert json.loads((out / "config.json").read_text())["vocab_size"] == len(
        AutoTokenizer.from_pretrained(source)
    )
    logged = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in logged if "loss" in row] == [1, 2, 3]


@pytest.mark.deep
def test_a_busy_machine_gets_one_line_on_threads_and_one_thread_gets_none(run_pretrain, tmp_path):
    """Busy loops on every core: 2 threads get one line (OMP_NUM_THREADS=1), 1
    thread, which waits on nobody, none."""
    from tests.helpers.tiny import pretrain_env

    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        flags = ["--max_train_steps", 12, "--num_probes_per_kind", 0, "--num_samples", 0]
        two = run_pretrain(
            "--output_dir", tmp_path / "two", *flags, env=pretrain_env(tmp_path, OMP_NUM_THREADS="2")
        )
        one = run_pretrain(
            "--output_dir", tmp_path / "one", *flags, env=pretrain_env(tmp_path, OMP_NUM_THREADS="1")
        )
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
    lines = [line for line in (two.stdout + two.stderr).splitlines() if "CPU cores are busy" in line]
    assert (
        len(lines) == 1 and lines[0].startswith("pretrain.py: the ") and "OMP_NUM_THREADS=1" in lines[0]
    ), lines
    assert "CPU cores are busy" not in one.stdout + one.stderr
