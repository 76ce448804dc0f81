"""Model FLOP utilisation (MFU) of TinyTx training: useful FLOP/s achieved ÷ FLOP/s
of one large matmul, same process.

Useful FLOPs per trained token (forward + backward, the PaLM / nanoGPT convention):

    6 * N  +  12 * layers * seq_len * attention_width

- 6 * N: every weight that takes part in a matmul does one multiply-add (2 FLOPs) per token forward and two
  backward. N counts the matmul weights: all parameters, less the input embedding when it is not tied to the
  output layer (a lookup is not a matmul; a tied matrix is counted once, as the output layer).
- 12 * layers * seq_len * width: the two seq_len x seq_len products of attention (Q K^T and
  weights x V), 2 * 2 * seq_len * width FLOPs per token forward, times 3 with backward. The
  full square is counted, causal or not.
The AdamW update, norms, activations and the softmax are not counted: they are
overhead, as in published MFU figures.

The roof is measured, not looked up: the median FLOP/s of an n x n @ n x n matmul (fp32 2048 on CPU, bf16 8192
on GPU by default) sampled in turn with the training steps, so both see the same machine state.

    python -m benchmarks.mfu                   # the 10M shape of shapes.SHAPES, fp32 on CPU
    python -m benchmarks.mfu --quick
    python -m benchmarks.mfu --config training/configs/model-base.json --batch_size 8 --seq_len 1024 \\
        --device cuda --dtype bf16             # ~124M on a GPU (what benchmarks/gpu/check.sh runs)

Prints a table, then one JSON line with every figure.
"""

import argparse
import json
from pathlib import Path

from benchmarks.shapes import SHAPES


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shape", default="10M", choices=list(SHAPES))
    parser.add_argument(
        "--config", default=None,
        help="A TinyTxConfig .json (e.g. training/configs/model-base.json); replaces --shape.",
    )
    parser.add_argument("--vocab_size", type=int, default=50304, help="With --config: the vocabulary size.")
    parser.add_argument("--batch_size", type=int, default=None, help="Default: the shape's.")
    parser.add_argument("--seq_len", type=int, default=None, help="Default: the shape's.")
    parser.add_argument("--device", default=None, help="Default: cuda when torch sees a GPU, else cpu.")
    parser.add_argument("--dtype", default=None, choices=["fp32", "bf16"],  # DTYPES' keys
                        help="Default: bf16 on a GPU, fp32 on CPU.")
    parser.add_argument("--attn_implementation", default="sdpa")
    parser.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile the model first (as pretrain.py's --torch_compile does); the warm-up steps "
        "compile it",
    )
    parser.add_argument("--matmul_size", type=int, default=None, help="Default: 8192 on a GPU, 2048 on CPU.")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 samples of each, one warm-up")
    return parser.parse_args(argv)


if __name__ == "__main__":  # --help and a mistyped flag are answered before torch loads (~7 s on a small CPU)
    ARGS = parse_args()

import torch  # noqa: E402

from benchmarks.common import count_parameters, interleaved_medians, make_train_step  # noqa: E402
from benchmarks.report import print_report  # noqa: E402
from hf_tinytx import TinyTxConfig, TinyTxForCausalLM  # noqa: E402
from hf_tinytx_training.model.cpu_training import speed_up_cpu_training  # noqa: E402


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build_model(args) -> TinyTxForCausalLM:
    if args.config:
        values = json.loads(Path(args.config).read_text())
        values = {k: v for k, v in values.items() if not k.startswith("_")}  # "_comment" and the like
        config = TinyTxConfig(
            **{**values, "vocab_size": args.vocab_size, "bos_token_id": 0, "eos_token_id": 1}
        )
    else:
        fields, _, _ = SHAPES[args.shape]
        config = TinyTxConfig(max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, **fields)
    torch.manual_seed(0)
    model = TinyTxForCausalLM._from_config(config, attn_implementation=args.attn_implementation).to(
        args.device
    )
    # As tinytx pretrain trains it on a CPU; a GPU runs the model as it is.
    return speed_up_cpu_training(model) if model.device.type == "cpu" else model


def matmul_parameters(model: TinyTxForCausalLM) -> int:
    """N of the formula: parameters, less an untied input embedding (a lookup, not a matmul)."""
    total = count_parameters(model)
    embedding = model.get_input_embeddings().weight
    tied = embedding is model.get_output_embeddings().weight
    return total if tied else total - embedding.numel()


