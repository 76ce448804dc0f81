"""Peak resident memory per rank: DDP vs FSDP2 vs DeepSpeed ZeRO-2 and ZeRO-3, 2 CPU ranks, `small` preset.

    python -m benchmarks.memory_per_rank                      # writes
                                                              # benchmarks/results/memory_per_rank.{json,txt}
    python -m benchmarks.memory_per_rank --steps 3 --modes ddp fsdp2
    python -m benchmarks.memory_per_rank --device cuda --preset base --ranks 8 --modes ddp fsdp2 zero3   #
                                                              GPUs, bf16

Each mode runs training/pretrain.py for a few steps on 2 processes (gloo, OMP_NUM_THREADS=1 each); every rank
runs the script through this file's `--rank` mode, which records its own peak resident set size (getrusage
ru_maxrss) when the script exits (its os._exit included). The peak includes Python, torch and the data
pipeline (the same in every mode), so the difference between modes is what sharding saves; the model-state
bytes each rank holds are taken from the script's own line (printed by the sharded modes). The ZeRO modes need
deepspeed (`pip install -e ".[deepspeed]"`).
"""

import argparse
import atexit
import importlib.util
import json
import os
import re
import resource
import runpy
import subprocess
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
CONFIGS = ROOT / "training" / "configs"
CONFIG_FILES = {"fsdp2": "accelerate-fsdp2.yaml", "zero2": "accelerate-deepspeed-zero2.yaml",
                "zero3": "accelerate-deepspeed-zero3.yaml", "gpu-ddp": "accelerate-ddp.yaml"}


def launcher(mode: str, device: str, ranks: int) -> list[str]:
    if mode == "ddp" and device == "cpu":  # the script asks Accelerate for CPU DDP itself
        return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    config = CONFIG_FILES["gpu-ddp" if mode == "ddp" else mode]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config),
            "--num_processes", str(ranks)]


def rank_main(report: str, script_args: list[str]) -> None:
    """Runs the script as __main__ and appends this process's peak RSS to `report` at exit."""
    def record():
        with open(report, "a", encoding="utf-8") as f:
            rank = int(os.environ.get("RANK", "0"))
            torch = sys.modules.get("torch")
            cuda = (
                torch.cuda.max_memory_allocated() if torch is not None and torch.cuda.is_initialized() else 0
            )
            f.write(
                json.dumps(
                    {
                        "rank": rank,
                        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                        "peak_cuda_bytes": cuda,
                    }
                )
                + "\n"
            )

    atexit.register(record)
    # A process of a multi-process launch ends with os._exit (training/cli.exit_launched_process), which
    # skips atexit: record there too.
    leave = os._exit

    def record_and_leave(code):
        atexit.unregister(record)
        record()
        leave(code)

    os._exit = record_and_leave
    sys.argv = script_args
    runpy.run_path(script_args[0], run_name="__main__")


def run_mode(mode: str, args, workdir: Path) -> dict:
    report = workdir / f"{mode}.jsonl"
    gpu = ["--mixed_precision", "bf16", "--attn_implementation", args.attn_implementation]
    gpu = gpu if args.device == "cuda" else []
    command = [
        *launcher(mode, args.device, args.ranks), __file__, "--rank", str(report),
        str(ROOT / "training" / "pretrain.py"), "--model_preset", args.preset,
        "--block_size", str(args.block_size), "--per_device_train_batch_size", str(args.batch_size),
        "--num_train_documents", "2000", "--max_train_steps", str(args.steps), "--max_eval_batches", "1",
        "--num_probes_per_kind", "0", "--num_samples", "0", "--max_train_seconds", "0",
        "--output_dir", str(workdir / mode), *gpu,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg",
           "HF_HOME": str(workdir / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
    if result.returncode != 0:
        raise SystemExit(f"{mode} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    ranks = sorted((json.loads(line) for line in report.read_text().splitlines()), key=lambda r: r["rank"])
    held = re.findall(
        r"holds [\d,]+ of ([\d,]+) parameters \(([\d.]+)%, ([\d,]+) bytes\) and .*?, ([\d,]+) bytes\)",
        result.stdout,
    )
    parameters = re.search(r"TinyTx with ([\d,]+) parameters", result.stdout).group(1)
    steps = [json.loads(line) for line in (workdir / mode / "metrics.jsonl").read_text().splitlines()]
    return {
        "mode": mode, "parameters": int(parameters.replace(",", "")),
        "seconds": round(time.perf_counter() - start),
        "tokens_per_second": [r["tokens_per_second"] for r in steps if "tokens_per_second" in r][-1],
        "peak_rss_bytes": [r["peak_rss_bytes"] for r in ranks],
        "peak_cuda_bytes": [r["peak_cuda_bytes"] for r in ranks],
        "model_state_bytes_held": [int(p.replace(",", "")) + int(s.replace(",", "")) for _, _, p, s in held],
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2], sys.argv[3:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["ddp", "fsdp2", "zero2", "zero3"],
                        choices=["ddp", "fsdp2", "zero2", "zero3"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--block_size", type=int, default=256)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument(
        "--output", default=str(RESULTS / "memory_per_rank"), help="writes OUTPUT.txt and .json"
    )
    args = parser.parse_args()
    modes = args.modes
    if any(m.startswith("zero") for m in modes) and importlib.util.find_spec("deepspeed") is None:
        raise SystemExit(
            "memory_per_rank.py: error: the zero modes need deepspeed: pip install -e '.[deepspeed]', or "
            "leave them out of --modes."
        )
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run_mode(mode, args, Path(tmp)) for mode in modes]
    text = "\n".join(table(rows, args, modes))
    print(text)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output + ".txt").write_text(text + "\n")
    Path(args.output + ".json").write_text(json.dumps(rows, indent=1) + "\n")


def table(rows: list[dict], args, modes: list[str]) -> list[str]:
    def mib(values):
        return ", ".join(f"{b / 2**20:,.0f}" for b in values) or "-"

    lines = [f"Peak memory per rank, {args.ranks} {args.device} ranks, `{args.preset}` preset "
             f"({rows[0]['parameters']:,} parameters), {args.steps} steps, batch {args.batch_size} x "
             f"{args.block_size} per rank:", "",
             "| mode | peak RSS per rank (MiB) | peak CUDA per rank (MiB) | model state held per rank (MiB) "
             "| tokens/s |",
             "|---|---|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['mode']} | {mib(row['peak_rss_bytes'])} | {mib(row['peak_cuda_bytes'])} | "
                     f"{mib(row['model_state_bytes_held'])} | {row['tokens_per_second']:,} |")
    options = f"--device {args.device} --preset {args.preset} --ranks {args.ranks} --steps {args.steps}"
    lines += [
        "",
        "Model state held = parameters + AdamW moments as each rank holds them (printed by the sharded "
        "runs; DDP holds all of both, ZeRO-2 all parameters; ZeRO keeps an fp32 master copy of its "
        "partition besides, not counted here). Peak RSS also counts Python, torch, the data pipeline, the "
        "full model each rank builds before sharding, and rank 0's gathered export.",
        "",
        "tokens/s: measured on a machine shared with other work, under load: compare memory, not time.",
    ]
    return lines + ["", f"Command: python -m benchmarks.memory_per_rank {options} --modes {' '.join(modes)}"]


if __name__ == "__main__":
    main()
