"""The benchmark scripts run, as a user runs them, at their smallest settings, and end with one JSON line of
figures. Smoke tests: speed is never what a test asserts."""

import copy
import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.activations import GELUActivation

from hf_tinytx import modeling_tinytx
from hf_tinytx.modeling_tinytx import TinyTxRMSNorm
from hf_tinytx_training.distributed.sharding import cpu_runs_bf16_fast
from tests.helpers.engines import require_llama_cpp
from tests.helpers.tiny import REPO_ROOT, TINY_PRETRAIN_ARGS, pretrain_env


pytestmark = pytest.mark.deep


BENCHMARKS = REPO_ROOT / "benchmarks"


def run_script(args, tmp_path, timeout=120, check=True):
    result = subprocess.run(
        args, cwd=BENCHMARKS.parent, env=pretrain_env(tmp_path), capture_output=True, text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{args} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def final_json(stdout: str) -> dict:
    """The last line must be the JSON summary (a table comes before it)."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) >= 2, f"expected a table and a JSON line, got:\n{stdout}"
    return json.loads(lines[-1])


def python(script, *flags):
    """`python -m benchmarks.NAME FLAGS` for "NAME.py"."""
    return [sys.executable, "-m", f"benchmarks.{script.removesuffix('.py')}", *map(str, flags)]


def test_train_step(tmp_path):
    summary = final_json(run_script(python("train_step.py", "--quick", "--shapes", "0.8M"), tmp_path).stdout)
    assert summary["benchmark"] == "train_step"
    (row,) = summary["results"]
    assert (row["shape"], row["compiled"]) == ("0.8M", False)
    # The nanoGPT-shaped GPT is the same size within 1% (its head is tied, TinyTx's 0.8M is not).
    assert abs(row["parameters"]["gpt"] / row["parameters"]["tinytx"] - 1) < 0.01
    assert set(row["ms_per_step"]) == {"tinytx", "gpt", "llama"}
    assert {"time_ratio_tinytx_over_gpt", "time_ratio_tinytx_over_llama"} <= set(row)


def test_train_step_profile_lists_each_models_busiest_ops(tmp_path):
    stdout = run_script(python("train_step.py", "--profile", "--shapes", "0.8M"), tmp_path).stdout
    headers = re.findall(
        r"^0\.8M (\w+): ([\d.]+) ms of self CPU time a step; the busiest ops$", stdout, re.MULTILINE
    )
    assert [name for name, _ in headers] == ["tinytx", "gpt"] and all(float(ms) > 0 for _, ms in headers)
    rows = re.findall(r"^ +(aten::\w+) \| +([\d.]+) \| +(\d+)$", stdout, re.MULTILINE)
    # the matmuls, 12 ops a model
    assert ("aten::mm" in {op for op, _, _ in rows}) and len(rows) >= 12, stdout


def test_train_step_attribution_times_each_swap_beside_tinytx_and_the_gpt(tmp_path):
    args = python("train_step.py", "--attribute", "--quick", "--shapes", "0.8M")
    summary = final_json(run_script(args, tmp_path).stdout)
    assert summary["benchmark"] == "train_step_attribution"
    rows = {row["variant"]: row for row in summary["results"]}
    assert list(rows) == ["TinyTx", "LayerNorm", "no RoPE", "GELU MLP", "all three", "GPT"]
    # Every variant is TinyTx's size within 1% (the GELU MLP: two matmuls 4x wide
    # for SwiGLU's three 2.7x wide).
    assert all(abs(row["parameters"] / rows["TinyTx"]["parameters"] - 1) < 0.01 for row in rows.values())
    assert all(row["ms_per_step"] > 0 for row in rows.values())
    assert rows["TinyTx"]["time_ratio_over_tinytx"] == rows["GPT"]["time_ratio_over_gpt"] == 1.0


def test_the_attribution_variants_swap_what_they_say(tiny_model):
    from benchmarks import train_step

    model = tiny_model(attn_implementation="sdpa")
    layers = model.config.num_hidden_layers
    layernorm = train_step.with_layernorm(copy.deepcopy(model))
    assert not any(isinstance(module, TinyTxRMSNorm) for module in layernorm.modules())
    assert sum(isinstance(module, torch.nn.LayerNorm) for module in layernorm.modules()) == 2 * layers + 1
    mlp = train_step.with_gelu_mlp(model).model.layers[0].mlp
    assert not mlp.gated and mlp.up_proj.out_features == 4 * model.config.hidden_size
    assert isinstance(mlp.act_fn, GELUActivation)

    # Unrotated for the length of the step only: the logits change inside it, and
    # the rotation is back after it.
    ids = torch.arange(8)[None] % model.config.vocab_size
    inside = []
    train_step.without_rope(lambda: inside.append(model(ids).logits))()
    assert not torch.allclose(inside[0], model(ids).logits)
    assert modeling_tinytx.apply_rotary_pos_emb.__name__ == "apply_rotary_pos_emb"


@pytest.mark.engine
def test_generate(tmp_path):
    """TinyTx's generate beside llama.cpp on the same weights (the f32 GGUF), two new tokens, one round."""
    require_llama_cpp("benchmarks/generate.py's llama.cpp rows need llama.cpp")
    flags = ["--shapes", "1.1M", "--batch_sizes", "2", "--new_tokens", "2", "--repeats", "1",
             "--engines", "tinytx", "llama.cpp-f32"]
    summary = final_json(run_script(python("generate.py", *flags), tmp_path, timeout=300).stdout)
    assert summary["benchmark"] == "generate"
    rows = {row["engine"]: row for row in summary["results"]}
    assert set(rows) == {"tinytx", "llama.cpp-f32"}
    assert rows["llama.cpp-f32"]["speed_over_llama.cpp-f32"] == 1.0
    assert all(row["tokens_per_s"] > 0 and row["batch_size"] == 2 for row in rows.values())
    assert summary["shapes"][0]["parameters"] == 1_111_168


def test_attention_scaling(tmp_path):
    flags = [
        "--lengths", "64", "128", "--repeats", "1", "--hidden_size", "64", "--out_dir", tmp_path / "results",
    ]
    summary = final_json(run_script(python("attention_scaling.py", *flags), tmp_path).stdout)
    assert summary["benchmark"] == "attention_scaling"
    assert [row["n"] for row in summary["rows"]] == [64, 128]
    assert set(summary["median_growth_when_n_doubles"]) == {"eager", "sdpa"}
    assert (tmp_path / "results" / "attention_scaling.png").is_file()
    assert (
        json.loads((tmp_path / "results" / "attention_scaling.json").read_text())["rows"] == summary["rows"]
    )


def test_mfu(tmp_path):
    # the 10M default is for measuring, not testing
    flags = ["--quick", "--shape", "0.8M", "--matmul_size", "512"]
    summary = final_json(run_script(python("mfu.py", *flags), tmp_path).stdout)
    assert summary["benchmark"] == "mfu"
    assert {"mfu", "train_tflops_per_s", "matmul_tflops_per_s", "flops_per_token", "tokens_per_s"} <= set(
        summary
    )
    assert summary["mfu"] > 0
    # 6 N + 12 L T d for the 0.8M shape (untied: the input embedding is a lookup, not counted).
    n = summary["matmul_parameters"]
    assert summary["flops_per_token"] == 6 * n + 12 * 4 * 64 * 128
    assert n == summary["parameters"] - 65 * 128


def write_play(path: Path, num_bytes: int = 20_000) -> None:
    """Shakespeare-shaped text: speeches (a speaker's name, a few lines) separated by blank lines."""
    rng = random.Random(0)
    words = "thou art my lord and I shall not go to the king good night sweet prince what say you".split()
    speeches = []
    while sum(map(len, speeches)) < num_bytes:
        lines = [" ".join(rng.choices(words, k=rng.randint(4, 9))).capitalize() + "."
                 for _ in range(rng.randint(1, 4))]
        speeches.append(rng.choice(["HAMLET", "KING", "QUEEN", "HORATIO"]) + ":\n" + "\n".join(lines))
    path.write_text("\n\n".join(speeches) + "\n", encoding="utf-8")


def test_recipe_step(tmp_path):
    flags = [
        "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2",
        "--vocab_size", "300", "--batch_size", "2", "--seq_len", "32", "--repeats", "3",
    ]
    summary = final_json(run_script(python("recipe_step.py", *flags), tmp_path).stdout)
    assert summary["benchmark"] == "recipe_step"
    assert [(row["baseline"], row["ours"]) for row in summary["results"]] == [
        ("torch Muon", "StackedMuon"), ("fp32 step", "bf16 step")]
    assert all(
        row["baseline_ms"] > 0 and row["ours_ms"] > 0 and row["speedup"] > 0 for row in summary["results"]
    )


def test_shakespeare(tmp_path):
    text = tmp_path / "play.txt"
    write_play(text)
    flags = [
        "--text", text, "--max_train_seconds", "5", "--optimizer", "muon",
        # a tiny model, so the short budget still fits several steps (these flags go to pretrain.py unchanged)
        "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2",
        "--num_attention_heads", "4", "--vocab_size", "300", "--block_size", "64",
        "--per_device_train_batch_size", "8",
    ]
    summary = final_json(run_script(python("shakespeare.py", *flags), tmp_path, timeout=150).stdout)
    assert summary["benchmark"] == "shakespeare"
    assert {"bits_per_byte", "steps", "tokens", "train_seconds", "final_lr"} <= set(summary)
    assert summary["final_lr"] < 3e-3  # the schedule ran on the clock, down from its peak
    assert 0 < summary["bits_per_byte"] < 20
    assert summary["steps"] >= 1 and summary["tokens"] == summary["steps"] * 8 * 64
    # bf16, the recipe's default, only where the CPU has fast bf16 matmuls
    precision = summary["pretrain_flags"][summary["pretrain_flags"].index("--mixed_precision") + 1]
    assert precision == ("bf16" if cpu_runs_bf16_fast() else "no")


def test_shakespeare_without_text_says_what_to_give(tmp_path):
    result = run_script(python("shakespeare.py", "--text", tmp_path / "missing.txt"), tmp_path, check=False)
    assert result.returncode == 2
    assert "no text file at" in result.stderr and "missing.txt" in result.stderr


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the CPU dry run; with a GPU the session runs for real"
)
def test_the_gpu_session_runs_every_step_on_cpu_before_gpu_time_is_spent(tmp_path):
    """`DRY_RUN=1 bash benchmarks/gpu/session.sh OUT` on a copy of the checkout: the project
    installed from it, then every step on a tiny model on CPU; the training check's stopped and
    resumed run matches the straight one exactly."""
    root, out = tmp_path / "checkout", tmp_path / "out"
    # what the GPU machine gets
    listed = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    tracked = subprocess.run(listed, cwd=BENCHMARKS.parent, capture_output=True, text=True, check=True).stdout
    for name in filter(None, tracked.split("\0")):
        if (BENCHMARKS.parent / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(BENCHMARKS.parent / name, root / name)
    env = pretrain_env(tmp_path, DRY_RUN="1", PYTHON=sys.executable, SITE=str(tmp_path / "site"),
                       WORK=str(tmp_path / "work"))
    result = subprocess.run(["bash", str(root / "benchmarks" / "gpu" / "session.sh"), str(out)], env=env,
                            capture_output=True, text=True, timeout=400)
    assert result.returncode == 0 and "gpu/session.sh: every step ran" in result.stdout, result.stdout[-4000:]
    written = {"session.log", "results.jsonl", "pretrain.log", "metrics_straight.jsonl"}
    assert {p.name for p in out.iterdir()} == written
    results = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    checks = {}
    for row in results:
        checks.setdefault(row.get("check") or row["benchmark"], []).append(row)
    assert checks["environment"][0]["device"] == "no CUDA GPU"
    assert checks["flash_parity"][0]["passed"]
    assert checks["syncs"][0]["steps"] == {"training step": "none", "decoding step": "none"}
    assert [row["compiled"] for row in checks["mfu"]] == [False, True]
    (train,) = checks["gpu_train"]
    assert (
        train["weights_bit_for_bit"]
        and train["loss_diff_before_stop"] == train["loss_diff_after_resume"] == 0
    )
    assert 1 <= train["stopped_at_step"] < train["steps"] and train["tokens_per_s"] > 0
    (generate,) = checks["generate"]
    assert generate["model"] == str(tmp_path / "work" / "straight")
    assert [(r["batch_size"], r["cache"]) for r in generate["results"]] == [
        (b, c) for b in (1, 2) for c in ("dynamic", "static, eager", "static, compiled")]
    assert all(r["same_tokens_as_dynamic"] for r in generate["results"])


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the no-GPU path; with a GPU the script runs for minutes"
)
def test_gpu_check_without_gpu_exits_cleanly(tmp_path):
    result = subprocess.run(
        ["bash", str(BENCHMARKS / "gpu" / "check.sh")], env=pretrain_env(tmp_path, PYTHON=sys.executable),
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU" in result.stdout


@pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the no-GPU path; with a GPU the session runs for real"
)
def test_gpu_session_without_gpu_or_dry_run_installs_nothing_and_exits_cleanly(tmp_path):
    env = pretrain_env(tmp_path, PYTHON=sys.executable, SITE=str(tmp_path / "site"))
    result = subprocess.run(["bash", str(BENCHMARKS / "gpu" / "session.sh"), str(tmp_path / "out")], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "no CUDA GPU here" in result.stdout and "DRY_RUN=1" in result.stdout
    assert not (tmp_path / "site").exists()


def test_memory_per_rank_records_every_rank(tmp_path):
    """Each rank's peak is recorded though a launched process ends with os._exit (which skips atexit)."""
    flags = ["--device", "cpu", "--preset", "tiny", "--ranks", 2, "--steps", 2, "--modes", "ddp",
             "--output", tmp_path / "memory"]
    run_script(python("memory_per_rank.py", *flags), tmp_path, timeout=300)
    rows = json.loads((tmp_path / "memory.json").read_text())
    assert [row["mode"] for row in rows] == ["ddp"]
    assert len(rows[0]["peak_rss_bytes"]) == 2 and min(rows[0]["peak_rss_bytes"]) > 100 * 2**20
    assert "| ddp |" in (tmp_path / "memory.txt").read_text()


def test_token_store_compares_the_store_with_the_nanogpt_style_baseline(tmp_path):
    flags = ["--sizes", 0.5, "--two_ranks", 0, "--rounds", 1, "--output", tmp_path / "store"]
    summary = final_json(run_script(python("token_store.py", *flags), tmp_path, timeout=600).stdout)
    assert summary["benchmark"] == "token_store"
    (row,) = summary["results"]
    ways = row["tokenizing"]
    assert {"baseline", "store_1"} <= set(ways) and ways["baseline"]["tokens"] == ways["store_1"]["tokens"]
    assert row["cold"]["processes_that_tokenized"] == 1 and row["warm"]["processes_that_tokenized"] == 0
    assert "| 0.5 MB | cold |" in (tmp_path / "store.txt").read_text()


def test_hub_checkpoint_times_training_with_and_without_pushing_checkpoints(tmp_path):
    pin = ["--pin_server"] if len(os.sched_getaffinity(0)) >= 2 else []  # the server on a core of its own
    ran = run_script(python("hub_checkpoint.py", "--quick", *pin, "--output", tmp_path / "hub"), tmp_path)
    summary = final_json(ran.stdout)
    assert summary["benchmark"] == "hub_checkpoint" and summary["shared_machine"] is True
    assert "load average" in summary["uptime_before"] and summary["command"].endswith(str(tmp_path / "hub"))
    if pin:
        cpus = sorted(os.sched_getaffinity(0))
        assert summary["pinned"] == {"training": cpus[:-1], "server": cpus[-1:]}
        assert f"Pinned: training on CPUs {cpus[:-1]}" in (tmp_path / "hub.txt").read_text()
    (pair,) = summary["pairs"]
    assert pair["plain"]["steps"] == pair["pushed"]["steps"] == 6
    assert pair["ratio"] == pair["pushed"]["steps_per_second"] / pair["plain"]["steps_per_second"] > 0
    assert [u["message"] for u in pair["uploads"]][0] == "Resumable checkpoint at step 2"
    # fp32 weights and at least one optimizer state each (Muon's momentum); base64 on the wire
    assert all(u["file_bytes"] > 2 * 4 * pair["plain"]["parameters"] for u in pair["uploads"])
    assert all(u["wire_bytes"] > u["file_bytes"] and u["seconds"] > 0 for u in pair["uploads"])
    s = summary["summary"]
    assert {"median_paired_ratio", "upload_seconds", "checkpoint_file_bytes", "checkpoint_wire_bytes",
            "plain_steps_per_second", "pushed_steps_per_second"} <= set(s)
    assert "| 1 | plain |" in (tmp_path / "hub.txt").read_text()
    assert json.loads((tmp_path / "hub.json").read_text())["summary"] == s


def test_plan_sweep_trains_each_point_in_fixed_tokens_and_fits_the_law(tmp_path):
    text, out = tmp_path / "play.txt", tmp_path / "sweep.jsonl"
    write_play(text)
    points = ["0:4096", "0:8192", "1:4096", "1:8192"]
    command = python("plan_sweep.py", "--text", text, "--out", out, "--jobs", "1", "--points", *points)
    result = run_script(command, tmp_path, timeout=300)
    summary = final_json(result.stdout)
    assert summary["benchmark"] == "plan_sweep" and len(summary["points"]) == 4
    assert [row["steps"] for row in summary["points"]] == [2, 4, 2, 4]  # 2,048 tokens a step
    assert len(out.read_text().splitlines()) == 4  # kept, so a stopped sweep goes on
    assert "law (training/plan/law.py's FITTED)" in result.stdout


def test_planned_runs_compares_the_planned_run_with_the_defaults(tmp_path):
    text = tmp_path / "play.txt"
    write_play(text)
    result = run_script(python("planned_runs.py", "--text", text, "--budgets", "3", "--arms", "planned",
                               "defaults", "--keep_planned", tmp_path / "kept"), tmp_path, timeout=300)
    summary = final_json(result.stdout)
    runs = {row["arm"]: row for row in summary["runs"]}
    assert set(runs) == {"planned", "defaults"}
    assert runs["planned"]["plan"].startswith("Plan: ") and runs["defaults"]["plan"] is None
    assert runs["defaults"]["hidden_size"] == 64  # the micro model
    assert (tmp_path / "kept" / "3s" / "model.safetensors").is_file()


def test_busy_machine_runs_the_quick_start_idle_and_beside_busy_loops(tmp_path):
    flags = ["--loops", "1", "--one_thread", "--", *TINY_PRETRAIN_ARGS, "--max_train_steps", "6",
             "--num_probes_per_kind", "0", "--num_samples", "0"]
    result = run_script(python("busy_machine.py", *flags), tmp_path, timeout=300)
    summary = final_json(result.stdout)
    assert [(row["loops"], row["steps"]) for row in summary["runs"]] == [(0, 6), (0, 6), (1, 6)]
    assert all(isinstance(row["threads"], int) and row["threads"] >= 1 for row in summary["runs"])
    assert summary["runs"][1]["one_thread"] and summary["runs"][1]["threads"] == 1
    assert set(summary["wall_ratio"]) == {"1"} and summary["wall_ratio"]["1"] > 0
    assert summary["fair_share_bound"]["1"] > 0 and summary["tokens_per_second_ratio"]["1"] > 0
    ratio_row = r"^beside 1 busy loops / idle *\| x\d+\.\d\d wall"
    assert re.search(ratio_row, result.stdout, re.MULTILINE), result.stdout
    assert re.search(r"^beside 1 busy loops / idle, tokens/s *\| x\d+\.\d\d \(the fair share's bound: x",
                     result.stdout, re.MULTILINE), result.stdout
