"""What pushing resumable checkpoints to the Hub costs a run (issue 68): steps per second with and without
`--hub_strategy checkpoint`, upload time and bytes per checkpoint, at the `small` preset.

    python -m benchmarks.hub_checkpoint                      # small preset, 20 steps, a checkpoint every 5,
                                                             # 3 pairs: benchmarks/results/hub_checkpoint.*
    python -m benchmarks.hub_checkpoint --quick --output /tmp/h   # a tiny model, 1 pair (the smoke test's)
    python -m benchmarks.hub_checkpoint --pairs 5 --pin_server     # the server on a core of its own

Each pair runs training/pretrain.py twice, the same command: once plain, once with `--push_to_hub
--hub_strategy checkpoint` to a local Hub-compatible server (tests/helpers/hub_server.py, the real
huggingface_hub client; there is no internet here). The pairs alternate which run goes first, so a noisy
neighbour slows both sides alike; the paired ratio is the figure that matters on a shared machine.

Steps per second come from the run's own metrics.jsonl: steps 2..N over the seconds between them, which
covers every checkpoint but the final one (the first step pays for warm-up, the end for evaluation). Upload
time is the server's: from the first request of an upload to its commit answered whole. Bytes are the files
of last-checkpoint/ and the request bodies the client sent: as on the Hub, files from 10 MiB go by LFS (raw
bytes PUT; the server speaks no Xet, so the client's Xet path is off), smaller ones inline in the commit.

The server runs in this process, on this machine's cores: on the Hub its work is remote. --pin_server keeps
it on the last core and the training runs (their upload thread included) on the others, so the pushed run
pays for the client's side alone.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.helpers: the local Hub lives with the tests, the only user until now
from tests.helpers.hub_server import LocalHub  # noqa: E402


RESULTS = ROOT / "benchmarks" / "results"
PRETRAIN = str(ROOT / "training" / "pretrain.py")
COMMON = ["--num_probes_per_kind", "0", "--num_samples", "0", "--max_train_seconds", "0",
          "--eval_steps", "1000"]
SMALL = ["--model_preset", "small"]
TINY = [  # tests/helpers/tiny.py's TINY_PRETRAIN_ARGS model, seconds a run
    "--hidden_size", "64", "--intermediate_size", "128", "--num_hidden_layers", "2", "--num_attention_heads",
    "4", "--num_train_documents", "300", "--vocab_size", "320", "--block_size", "64",
    "--per_device_train_batch_size", "8", "--max_eval_batches", "2",
]
CHECKPOINT = "Resumable checkpoint at step"
TRAIN_CPUS: set[int] | None = None  # --pin_server: the cores the training runs may use
LFS_FROM = 10 * 2**20  # the Hub takes larger files (and *.safetensors, *.bin) by LFS or Xet, never inline


def load() -> float:
    return round(os.getloadavg()[0], 2)


def client_env(hub: LocalHub, home: Path) -> dict:
    """os.environ without the machine's Hub settings, plus the local server's (both sides get the same)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "TRANSFORMERS_"))}
    env.pop("PYTHONPATH", None)
    return {**env, "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg", **hub.client_env(home, lfs=True)}


def steps_per_second(metrics: Path) -> tuple[float, int]:
    """Steps 2..N over the seconds between step 1 and step N, from the run's own log."""
    steps = [json.loads(line) for line in metrics.read_text().splitlines() if '"loss"' in line]
    steps = [row for row in steps if "elapsed_seconds" in row and "final" not in row]
    first, last = steps[0], steps[-1]
    return (last["step"] - first["step"]) / (last["elapsed_seconds"] - first["elapsed_seconds"]), last["step"]


