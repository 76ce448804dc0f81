"""Decoding speed of the same weights where people run them: transformers'
`generate` (TinyTx), llama.cpp, vLLM.

Greedy, a 32-token prompt, 128 new tokens, batch 1 and 8, fp32 unless the row says otherwise. Engines:
- `tinytx`: `model.generate` with its default dynamic cache;
- `tinytx-static`: `cache_implementation="static"`;
- `tinytx-compiled`: static cache and the model's forward compiled by `torch.compile` (inductor's C++
  wrapper), so `generate` decodes with one compiled graph a step (docs/performance.md: `generate`
  compiles by itself only on accelerators);
- `llama.cpp-f32`, `llama.cpp-q8_0`: GGUF files of the same weights (`python -m hf_tinytx.convert
  --to gguf`) decoded by llama.cpp's C API in .venv-llamacpp (benchmarks/llama_cpp_worker.py), B
  sequences in one context, f32 keys/values;
- `vllm`: the TinyTx folder in vLLM's offline engine (its Transformers modeling backend, through the folder's
  remote code), `vllm-llama`: the Llama export (`--to llama`) on vLLM's own Llama; .venv-vllm
  (benchmarks/vllm_worker.py), all prompts handed over at once, 1 GiB of key/value cache.
The llama.cpp and vLLM rows appear when their environments exist (.ci/run builds both).

All engines run in turn each round (llama.cpp in a worker process that times itself); the ratio column is the
median over rounds of tokens/s over llama.cpp-f32's in the same round. The weights are random (speed does not
depend on them); the arg-max tokens of the f32 engines are compared and how many agree is printed. The floor
row is the batch-1 decoding step's matrix-vector products alone: every token streams all the weights once.

    python -m benchmarks.generate                       # 1.1M and 25M, batch 1 and 8
    python -m benchmarks.generate --shapes 1.1M --batch_sizes 1 --repeats 3

Prints a table, then one JSON line with every figure.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = REPO / ".venv-llamacpp" / "bin" / "python"
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
# Llama-compatible shapes (no qk_norm), so llama.cpp runs the very same model. 1.1M is the `tiny` preset that
# training/pretrain.py trains by default; 25M is a larger model still small enough for a CPU.
SHAPES = {
    "1.1M": dict(
        vocab_size=1200, hidden_size=128, intermediate_size=352, num_hidden_layers=4, num_attention_heads=4
    ),
    "25M": dict(
        vocab_size=6144, hidden_size=512, intermediate_size=1376, num_hidden_layers=6, num_attention_heads=8
    ),
}
LLAMA_CPP_ENGINES = {"llama.cpp-f32": "f32", "llama.cpp-q8_0": "q8_0"}  # engine -> GGUF type
# the TinyTx folder (Transformers backend), its Llama export (vLLM's Llama)
VLLM_ENGINES = ("vllm", "vllm-llama")
# The flags' engine names: TRANSFORMERS_ENGINES' first (spelt out here: their
# settings, below, need transformers).
ENGINES = ["tinytx", "tinytx-static", "tinytx-compiled", *LLAMA_CPP_ENGINES, *VLLM_ENGINES]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt_len", type=int, default=32)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="for every engine (default None: torch's own, torch.get_num_threads())")
    parser.add_argument("--engines", nargs="+", default=ENGINES, choices=ENGINES, help="tinytx is always run")
    args = parser.parse_args(argv)
    args.engines = ["tinytx", *(name for name in args.engines if name != "tinytx")]  # the tokens' reference
    return args


if __name__ == "__main__":  # --help and a mistyped flag are answered before torch loads (~7 s on a small CPU)
    ARGS = parse_args()

import torch  # noqa: E402

from benchmarks.common import count_parameters, interleaved_samples, paired_ratio  # noqa: E402
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM  # noqa: E402
from hf_tinytx.convert import convert_folder  # noqa: E402
from hf_tinytx.convert.gguf import write_gguf  # noqa: E402
from hf_tinytx.corpus import default_corpus  # noqa: E402
from hf_tinytx.tokenization import train_bpe_tokenizer  # noqa: E402


REFERENCE = "llama.cpp-f32"


def build_folder(shape: str, folder: Path, tokenizer) -> TinyTxForCausalLM:
    torch.manual_seed(0)
    # No end-of-sequence token: every engine decodes all the new tokens.
    config = TinyTxConfig(max_position_embeddings=1024, bos_token_id=1, eos_token_id=None, **SHAPES[shape])
    model = TinyTxForCausalLM(config).eval()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


# engine -> the `generate` arguments it adds
TRANSFORMERS_ENGINES = {
    "tinytx": {},
    "tinytx-static": {"cache_implementation": "static"},
    "tinytx-compiled": {"cache_implementation": "static"},
}
assert [*TRANSFORMERS_ENGINES] == ENGINES[:len(TRANSFORMERS_ENGINES)], "the --engines names above must match"


def transformers_runs(model, prompt, new_tokens: int, engines: list[str]) -> dict:
    kwargs = dict(
        max_new_tokens=new_tokens, do_sample=False, attention_mask=torch.ones_like(prompt), pad_token_id=0
    )
    # The recipe of docs/performance.md; it is put on the model for its own runs only, so the others stay
    # eager. a fresh graph cache for each shape and batch size: their graphs do not count together
    torch._dynamo.reset()
    compiled_forward = torch.compile(model.forward, fullgraph=True, options={"cpp_wrapper": True})

    def run(name):
        def generate():
            if name == "tinytx-compiled":
                model.forward = compiled_forward
            try:
                with torch.no_grad():
                    return model.generate(prompt, **kwargs, **TRANSFORMERS_ENGINES[name])[:, prompt.shape[1]:]
            finally:
                model.__dict__.pop("forward", None)  # back to the class's eager forward
        return generate

    return {name: run(name) for name in engines if name in TRANSFORMERS_ENGINES}


class Worker:
    """An engine in its own environment (llama_cpp_worker.py, vllm_worker.py): loads models on request, then
    times greedy runs of them and answers with its own seconds and the tokens."""

    def __init__(self, python: Path, script: str, env: dict | None = None):
        self.process = subprocess.Popen(
            [str(python), str(Path(__file__).with_name(script))], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=env,
        )

    def ask(self, request: dict) -> dict:
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(
                f"the {self.process.args[-1]} process stopped (exit code {self.process.wait()})"
            )
        return json.loads(line)

    def runs(self, names: list[str], prompt: torch.Tensor, new_tokens: int) -> dict:
        request = {"prompts": prompt.tolist(), "new_tokens": new_tokens}

        def run(name):
            def decode():
                answer = self.ask({"run": name, **request})
                return answer["seconds"], torch.tensor(answer["tokens"])
            return decode

        return {name: run(name) for name in names}

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def start_workers(threads: int, engines: list[str]) -> dict[str, Worker]:
    """A worker for each engine family asked for whose environment exists; a
    missing one is named on stderr."""
    # Its cache in GiB and its threads: vLLM's CPU defaults (4 GiB, a thread bound
    # to every core) are for servers.
    vllm_env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                "OMP_NUM_THREADS": str(threads), "VLLM_NO_USAGE_STATS": "1"}
    families = {"llama.cpp": (LLAMA_CPP_ENGINES, LLAMA_CPP_PYTHON, "llama_cpp_worker.py", None),
                "vllm": (VLLM_ENGINES, VLLM_PYTHON, "vllm_worker.py", vllm_env)}
    workers = {}
    for family, (names, python, script, env) in families.items():
        if not any(name in engines for name in names):
            continue
        if python.exists():
            workers[family] = Worker(python, script, env)
        else:
            print(f"no {family} rows: {python} is missing (.ci/run builds it)", file=sys.stderr)
    return workers


def agreeing_tokens(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many leading tokens every sequence of `a` shares with `b` (the smallest over the batch)."""
    same = (a == b).int().cumprod(dim=1).sum(dim=1)
    return int(same.min())