def flops_per_token(model: TinyTxForCausalLM, seq_len: int) -> tuple[float, float]:
    """(6 N, 12 L T d): the weight and attention parts of the training FLOPs per token."""
    config = model.config
    width = config.num_attention_heads * (config.head_dim or config.hidden_size // config.num_attention_heads)
    return 6 * matmul_parameters(model), 12 * config.num_hidden_layers * seq_len * width


def synchronized(fn, device: str):
    """On a GPU the clock must wait for the kernels, not only for their launch."""
    if device.startswith("cuda"):
        def run():
            fn()
            torch.cuda.synchronize()
        return run
    return fn


def make_matmul(size: int, dtype, device: str):
    generator = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, dtype=dtype, device=device, generator=generator)
    b = torch.randn(size, size, dtype=dtype, device=device, generator=generator)
    out = torch.empty(size, size, dtype=dtype, device=device)

    def matmul():
        torch.matmul(a, b, out=out)

    return matmul


def main(args):
    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    on_gpu = args.device.startswith("cuda")
    dtype = DTYPES[args.dtype or ("bf16" if on_gpu else "fp32")]
    matmul_size = args.matmul_size or (8192 if on_gpu else 2048)
    repeats, warmup = (3, 1) if args.quick else (args.repeats, 2)
    _, shape_batch, shape_seq = SHAPES[args.shape]
    batch_size = args.batch_size or (8 if args.config else shape_batch)
    seq_len = args.seq_len or (1024 if args.config else shape_seq)

    model = build_model(args)
    step_model = torch.compile(model) if args.compile else model
    batch = torch.randint(0, model.config.vocab_size, (batch_size, seq_len), device=args.device,
                          generator=torch.Generator(device=args.device).manual_seed(0))
    runs = {
        "matmul": synchronized(make_matmul(matmul_size, dtype, args.device), args.device),
        "train_step": synchronized(make_train_step(step_model, batch, dtype), args.device),
    }
    seconds = interleaved_medians(runs, repeats=repeats, warmup=warmup)

    weight_flops, attention_flops = flops_per_token(model, seq_len)
    tokens = batch_size * seq_len
    train_flops_per_s = (weight_flops + attention_flops) * tokens / seconds["train_step"]
    matmul_flops_per_s = 2 * matmul_size**3 / seconds["matmul"]
    result = {
        "benchmark": "mfu",
        "model": args.config or args.shape,
        "device": torch.cuda.get_device_name() if on_gpu else "cpu",
        "dtype": str(dtype).removeprefix("torch."),
        "compiled": args.compile,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(model),
        "matmul_parameters": matmul_parameters(model),
        "batch_size": batch_size,
        "seq_len": seq_len,
        "repeats": repeats,
        "ms_per_step": seconds["train_step"] * 1e3,
        "tokens_per_s": tokens / seconds["train_step"],
        "flops_per_token": weight_flops + attention_flops,
        "attention_share_of_flops": attention_flops / (weight_flops + attention_flops),
        "train_tflops_per_s": train_flops_per_s / 1e12,
        "matmul_size": matmul_size,
        "matmul_ms": seconds["matmul"] * 1e3,
        "matmul_tflops_per_s": matmul_flops_per_s / 1e12,
        "mfu": train_flops_per_s / matmul_flops_per_s,
    }
    rows = [
        ("model", f"{result['model']}: {result['parameters']:,} parameters "
                  f"({result['matmul_parameters']:,} in matmuls)"),
        ("device, dtype", f"{result['device']}, {result['dtype']}, {result['threads']} threads"
                          + (", torch.compile" if args.compile else ", eager")),
        ("batch x seq_len", f"{batch_size} x {seq_len}"),
        ("train step (median)", f"{result['ms_per_step']:.1f} ms, {result['tokens_per_s']:,.0f} tokens/s"),
        ("FLOPs per token",
         f"{result['flops_per_token'] / 1e6:.1f} M ({result['attention_share_of_flops']:.1%} attention)"),
        ("achieved", f"{result['train_tflops_per_s'] * 1e3:,.1f} GFLOP/s"),
        (f"matmul {matmul_size}^3 (median)",
         f"{result['matmul_ms']:.1f} ms, {result['matmul_tflops_per_s'] * 1e3:,.1f} GFLOP/s"),
        ("MFU (achieved / matmul)", f"{result['mfu']:.1%}"),
    ]
    print_report(rows, result)


if __name__ == "__main__":
    main(ARGS)