def run(model: list[str], steps: int, every: int, work: Path, hub: LocalHub, push: str | None) -> dict:
    out = work / ("pushed" if push else "plain")
    command = [sys.executable, PRETRAIN, *model, *COMMON, "--max_train_steps", str(steps),
               "--checkpointing_steps", str(every), "--output_dir", str(out)]
    if push:
        command += ["--push_to_hub", "--hub_strategy", "checkpoint", "--hub_model_id", push]
    before = load()
    pin = (lambda: os.sched_setaffinity(0, TRAIN_CPUS)) if TRAIN_CPUS else None
    done = subprocess.run(command, env=client_env(hub, work / "hf_home"), cwd=work, capture_output=True,
                          text=True, timeout=1800, preexec_fn=pin)
    if done.returncode != 0:
        raise SystemExit(f"pretrain failed ({done.returncode}):\n{done.stdout[-2000:]}\n"
                         f"{done.stderr[-3000:]}")
    rate, last = steps_per_second(out / "metrics.jsonl")
    parameters = int(re.search(r"TinyTx with ([\d,]+) parameters", done.stdout).group(1).replace(",", ""))
    threads = re.search(r"CPU threads: (\d+)", done.stdout)
    return {"steps_per_second": rate, "steps": last, "parameters": parameters, "load_before": before,
            "load_after": load(), "threads": int(threads.group(1)) if threads else None}


def uploads(hub: LocalHub, repo: str) -> list[dict]:
    """Each checkpoint commit of `repo`, pushed by the one run that talked to `hub`: the seconds from
    the first request after the previous commit (repo, listing, preupload, LFS batch and PUTs) to the commit
    answered whole; the bytes the client sent; the bytes of last-checkpoint/'s files."""
    requests = hub.requests
    answered = [r for r in requests if r.method == "POST" and "/commit/" in r.path and r.status == 200]
    history = list(reversed(hub.commits(repo)))[1:]  # oldest first, the server's initial commit left out
    assert len(answered) == len(history), (len(answered), [c.message for c in history])
    rows, after = [], 0.0
    for request, commit in zip(answered, history):
        window = [r for r in requests if after <= r.started <= request.started]
        after = request.finished
        if commit.message.startswith(CHECKPOINT):
            files = hub.repo_files(repo, commit.oid)
            rows.append({"message": commit.message, "seconds": request.finished - window[0].started,
                         "wire_bytes": sum(r.received for r in window),
                         "file_bytes": sum(len(data) for path, data in files.items()
                                           if path.startswith("last-checkpoint/"))})
    return rows


def pairs(model: list[str], steps: int, every: int, count: int) -> list[dict]:
    """`count` pairs, plain and pushed; every other pair the pushed run goes first. Each pair has a server
    of its own: one that already holds a checkpoint's LFS objects (the same seed trains the same bytes)
    would not ask for them again."""
    rows = []
    for n in range(count):
        sides = {}
        with LocalHub(lfs_from=LFS_FROM) as hub:
            repo = f"{hub.user}/hub-checkpoint-bench"
            for side in ("plain", "pushed") if n % 2 == 0 else ("pushed", "plain"):
                push = repo if side == "pushed" else None
                with tempfile.TemporaryDirectory(prefix="hub-bench-") as work:
                    sides[side] = run(model, steps, every, Path(work), hub, push)
            sides["uploads"] = uploads(hub, repo)
        sides["ratio"] = sides["pushed"]["steps_per_second"] / sides["plain"]["steps_per_second"]
        sides["first"] = "plain" if n % 2 == 0 else "pushed"
        rows.append(sides)
        print(f"pair {n + 1}/{count}: plain {sides['plain']['steps_per_second']:.3f} steps/s, pushed "
              f"{sides['pushed']['steps_per_second']:.3f} steps/s, ratio {sides['ratio']:.3f}", flush=True)
    return rows


def summary(rows: list[dict]) -> dict:
    each = [upload for row in rows for upload in row["uploads"]]
    median = statistics.median
    return {
        "plain_steps_per_second": median(row["plain"]["steps_per_second"] for row in rows),
        "pushed_steps_per_second": median(row["pushed"]["steps_per_second"] for row in rows),
        "median_paired_ratio": median(row["ratio"] for row in rows),
        "upload_seconds": median(upload["seconds"] for upload in each),
        "upload_seconds_max": max(upload["seconds"] for upload in each),
        "checkpoint_file_bytes": median(upload["file_bytes"] for upload in each),
        "checkpoint_wire_bytes": median(upload["wire_bytes"] for upload in each),
        "uploads": len(each),
    }


