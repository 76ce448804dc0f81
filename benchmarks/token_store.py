"""Training on one's own corpus (issue 55): tokenizing speed, store size, time to step 1 and peak memory.

    python -m benchmarks.token_store                       # 10 MB and 100 MB:
                                                           # benchmarks/results/token_store.{json,txt}
    python -m benchmarks.token_store --sizes 10 100 1000   # and 1 GB (about 25 min more on 2 busy cores)
    python -m benchmarks.token_store --sizes 1 --two_ranks 0 --output /tmp/t   # the smoke test's

For each generated corpus (paragraphs of pseudo-words drawn by a Zipf law, blank
lines between them; deterministic):

- Tokenizing, in this process, with one tokenizer (a byte-level BPE of 2,048 trained on the corpus's start):
  the nanoGPT-style baseline (prepare.py's way: `tokenizers`' batch encode on one thread, the ids written to a
  uint16 memmap), then the token store (training/data/token_store.py) with 1 worker and with one per core.
  MB/s, MB/s per core, and bytes on disk per byte of text.
- `training/pretrain.py --train_file` for 20 steps of a 0.36M-parameter model: cold (nothing
  tokenized yet) and warm (a second run sharing the first one's --token_store): seconds from launch
  to step 1 and to the end, the peak RSS of its largest process (VmHWM) and of all its processes
  together (their RSS summed, sampled every 0.2 s).
- 2 ranks (`torchrun --nproc_per_node 2`) on the largest corpus up to --two_ranks MB: the same cold run;
  how many processes tokenized (1 expected).

The machine's other work moves every time: each figure is given beside the
1-minute load average when it was taken.
"""

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np


ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PRETRAIN = str(ROOT / "training" / "pretrain.py")
MODEL = [
    "--hidden_size", "64", "--intermediate_size", "192", "--num_hidden_layers", "2",
    "--num_attention_heads", "4", "--vocab_size", "2048", "--max_train_steps", "20",
    "--num_warmup_steps", "2", "--num_probes_per_kind", "0", "--num_samples", "0", "--max_train_seconds", "0",
]


def load() -> float:
    return round(os.getloadavg()[0], 1)


def write_corpus(path: Path, megabytes: float, seed: int = 0) -> int:
    """Paragraphs of 20-120 pseudo-words (a vocabulary of 5,000,
    Zipf-distributed), blank lines between them."""
    rng = np.random.default_rng(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in "aeiou"]
    words = np.array(["".join(rng.choice(syllables, rng.integers(1, 4))) for _ in range(5000)])
    weights = 1 / np.arange(1, 5001)
    weights /= weights.sum()
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        while written < megabytes * 1e6:
            drawn = words[rng.choice(5000, size=200_000, p=weights)]
            cuts = np.cumsum(rng.integers(20, 120, size=4000))
            cuts = cuts[cuts < len(drawn)]
            text = "\n\n".join(" ".join(part).capitalize() + "." for part in np.split(drawn, cuts)) + "\n\n"
            f.write(text)
            written += len(text)
    return os.path.getsize(path)


def train_tokenizer(path: Path, folder: Path):
    from hf_tinytx.tokenization import train_bpe_tokenizer
    from hf_tinytx_training.data.documents import file_sources
    from hf_tinytx_training.data.sources import tokenizer_texts

    tokenizer = train_bpe_tokenizer(tokenizer_texts(file_sources([str(path)], "-", "text", "text")), 2048)
    tokenizer.save_pretrained(folder)
    return tokenizer


def baseline(path: Path, tokenizer_json: str, out: Path) -> dict:
    """nanoGPT's prepare.py on one core: the documents encoded in batches, the ids counted,
    then written to a uint16 memmap."""
    from tokenizers import Tokenizer

    from hf_tinytx_training.data.documents import paragraphs

    tokenizer, started, parts = Tokenizer.from_file(tokenizer_json), time.perf_counter(), []
    eos = tokenizer.token_to_id("</s>")
    with open(path, encoding="utf-8") as f:
        batch = []
        for document in paragraphs(iter(lambda: f.read(1 << 22), "")):
            batch.append(document)
            if len(batch) == 1024:
                parts.append(np.array([i for e in tokenizer.encode_batch_fast(batch) for i in (*e.ids, eos)],
                                      dtype=np.uint16))
                batch = []
        if batch:
            parts.append(np.array([i for e in tokenizer.encode_batch_fast(batch) for i in (*e.ids, eos)],
                                  dtype=np.uint16))
    total = sum(len(part) for part in parts)
    memmap = np.memmap(out, dtype=np.uint16, mode="w+", shape=(total,))
    at = 0
    for part in parts:
        memmap[at : at + len(part)] = part
        at += len(part)
    memmap.flush()
    return {"seconds": time.perf_counter() - started, "bytes": os.path.getsize(out), "tokens": total}


