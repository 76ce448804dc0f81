"""The README's training command on a GPU: throughput, MFU and peak memory, then a
preempted run resumed bit for bit.

    python -m benchmarks.gpu.train_check --output_dir /tmp/gpu_train          # ~124M (base preset), bf16,
        compiled
    python -m benchmarks.gpu.train_check --output_dir /tmp/dry --device cpu   # the same code path on a tiny
        model

Three launches of `tinytx pretrain` (python -m hf_tinytx_training.pretrain) with the same flags
(--max_train_steps, --checkpointing_steps at half way):
1. straight: the whole run. Its metrics.jsonl gives the steady tokens/s (the median over windows of steps, so
   the compiling first steps, evaluations and checkpoints drop out), MFU (useful FLOP/s of benchmarks/mfu.py's
   formula over the FLOP/s of one large matmul measured here first) and the final row's peak GPU memory.
2. stopped: SIGTERM once a third of the steps are logged, as a preempting scheduler sends it; the run saves a
   checkpoint at its next step boundary and exits.
3. resumed: the same command with --resume_from_checkpoint latest, to the end.
The weights of (3) are compared with (1). The losses of (2) before the signal, against (1)'s, tell run-to-run
spread (non-deterministic GPU kernels: atomics in the embedding and attention backward) from a fault of the
resume: if the runs already differ before the stop, the resumed weights can differ by as much and the resume
is not to blame. Prints a table and one JSON line; exits 1 when a launch fails.
"""

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.report import print_report  # noqa: E402


PRETRAIN = ["-m", "hf_tinytx_training.pretrain"]  # as `tinytx pretrain` runs it: from the installed package


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--output_dir", required=True, help="Where the three runs go (straight/, resumed/).")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cpu: a dry run of the code path on the tiny preset, no figures worth quoting")
    parser.add_argument(
        "--steps", type=int, default=None, help="Optimizer steps (default: 600 on cuda, 6 on cpu)."
    )
    parser.add_argument(
        "pretrain_flags", nargs=argparse.REMAINDER,
        help="After --: more flags for pretrain.py (they replace the defaults of the same name)",
    )
    return parser.parse_args(argv)


