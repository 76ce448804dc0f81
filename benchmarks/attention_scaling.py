"""How the cost of attention grows with the window n: one TinyTx attention layer, eager vs sdpa.

The explainers say: pair every token with every token, so twice the window is about four times the looking
work. This measures it. For each n the layer runs forward on a batch of one sequence; both backends run in the
same process, interleaved, and we report medians, the ratio between backends, and the ratio when n doubles.
Peak memory is the rise of the process's peak resident set during one forward, measured in a fresh subprocess
per (backend, n) so that earlier allocations cannot hide it.

    python -m benchmarks.attention_scaling            # n = 256 ... 8192, writes
                                                      # benchmarks/results/attention_scaling.*
    python -m benchmarks.attention_scaling --quick    # n = 128 ... 1024, a few seconds, into
                                                      # benchmarks/results/quick/

Prints a table, then one JSON line with every figure.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096, 8192])
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--num_heads", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--out_dir",
        help="default benchmarks/results, or with --quick the scratch folder benchmarks/results/quick",
    )
    parser.add_argument("--quick", action="store_true", help="n = 128 ... 1024, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.lengths, args.repeats = [128, 256, 512, 1024], 3
    # A toy run never replaces the committed figures: it writes into a folder git ignores.
    args.out_dir = args.out_dir or str(Path(__file__).parent / "results" / ("quick" if args.quick else ""))
    return args


if __name__ == "__main__":  # --help and a mistyped flag are answered before torch loads (~7 s on a small CPU)
    ARGS = parse_args()

import torch  # noqa: E402
from transformers.masking_utils import create_causal_mask  # noqa: E402

from hf_tinytx import TinyTxConfig  # noqa: E402
from hf_tinytx.modeling_tinytx import TinyTxAttention, TinyTxRotaryEmbedding  # noqa: E402


BACKENDS = ("eager", "sdpa")


def build_layer(backend: str, n: int, hidden_size: int, num_heads: int):
    config = TinyTxConfig(
        hidden_size=hidden_size,
        num_attention_heads=num_heads,
        num_hidden_layers=1,
        intermediate_size=4 * hidden_size,
        vocab_size=256,
        max_position_embeddings=max(n, 2048),
    )
    config._attn_implementation = backend
    torch.manual_seed(0)
    layer = TinyTxAttention(config, layer_idx=0).eval()
    hidden_states = torch.randn(1, n, hidden_size)
    position_ids = torch.arange(n).unsqueeze(0)
    position_embeddings = TinyTxRotaryEmbedding(config)(hidden_states, position_ids)
    # The mask the model would build: a full (n x n) additive mask for eager, None
    # (SDPA's is_causal path) for sdpa.
    mask = create_causal_mask(
        config=config, inputs_embeds=hidden_states, attention_mask=None, cache=None, position_ids=position_ids
    )

    def forward():
        with torch.no_grad():
            return layer(hidden_states, position_embeddings=position_embeddings, attention_mask=mask)[0]

    return forward


def attention_flops(n: int, hidden_size: int) -> float:
    """Multiply-adds of the two n x n products (Q K^T and weights x V), counted as 2 FLOPs each."""
    return 2 * 2 * n * n * hidden_size


def time_interleaved(lengths, hidden_size, num_heads, repeats):
    times = {backend: {} for backend in BACKENDS}
    for n in lengths:
        forwards = {backend: build_layer(backend, n, hidden_size, num_heads) for backend in BACKENDS}
        for forward in forwards.values():
            forward()  # warm-up: first-call allocations and kernel selection
        samples = {backend: [] for backend in BACKENDS}
        for _ in range(repeats):
            for backend, forward in forwards.items():
                start = time.perf_counter()
                forward()
                samples[backend].append(time.perf_counter() - start)
        for backend in BACKENDS:
            times[backend][n] = statistics.median(samples[backend])
        del forwards
    return times


def peak_memory_mib(backend: str, n: int, hidden_size: int, num_heads: int) -> float:
    """Runs one forward in a fresh interpreter; returns how far the resident set peaked above its start (MiB).

    Linux lets a process reset its own peak-RSS mark (`echo 5 > /proc/self/clear_refs`), so the peak of the
    forward is not hidden by the larger peak of importing torch."""
    code = (
        "from benchmarks.attention_scaling import build_layer, read_rss_kib\n"
        "forward = build_layer(%r, %d, %d, %d)\n"
        "open('/proc/self/clear_refs', 'w').write('5')\n"
        "before = read_rss_kib('VmRSS')\n"
        "forward()\n"
        "print((read_rss_kib('VmHWM') - before) / 1024)\n"
    ) % (backend, n, hidden_size, num_heads)
    # From the checkout's root, where `python -c` finds the benchmarks package.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=Path(__file__).parents[1], capture_output=True, text=True,
        check=True,
    )
    return float(result.stdout.strip().splitlines()[-1])


def peak_memories(lengths: list[int], hidden_size: int, num_heads: int) -> dict[str, dict[int, float]]:
    """{backend: {n: peak MiB}}, two fresh interpreters at a time: each spends seconds importing on one core,
    and a process's own peak does not depend on its neighbour (the timings are done by then)."""
    cases = [(backend, n) for backend in BACKENDS for n in lengths]
    with ThreadPoolExecutor(max_workers=2) as pool:
        peaks = pool.map(lambda case: peak_memory_mib(*case, hidden_size, num_heads), cases)
        found = dict(zip(cases, peaks))
    return {backend: {n: found[backend, n] for n in lengths} for backend in BACKENDS}