def store(path: Path, tokenizer, folder: Path, workers: int) -> dict:
    from hf_tinytx_training.data import token_store
    from hf_tinytx_training.data.documents import file_sources

    started = time.perf_counter()
    shards = token_store.build(
        str(folder), tokenizer, None, file_sources([str(path)], "-", "text", "text"), workers,
        lambda line: None,
    )
    seconds = time.perf_counter() - started
    on_disk = sum(os.path.getsize(shard.path) for per_source in shards for shard in per_source)
    return {"seconds": seconds, "bytes": on_disk, "tokens": sum(s.tokens for per in shards for s in per)}


def cpu_seconds() -> float:
    """CPU time of this process and of its children that have ended (the store's workers, once joined)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tokenizing(path: Path, size: int, work: Path, cores: int, rounds: int = 2) -> dict:
    """Each way timed `rounds` times in turn (the machine's other work then slows each
    alike), the fastest kept; MB per CPU-second is the rate per core, which that other work
    moves much less than the wall clock."""
    previous = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the baseline on one thread, as the store's workers
    tokenizer = train_tokenizer(path, work / "tokenizer")
    ways = {
        "baseline": lambda n: baseline(path, str(work / "tokenizer" / "tokenizer.json"), work / f"b{n}.bin")
    }
    for workers in sorted({1, cores}):
        ways[f"store_{workers}"] = lambda n, w=workers: store(path, tokenizer, work / f"store_{w}_{n}", w)
    rows = {}
    for n in range(rounds):
        for name, way in ways.items():
            before, cpu = load(), cpu_seconds()
            row = {"load": before, **way(n)}
            row["cpu_seconds"] = cpu_seconds() - cpu
            if name not in rows or row["seconds"] < rows[name]["seconds"]:
                rows[name] = row
    if previous is None:
        del os.environ["TOKENIZERS_PARALLELISM"]
    for row in rows.values():
        row.update(
            mb_s=round(size / 1e6 / row["seconds"], 2),
            mb_per_cpu_second=round(size / 1e6 / row["cpu_seconds"], 2),
            bytes_per_text_byte=round(row["bytes"] / size, 3), seconds=round(row["seconds"], 1),
            cpu_seconds=round(row["cpu_seconds"], 1),
        )
    assert rows["baseline"]["tokens"] == rows["store_1"]["tokens"], rows  # the same documents, the same ids
    return rows


class Watch(threading.Thread):
    """Samples a process and its children: the largest one's peak (VmHWM), their RSS summed, and
    when metrics.jsonl first holds step 1."""

    def __init__(self, process: subprocess.Popen, metrics: Path, started: float):
        super().__init__(daemon=True)
        self.process, self.metrics, self.started = process, metrics, started
        self.main_peak = self.tree_peak = 0
        self.first_step = None

    def run(self):
        while self.process.poll() is None:
            pids = [self.process.pid, *descendants(self.process.pid)]
            self.main_peak = max([self.main_peak, *(status(pid, "VmHWM") for pid in pids)])
            self.tree_peak = max(self.tree_peak, sum(status(pid, "VmRSS") for pid in pids))
            if self.first_step is None and self.metrics.exists() and '"step": 1,' in self.metrics.read_text():
                self.first_step = time.perf_counter() - self.started
            time.sleep(0.2)


def status(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        return 0


def descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        try:
            with open(f"/proc/{parent}/task/{parent}/children") as f:
                children = [int(child) for child in f.read().split()]
        except OSError:
            children = []
        found += children
        todo += children
    return found


def pretrain(path: Path, out: Path, store_dir: Path, launcher: list[str], env: dict) -> dict:
    command = [*launcher, PRETRAIN, *MODEL, "--train_file", str(path), "--output_dir", str(out),
               "--token_store", str(store_dir)]
    before, started = load(), time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watch = Watch(process, out / "metrics.jsonl", started)
    watch.start()
    stdout, stderr = process.communicate()
    watch.join()
    if process.returncode != 0:
        raise SystemExit(f"pretrain failed ({process.returncode}):\n{stdout[-2000:]}\n{stderr[-3000:]}")
    parameters = int(re.search(r"TinyTx with ([\d,]+) parameters", stdout).group(1).replace(",", ""))
    return {
        "load": before,
        "seconds_to_step_1": round(watch.first_step or float("nan"), 1),
        "seconds": round(time.perf_counter() - started, 1),
        "largest_peak_rss_mib": round(watch.main_peak / 2**20),
        "all_processes_peak_rss_mib": round(watch.tree_peak / 2**20),
        "parameters": parameters,
        "processes_that_tokenized": len(re.findall(r"^Tokenized \d+ piece", stdout, re.M)),
        "tokenizing_seconds": float(
            next(iter(re.findall(r"^Tokenized \d+ piece\(s\) in ([\d.]+) s", stdout, re.M)), 0)
        ),
    }


def one_size(megabytes: float, two_ranks: bool, work: Path, cores: int, rounds: int) -> dict:
    path = work / f"corpus_{megabytes:g}MB.txt"
    size = write_corpus(path, megabytes)
    row = {"megabytes": megabytes, "bytes": size, "tokenizing": tokenizing(path, size, work, cores, rounds)}
    env = {
        **os.environ, "TOKENIZERS_PARALLELISM": "false", "MPLBACKEND": "Agg",
        "HF_HOME": str(work / "hf_home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
    }
    python = [sys.executable]
    row["cold"] = pretrain(path, work / "cold", work / "cold_store", python, env)
    row["warm"] = pretrain(path, work / "warm", work / "cold_store", python, env)
    if two_ranks:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        row["two_ranks"] = pretrain(path, work / "ranks", work / "ranks_store", torchrun,
                                    {**env, "OMP_NUM_THREADS": "1"})
    return row


def table(rows: list[dict], cores: int, command: str) -> list[str]:
    lines = [
        f"Training on one's own corpus: generated paragraphs, a {rows[0]['cold']['parameters']:,}-parameter "
        f"model, 20 steps, {cores} cores shared with other work (load = 1-minute load average when "
        "measured).",
        "",
        "Tokenizing (the same tokenizer, a BPE of 2,048; the fastest of the rounds, taken in turn):",
        "",
        "| corpus | way | MB/s | MB per CPU-second | bytes on disk per byte of text | load |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        for name, t in row["tokenizing"].items():
            way = (
                "nanoGPT-style, 1 thread"
                if name == "baseline"
                else f"token store, {name.split('_')[1]} worker(s)"
            )
            lines.append(f"| {row['megabytes']:g} MB | {way} | {t['mb_s']} | {t['mb_per_cpu_second']} | "
                         f"{t['bytes_per_text_byte']} | {t['load']} |")
    lines += [
        "",
        "pretrain.py --train_file (seconds from launch; the peak RSS of its largest process, and of all "
        "its processes summed):",
        "",
        "| corpus | run | to step 1 | whole run | peak RSS, largest process | peak RSS, all | processes "
        "that tokenized (seconds) | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for name in ("cold", "warm", "two_ranks"):
            if name in row:
                r = row[name]
                tokenized = f"{r['processes_that_tokenized']}" + (f" ({r['tokenizing_seconds']} s)"
                                                                    if r["processes_that_tokenized"] else "")
                lines.append(
                    f"| {row['megabytes']:g} MB | {name.replace('_', ' ')} | {r['seconds_to_step_1']} s | "
                    f"{r['seconds']} s | {r['largest_peak_rss_mib']:,} MiB | "
                    f"{r['all_processes_peak_rss_mib']:,} MiB | {tokenized} | {r['load']} |"
                )
    return lines + [
        "",
        "cold: nothing tokenized yet (the tokenizer is trained too); warm: a second run with the first "
        "one's --token_store (tokenizer and shards reused); two ranks: the cold run under torchrun "
        "--nproc_per_node 2 (the main process tokenizes, the other waits for it).",
        "",
        f"Command: {command}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[10, 100], help="corpus sizes in MB")
    parser.add_argument("--two_ranks", type=float, default=100,
                        help="run 2 ranks on the largest corpus up to this many MB (0: none)")
    parser.add_argument("--rounds", type=int, default=2, help="times each way of tokenizing is timed")
    parser.add_argument("--output", default=str(RESULTS / "token_store"), help="writes OUTPUT.txt and .json")
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    ranked = max([size for size in args.sizes if size <= args.two_ranks], default=None)
    rows = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory() as work:
            rows.append(one_size(size, size == ranked, Path(work), cores, args.rounds))
    command = "python -m benchmarks.token_store " + " ".join(sys.argv[1:])
    lines = table(rows, cores, command.strip())
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output + ".txt").write_text("\n".join(lines) + "\n")
    Path(args.output + ".json").write_text(json.dumps({"cores": cores, "results": rows}, indent=1) + "\n")
    print("\n".join(lines))
    print(json.dumps({"benchmark": "token_store", "cores": cores, "results": rows}))


if __name__ == "__main__":
    main()