def measure(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Seconds of every run, interleaved, and each run's tokens. A run returns its tokens, or (seconds,
    tokens) when it timed itself in another process."""
    tokens = {}

    def call(name, run):
        def sample():
            result = run()
            seconds, tokens[name] = result if isinstance(result, tuple) else (None, result)
            return seconds
        return sample

    samples = interleaved_samples(
        {name: call(name, run) for name, run in runs.items()}, repeats=repeats, warmup=1
    )
    return samples, tokens


def matmul_floor_seconds(model: TinyTxForCausalLM, repeats: int) -> tuple[float, float]:
    """Seconds per token spent in a batch-1 decoding step's matrix-vector products alone, every projection and
    the LM head applied once in forward order, and the megabytes of weights they stream."""
    weights = [module.weight.detach() for module in model.modules() if isinstance(module, torch.nn.Linear)]
    vectors = [torch.randn(1, 1, weight.shape[1]) for weight in weights]

    def tokens():
        with torch.no_grad():
            for _ in range(32):
                for weight, vector in zip(weights, vectors):
                    torch.nn.functional.linear(vector, weight)

    samples = interleaved_samples({"floor": tokens}, repeats=repeats, warmup=1)
    megabytes = sum(weight.numel() * weight.element_size() for weight in weights) / 1e6
    return statistics.median(samples["floor"]) / 32, megabytes


def load_engines(
    shape: str, folder: Path, workers: dict, engines: list[str], work: Path
) -> dict[str, list[str]]:
    """Loads what the chosen engines need once per shape: vLLM's models; llama.cpp's GGUF files (written here,
    loaded per batch size, as its context is sized for the batch). Returns worker -> its engine names."""
    names = {}
    if "llama.cpp" in workers:
        names["llama.cpp"] = [name for name in LLAMA_CPP_ENGINES if name in engines]
        for name in names["llama.cpp"]:
            write_gguf(folder, work / f"{shape}-{name}.gguf", outtype=LLAMA_CPP_ENGINES[name])
    if "vllm" in workers:
        names["vllm"] = [name for name in VLLM_ENGINES if name in engines]
        if "vllm-llama" in names["vllm"]:
            convert_folder(folder, work / f"{shape}-llama", to="llama")
        for name in names["vllm"]:
            model = folder if name == "vllm" else work / f"{shape}-llama"
            workers["vllm"].ask({"load": name, "model": str(model)})
    return names


def bench_shape(shape: str, args, workers: dict, work: Path) -> tuple[list[dict], dict]:
    corpus = default_corpus(num_documents=2000)["train"]
    tokenizer = train_bpe_tokenizer(corpus, vocab_size=SHAPES[shape]["vocab_size"])
    folder = work / shape
    model = build_folder(shape, folder, tokenizer)
    names = load_engines(shape, folder, workers, args.engines, work)
    rows = []
    for batch_size in args.batch_sizes:
        generator = torch.Generator().manual_seed(1)
        prompt = torch.randint(3, len(tokenizer), (batch_size, args.prompt_len), generator=generator)
        runs = transformers_runs(model, prompt, args.new_tokens, args.engines)
        for name in names.get("llama.cpp", []):
            workers["llama.cpp"].ask(
                {
                    "load": name, "gguf": str(work / f"{shape}-{name}.gguf"), "batch": batch_size,
                    "n_ctx": args.prompt_len + args.new_tokens, "threads": args.threads,
                }
            )
        for worker, engine_names in names.items():
            runs |= workers[worker].runs(engine_names, prompt, args.new_tokens)
        samples, tokens = measure(runs, args.repeats)
        for name in runs:
            row = {"shape": shape, "batch_size": batch_size, "engine": name,
                   "tokens_per_s": batch_size * args.new_tokens / statistics.median(samples[name]),
                   "agreeing_tokens_with_tinytx": agreeing_tokens(tokens[name], tokens["tinytx"])}
            if REFERENCE in samples:  # time ratio reference / engine = speed ratio engine / reference
                row[f"speed_over_{REFERENCE}"] = paired_ratio(samples, REFERENCE, name)
            rows.append(row)
    floor, megabytes = matmul_floor_seconds(model, args.repeats)
    return rows, {"shape": shape, "parameters": count_parameters(model), "floor_ms_per_token": floor * 1e3,
                  "weights_mb_per_token": megabytes}


def print_table(rows: list[dict], shapes: list[dict]) -> None:
    header = (
        f"{'shape':>5} | {'batch':>5} | {'engine':<16} | {'tokens/s':>9} | {'x llama.cpp f32':>15} | "
        "same tokens"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        ratio = r.get(f"speed_over_{REFERENCE}")
        print(f"{r['shape']:>5} | {r['batch_size']:>5} | {r['engine']:<16} | {r['tokens_per_s']:>9.1f} | "
              f"{'' if ratio is None else f'{ratio:.2f}':>15} | {r['agreeing_tokens_with_tinytx']}")
    for s in shapes:
        print(
            f"{s['shape']} ({s['parameters']:,} parameters) batch-1 floor: the matrix-vector products alone "
            f"take {s['floor_ms_per_token']:.2f} ms/token ({s['weights_mb_per_token']:.1f} MB streamed per "
            f"token), at most {1e3 / s['floor_ms_per_token']:.0f} tokens/s"
        )


def main(args):
    if args.threads is None:
        args.threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)

    workers = start_workers(args.threads, args.engines)
    rows, shapes = [], []
    with tempfile.TemporaryDirectory() as work:
        try:
            for shape in args.shapes:
                shape_rows, shape_info = bench_shape(shape, args, workers, Path(work))
                rows += shape_rows
                shapes.append(shape_info)
        finally:
            for worker in workers.values():
                worker.close()
    print(
        f"greedy, prompt {args.prompt_len}, {args.new_tokens} new tokens, {args.threads} threads, fp32 "
        "weights"
    )
    print_table(rows, shapes)
    print(
        json.dumps(
            {
                "benchmark": "generate", "torch": torch.__version__, "threads": args.threads,
                "repeats": args.repeats, "new_tokens": args.new_tokens, "results": rows, "shapes": shapes,
            }
        )
    )


if __name__ == "__main__":
    main(ARGS)