def read_rss_kib(field: str) -> int:
    """VmRSS (now) or VmHWM (peak since the last reset) of this process, in KiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status (this benchmark's memory figure needs Linux)")


def plot(lengths, times, memory, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_time, ax_mem) = plt.subplots(1, 2, figsize=(11, 4.2))
    for backend in BACKENDS:
        ax_time.plot(lengths, [times[backend][n] * 1e3 for n in lengths], "o-", label=backend)
        ax_mem.plot(lengths, [memory[backend][n] for n in lengths], "o-", label=backend)
    reference = [times["sdpa"][lengths[0]] * 1e3 * (n / lengths[0]) ** 2 for n in lengths]
    ax_time.plot(lengths, reference, "k:", label="∝ n² (from sdpa's first point)")
    for ax, label in ((ax_time, "forward time (ms, median)"), (ax_mem, "peak memory rise (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length n")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle("One TinyTx attention layer on CPU: twice the window, about four times the work")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(args):
    lengths = sorted(args.lengths)
    times = time_interleaved(lengths, args.hidden_size, args.num_heads, args.repeats)
    memory = peak_memories(lengths, args.hidden_size, args.num_heads)

    header = (f"{'n':>6} | {'eager ms':>9} | {'sdpa ms':>8} | {'eager/sdpa':>10} | {'eager x2n':>9} | "
              f"{'sdpa x2n':>8} | {'eager MiB':>9} | {'sdpa MiB':>8} | {'GFLOP':>6}")
    print(header)
    print("-" * len(header))
    rows = []
    for i, n in enumerate(lengths):
        growth = {}
        for backend in BACKENDS:
            previous = lengths[i - 1] if i else None
            growth[backend] = (
                times[backend][n] / times[backend][previous] if previous and n == 2 * previous else None
            )
        row = {
            "n": n,
            "eager_ms": times["eager"][n] * 1e3,
            "sdpa_ms": times["sdpa"][n] * 1e3,
            "eager_over_sdpa": times["eager"][n] / times["sdpa"][n],
            "eager_growth_when_n_doubles": growth["eager"],
            "sdpa_growth_when_n_doubles": growth["sdpa"],
            "eager_peak_mib": memory["eager"][n],
            "sdpa_peak_mib": memory["sdpa"][n],
            "attention_gflop": attention_flops(n, args.hidden_size) / 1e9,
        }
        rows.append(row)
        fmt = lambda x: f"{x:.2f}" if x is not None else "-"  # noqa: E731
        print(
            f"{n:>6} | {row['eager_ms']:>9.2f} | {row['sdpa_ms']:>8.2f} | {row['eager_over_sdpa']:>10.2f} | "
            f"{fmt(growth['eager']):>9} | {fmt(growth['sdpa']):>8} | {row['eager_peak_mib']:>9.1f} | "
            f"{row['sdpa_peak_mib']:>8.1f} | {row['attention_gflop']:>6.2f}"
        )

    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / "attention_scaling.png"
    plot(lengths, times, memory, png)
    doubling = [
        r[f"{b}_growth_when_n_doubles"] for r in rows for b in BACKENDS if r[f"{b}_growth_when_n_doubles"]
    ]
    summary = {
        "benchmark": "attention_scaling",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "hidden_size": args.hidden_size,
        "num_heads": args.num_heads,
        "repeats": args.repeats,
        "rows": rows,
        "median_growth_when_n_doubles": (
            {
                b: statistics.median(
                    [r[f"{b}_growth_when_n_doubles"] for r in rows if r[f"{b}_growth_when_n_doubles"]]
                )
                for b in BACKENDS
            }
            if doubling
            else None
        ),
        "plot": str(png),
    }
    (out_dir / "attention_scaling.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary))


if __name__ == "__main__":
    main(ARGS)