def pretrain_flags(args) -> list[str]:
    """The README's main command at the base preset in bf16 with compile (cuda), or a tiny quick one (cpu)."""
    steps = args.steps or (600 if args.device == "cuda" else 6)
    if args.device == "cuda":
        flags = {"--model_preset": "base", "--block_size": "1024", "--per_device_train_batch_size": "16",
                 "--mixed_precision": "bf16", "--attn_implementation": "sdpa", "--torch_compile": "true"}
    else:
        flags = {"--model_preset": "tiny", "--block_size": "64", "--per_device_train_batch_size": "8",
                 "--num_train_documents": "400", "--vocab_size": "512", "--num_samples": "0",
                 "--num_probes_per_kind": "0"}
    flags.update({"--max_train_steps": str(steps), "--checkpointing_steps": str(max(steps // 2, 1)),
                  "--eval_steps": str(steps), "--max_eval_batches": "4", "--seed": "0"})
    extra = [flag for flag in args.pretrain_flags if flag != "--"]
    for name, value in zip(extra[::2], extra[1::2]):
        flags[name] = value
    return [item for pair in flags.items() for item in pair]


def launch(flags: list[str], output_dir: Path, log: Path, stop_after_step: int | None = None) -> int:
    """Runs pretrain.py (its output into `log`); with stop_after_step, SIGTERM once
    that step is in metrics.jsonl."""
    command = [sys.executable, *PRETRAIN, *flags, "--output_dir", str(output_dir)]
    with open(log, "a", encoding="utf-8") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        while stop_after_step is not None and process.poll() is None:
            if last_step(output_dir / "metrics.jsonl") >= stop_after_step:
                process.send_signal(signal.SIGTERM)
                break
            time.sleep(0.2)
        return process.wait()


def rows(metrics: Path) -> list[dict]:
    if not metrics.exists():
        return []
    lines = metrics.read_text(encoding="utf-8").splitlines()
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:  # a line being written as we read
            continue
    return parsed


def last_step(metrics: Path) -> int:
    return max((row["step"] for row in rows(metrics) if "loss" in row), default=0)


def steady_tokens_per_second(training_rows: list[dict]) -> float:
    """The median rate over windows of consecutive steps after the first tenth (compilation, warm-up)."""
    training_rows = [row for row in training_rows if "elapsed_seconds" in row]
    start = max(len(training_rows) // 10, 1)
    window = max((len(training_rows) - start) // 20, 1)
    rates = []
    for first in range(start, len(training_rows) - window, window):
        a, b = training_rows[first], training_rows[first + window]
        seconds = b["elapsed_seconds"] - a["elapsed_seconds"]
        if seconds > 0:
            rates.append((b["tokens"] - a["tokens"]) / seconds)
    return statistics.median(rates)


def matmul_tflops(device: str) -> float:
    """FLOP/s of one large matmul on this device (bf16 8192 on a GPU, fp32 2048 on
    CPU): MFU's roof, as mfu.py's."""
    import torch

    from benchmarks.mfu import make_matmul, synchronized

    size, dtype = (8192, torch.bfloat16) if device == "cuda" else (2048, torch.float32)
    matmul = synchronized(make_matmul(size, dtype, device), device)
    for _ in range(3):
        matmul()
    samples = []
    for _ in range(10):
        start = time.perf_counter()
        matmul()
        samples.append(time.perf_counter() - start)
    return 2 * size**3 / statistics.median(samples) / 1e12


def flops_per_token(folder: Path, seq_len: int) -> float:
    from benchmarks.mfu import flops_per_token as weight_and_attention
    from hf_tinytx import TinyTxForCausalLM

    model = TinyTxForCausalLM.from_pretrained(folder)
    return sum(weight_and_attention(model, seq_len))


def weight_difference(a: Path, b: Path) -> tuple[float, bool]:
    """(max |a - b| over every tensor, whether every tensor is identical)."""
    from safetensors.torch import load_file

    left, right = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    assert left.keys() == right.keys(), (sorted(left), sorted(right))
    diffs = [(left[k].float() - right[k].float()).abs().max().item() for k in left]
    return max(diffs), all(left[k].equal(right[k]) for k in left)


def loss_difference(a: list[dict], b: list[dict], steps: range) -> float | None:
    losses = {row["step"]: row["loss"] for row in a if "loss" in row}
    pairs = [(losses[row["step"]], row["loss"]) for row in b if "loss" in row and row["step"] in steps]
    return max((abs(x - y) for x, y in pairs), default=None)


def main(args) -> int:
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "gpu/train_check.py: no CUDA GPU here (torch.cuda.is_available() is False); --device cpu runs "
            "the code path on a tiny model. Nothing run."
        )
        return 0
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    flags, log = pretrain_flags(args), out / "pretrain.log"
    steps = int(flags[flags.index("--max_train_steps") + 1])
    seq_len = int(flags[flags.index("--block_size") + 1])
    roof = matmul_tflops(args.device)
    straight, resumed = out / "straight", out / "resumed"
    timings = {}
    for name, folder, kwargs in (
        ("straight", straight, {}), ("stopped", resumed, {"stop_after_step": steps // 3}),
    ):
        begin = time.perf_counter()
        code = launch(flags, folder, log, **kwargs)
        timings[name] = time.perf_counter() - begin
        if code != (0 if name == "straight" else 128 + signal.SIGTERM):
            print(f"gpu/train_check.py: the {name} run exited {code}; see {log}")
            return 1
    straight_rows, stopped_rows = rows(straight / "metrics.jsonl"), rows(resumed / "metrics.jsonl")
    stopped_at = last_step(resumed / "metrics.jsonl")
    begin = time.perf_counter()
    code = launch([*flags, "--resume_from_checkpoint", "latest"], resumed, log)
    timings["resumed"] = time.perf_counter() - begin
    if code != 0:
        print(f"gpu/train_check.py: the resumed run exited {code}; see {log}")
        return 1
    resumed_rows = rows(resumed / "metrics.jsonl")
    tokens_per_s = steady_tokens_per_second([row for row in straight_rows if "loss" in row])
    achieved = tokens_per_s * flops_per_token(straight, seq_len) / 1e12
    final = next(row for row in reversed(straight_rows) if row.get("final") and "eval_loss" in row)
    max_diff, identical = weight_difference(straight, resumed)
    result = {
        "check": "gpu_train",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "torch": torch.__version__,
        "pretrain_flags": flags,
        "steps": steps,
        "stopped_at_step": stopped_at,
        "tokens_per_s": tokens_per_s,
        "train_tflops_per_s": achieved,
        "matmul_tflops_per_s": roof,
        "mfu": achieved / roof,
        "peak_gpu_memory_gib": final.get("peak_gpu_memory_gib"),
        "eval_loss": final["eval_loss"],
        "launch_seconds": timings,
        "loss_diff_before_stop": loss_difference(straight_rows, stopped_rows, range(1, stopped_at + 1)),
        "loss_diff_after_resume": loss_difference(
            straight_rows, resumed_rows, range(stopped_at + 1, steps + 1)
        ),
        "weights_max_abs_diff": max_diff,
        "weights_bit_for_bit": identical,
    }
    table = [
        ("run", " ".join(flags)),
        ("steady throughput", f"{tokens_per_s:,.0f} tokens/s ({achieved:.1f} TFLOP/s useful)"),
        ("matmul roof (measured)", f"{roof:.1f} TFLOP/s"),
        ("MFU", f"{result['mfu']:.1%}"),
        ("peak GPU memory", f"{result['peak_gpu_memory_gib']} GiB"),
        ("launches (s)", ", ".join(f"{k} {v:.0f}" for k, v in timings.items())),
        ("SIGTERM, stopped at step", f"{stopped_at} of {steps}"),
        ("max |loss diff| before the stop", f"{result['loss_diff_before_stop']}"),
        ("max |loss diff| after the resume", f"{result['loss_diff_after_resume']}"),
        ("resumed vs straight weights", f"bit for bit: {identical}; max |diff| {max_diff:.3e}"),
    ]
    print_report(table, result)
    return 0


if __name__ == "__main__":
    sys.exit(main(parse_args()))