def table(result: dict) -> list[str]:
    s, rows, plan = result["summary"], result["pairs"], result["plan"]
    lines = [
        f"Pushing resumable checkpoints (--hub_strategy checkpoint) at {plan['model']}: "
        f"{rows[0]['plain']['parameters']:,} parameters, {plan['steps']} steps, a checkpoint every "
        f"{plan['every']} steps, {len(rows)} pair(s), to a local Hub-compatible server on this machine.",
        f"Command: {result['command']}",
        f"Machine: {result['cores']} cores SHARED with other work (the load average moved during the runs); "
        f"uptime before: {result['uptime_before']}; after: {result['uptime_after']}.",
        *([f"Pinned: training on CPUs {result['pinned']['training']}, the Hub server on "
           f"{result['pinned']['server']}: the pushed run pays for the client's side alone."]
          if result.get("pinned") else []),
        "",
        "| pair | first | plain steps/s | pushed steps/s | pushed / plain | load before (plain, pushed) |",
        "|---|---|---|---|---|---|",
    ]
    for n, row in enumerate(rows, 1):
        lines.append(f"| {n} | {row['first']} | {row['plain']['steps_per_second']:.3f} | "
                     f"{row['pushed']['steps_per_second']:.3f} | {row['ratio']:.3f} | "
                     f"{row['plain']['load_before']}, {row['pushed']['load_before']} |")
    lines += [
        "",
        f"Median paired ratio (pushed / plain steps per second): {s['median_paired_ratio']:.3f} "
        f"(goal: at least 0.95). The pairs range from {min(r['ratio'] for r in rows):.3f} to "
        f"{max(r['ratio'] for r in rows):.3f}: on a shared machine the other work moves a run by more than "
        "the goal, so only the median of many pairs speaks.",
        f"Upload per checkpoint (server side, {s['uploads']} uploads): median {s['upload_seconds']:.2f} s, "
        f"max {s['upload_seconds_max']:.2f} s; {s['checkpoint_file_bytes'] / 1e6:.1f} MB of files, "
        f"{s['checkpoint_wire_bytes'] / 1e6:.1f} MB sent (files from 10 MiB by LFS, raw; smaller ones "
        f"inline, base64); "
        f"{s['checkpoint_file_bytes'] / plan['every'] / 1e6:.1f} MB per training step.",
        "Steps/s from each run's metrics.jsonl (steps 2..N). The upload runs in the background; on the real "
        "Hub it is bound by the network instead of loopback, and the step rate by the same CPU work.",
    ]
    return lines


def pin_server() -> dict:
    """This process (and the server threads it starts) on the last core, the training runs on the others."""
    global TRAIN_CPUS
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin_server needs 2 cores or more: one for the server, the rest for training.")
    TRAIN_CPUS = set(cpus[:-1])
    os.sched_setaffinity(0, {cpus[-1]})
    return {"training": cpus[:-1], "server": cpus[-1:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=3,
                        help="plain/pushed pairs, alternating which goes first")
    parser.add_argument("--steps", type=int, default=20, help="training steps a run")
    parser.add_argument("--checkpointing_steps", type=int, default=5, help="steps between checkpoints")
    parser.add_argument("--quick", action="store_true",
                        help="a tiny model, 1 pair, 6 steps; writes nothing unless --output")
    parser.add_argument("--pin_server", action="store_true",
                        help="the server on the last core, the training runs on the others")
    parser.add_argument("--output", default=None,
                        help="writes OUTPUT.txt and .json (default: benchmarks/results/hub_checkpoint)")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.steps, args.checkpointing_steps = 1, 6, 2
    output = args.output or (None if args.quick else str(RESULTS / "hub_checkpoint"))
    uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    pinned = pin_server() if args.pin_server else None
    rows = pairs(TINY if args.quick else SMALL, args.steps, args.checkpointing_steps, args.pairs)
    result = {
        "benchmark": "hub_checkpoint",
        "command": ("python -m benchmarks.hub_checkpoint " + " ".join(sys.argv[1:])).strip(),
        "cores": len(os.sched_getaffinity(0)), "shared_machine": True,
        "uptime_before": uptime,
        "uptime_after": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "plan": {"model": "a tiny model (--quick)" if args.quick else "the small preset", "steps": args.steps,
                 "every": args.checkpointing_steps},
        "summary": summary(rows), "pairs": rows, "pinned": pinned,
    }
    lines = table(result)
    if output:
        Path(output).parent.mkdir(parents=True, exist_ok=True)
        Path(output + ".txt").write_text("\n".join(lines) + "\n")
        Path(output + ".json").write_text(json.dumps(result, indent=1) + "\n")
    print("\n".join(lines))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
