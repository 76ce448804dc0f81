"""The GPU-only checks that benchmarks/gpu/check.sh runs: flash-attention parity, and generation speed.

    python -m benchmarks.gpu.check parity      # bf16 logits of a flash backend vs sdpa, both against an fp32
                                               # reference
    python -m benchmarks.gpu.check generate    # greedy new tokens/s of the ~124M model, batch 1 and 8,
                                               # dynamic, static and compiled static cache, beside the
                                               # bandwidth floor
    python -m benchmarks.gpu.check syncs       # does a training step or a decoding step wait on the GPU?

Flash backend: transformers' "flash_attention_2" when the flash-attn package imports, else
"kernels-community/ flash-attn" when the kernels package can load it (from its local cache: the GPU machine
may be offline), else PyTorch's own flash kernel under sdpa
(torch.nn.attention.sdpa_kernel(FLASH_ATTENTION)) against sdpa's math kernel.

Parity means: the bf16 flash logits are as close to the fp32 result as bf16 sdpa's are (within 2x,
plus a small absolute slack), and pick fp32's next token about as often (within 2 points) as bf16 sdpa
does. A padded batch (left padding, as in batched generation) is checked too, on the real tokens only.
Each prints a table and a final JSON line; parity exits 1 when it fails. `--device cpu` is a dry run
of the code path (bf16 on CPU), no figures.

Syncs: a training step (forward, backward, clipping, fused AdamW) and a decoding step (one token into a static
cache, as compiled `generate` runs it) of the ~124M model in bf16, each run under
torch.cuda.set_sync_debug_mode("error"), which turns any wait of the host for the GPU (`.item()`, a
data-dependent shape, a blocking copy) into an error naming it. Exits 1 if either step synchronises.
pretrain.py's loop adds one deliberate read per optimizer step on top (the loss and gradient norm together, so
a non-finite step stops before it reaches the weights).
"""

import argparse
import contextlib
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_tinytx import TinyTxConfig, TinyTxForCausalLM


BASE_CONFIG = Path(__file__).resolve().parents[2] / "training" / "configs" / "model-base.json"


def config_from_file(vocab_size: int = 50304, path: Path = BASE_CONFIG) -> TinyTxConfig:
    if path.is_file():
        values = {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}
    else:  # GPT-2 small's shape
        values = dict(hidden_size=768, intermediate_size=2048, num_hidden_layers=12, num_attention_heads=12)
    special = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}
    return TinyTxConfig(**{**values, "vocab_size": vocab_size, **special})


def flash_backend() -> tuple[str, str]:
    """(attn_implementation, description) of the flash attention to test."""
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", "flash-attn package (flash_attention_2)"
    if importlib.util.find_spec("kernels") is not None:
        try:
            from kernels import get_kernel

            get_kernel("kernels-community/flash-attn")  # offline: works only when it is already in the cache
            return "kernels-community/flash-attn", "kernels-community/flash-attn (kernels package)"
        except Exception as error:  # noqa: BLE001  (any failure means: not available here)
            print(
                f"kernels-community/flash-attn not loadable ({type(error).__name__}); using sdpa's flash "
                "kernel"
            )
    return "sdpa-flash", "PyTorch sdpa, flash kernel only (SDPBackend.FLASH_ATTENTION)"


def load(state_dict, config, attn_implementation, dtype, device) -> TinyTxForCausalLM:
    implementation = "sdpa" if attn_implementation in ("sdpa-flash", "sdpa-math") else attn_implementation
    model = TinyTxForCausalLM._from_config(config, attn_implementation=implementation, dtype=dtype)
    model.load_state_dict(state_dict)
    return model.to(device).eval()


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()  # the clock must wait for the kernels, not only for their launch


def device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device.startswith("cuda") else device


def sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if name == "sdpa-flash":
        return sdpa_kernel(SDPBackend.FLASH_ATTENTION)
    if name == "sdpa-math":
        return sdpa_kernel(SDPBackend.MATH)
    return contextlib.nullcontext()


@torch.no_grad()
def logits_of(model, name, input_ids, attention_mask):
    with sdpa_backend(name):
        return model(input_ids=input_ids, attention_mask=attention_mask).logits.float()


def parity(args) -> int:
    flash, description = flash_backend()
    reference = "sdpa-math" if flash == "sdpa-flash" else "sdpa"
    # On CPU (the dry run) a quarter of the width and half the layers: the same code path, in a few seconds.
    small = args.device == "cpu"
    config = TinyTxConfig(
        vocab_size=4096, hidden_size=128 if small else 512, intermediate_size=344 if small else 1376,
        num_hidden_layers=2 if small else 4, num_attention_heads=2 if small else 8,
        max_position_embeddings=2048, bos_token_id=0, eos_token_id=1, pad_token_id=0,
    )
    torch.manual_seed(0)
    state_dict = TinyTxForCausalLM._from_config(config).state_dict()
    fp32 = load(state_dict, config, "sdpa-math", torch.float32, args.device)
    models = {
        name: load(state_dict, config, name, torch.bfloat16, args.device) for name in (reference, flash)
    }

    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(2, config.vocab_size, (4, 512), generator=generator).to(args.device)
    full = torch.ones_like(input_ids)
    padded = full.clone()
    for row, pad in enumerate((0, 17, 100, 300)):  # left padding of different lengths
        padded[row, :pad] = 0
    cases = [("no padding", full), ("left padding", padded)]
    if flash == "sdpa-flash":
        cases = cases[:1]  # sdpa's flash kernel takes no mask: a padded batch would run another kernel
    rows, ok = [], True
    for case, mask in cases:
        keep = mask.bool()  # compare real tokens only: what a padded position outputs is nobody's business
        truth = logits_of(fp32, "sdpa-math", input_ids, mask)[keep]
        bf16 = {name: logits_of(model, name, input_ids, mask)[keep] for name, model in models.items()}
        ref_err = (bf16[reference] - truth).abs().max().item()
        flash_err = (bf16[flash] - truth).abs().max().item()
        between = (bf16[flash] - bf16[reference]).abs().max().item()
        # Random weights give nearly flat logits, so bf16 alone flips a few near-ties:
        # judge flash by sdpa's own rate.
        top1 = {
            name: (logits.argmax(-1) == truth.argmax(-1)).float().mean().item()
            for name, logits in bf16.items()
        }
        passed = flash_err <= 2 * ref_err + 1e-2 and top1[flash] >= top1[reference] - 0.02
        ok &= passed
        rows.append({"case": case, "bf16_sdpa_vs_fp32": ref_err, "bf16_flash_vs_fp32": flash_err,
                     "flash_vs_sdpa": between, "sdpa_top1_vs_fp32": top1[reference],
                     "flash_top1_vs_fp32": top1[flash], "passed": passed})
    print(f"flash backend: {description}; reference: bf16 {reference}; truth: fp32 sdpa (math)")
    print("max |logit difference| and top-1 agreement with fp32, on real tokens")
    print(f"{'case':>12} | {'sdpa-fp32':>9} | {'flash-fp32':>10} | {'flash-sdpa':>10} | {'sdpa top-1':>10} | "
          f"{'flash top-1':>11} | ok")
    for r in rows:
        print(
            f"{r['case']:>12} | {r['bf16_sdpa_vs_fp32']:>9.4f} | {r['bf16_flash_vs_fp32']:>10.4f} | "
            f"{r['flash_vs_sdpa']:>10.4f} | {r['sdpa_top1_vs_fp32']:>10.4f} | "
            f"{r['flash_top1_vs_fp32']:>11.4f} | {r['passed']}"
        )
    print(
        json.dumps(
            {
                "check": "flash_parity", "flash_backend": flash, "reference": reference,
                "device": device_name(args.device), "torch": torch.__version__, "rows": rows, "passed": ok,
            }
        )
    )
    return 0 if ok else 1


# The decoding modes of `generate`: extra keyword arguments. On CUDA, transformers compiles the
# forward of a static cache by itself (mode "reduce-overhead": CUDA graphs); disable_compile keeps
# the same cache eager, to see the gain.
DECODING = {
    "dynamic": {},
    "static, eager": {"cache_implementation": "static", "disable_compile": True},
    "static, compiled": {"cache_implementation": "static"},
}


def generation_model(args) -> TinyTxForCausalLM:
    """A saved folder (--model), else the ~124M shape with random weights: speed
    does not depend on the weights."""
    if args.model:
        model = TinyTxForCausalLM.from_pretrained(
            args.model, attn_implementation="sdpa", dtype=torch.bfloat16
        )
    else:
        torch.manual_seed(0)
        model = TinyTxForCausalLM._from_config(
            config_from_file(), attn_implementation="sdpa", dtype=torch.bfloat16
        )
    return model.to(args.device).eval()


def time_generate(
    model, prompt, new_tokens: int, repeats: int, device: str, **kwargs
) -> tuple[float, torch.Tensor]:
    """Median seconds of greedy decoding (after one warm-up call, which also
    compiles) and the tokens it gave."""
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  attention_mask=torch.ones_like(prompt), pad_token_id=0, **kwargs)
    samples = []
    for i in range(repeats + 1):
        synchronize(device)
        start = time.perf_counter()
        with torch.no_grad():
            tokens = model.generate(prompt, **kwargs)
        synchronize(device)
        if i:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples), tokens


def generate(args) -> int:
    model = generation_model(args)
    parameters = sum(p.numel() for p in model.parameters())
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    bandwidth = args.bandwidth_tb_s * 1e12
    results = []
    for batch_size in args.batch_sizes:
        generator = torch.Generator().manual_seed(1)
        prompt = torch.randint(2, model.config.vocab_size, (batch_size, 32), generator=generator).to(
            args.device
        )
        reference = None
        for mode, kwargs in DECODING.items():
            seconds, tokens = time_generate(
                model, prompt, args.new_tokens, args.repeats, args.device, **kwargs
            )
            reference = tokens if reference is None else reference
            step = seconds / args.new_tokens
            # The floor: each decoding step reads every weight once (the KV cache of
            # 32 + 128 positions is small).
            floor = weight_bytes / bandwidth
            results.append({"batch_size": batch_size, "cache": mode, "tokens_per_s": batch_size / step,
                            "ms_per_token_step": step * 1e3, "share_of_bandwidth_floor": floor / step,
                            "same_tokens_as_dynamic": bool(torch.equal(tokens, reference))})
    source = args.model or "random weights, training/configs/model-base.json"
    print(
        f"TinyTx {parameters / 1e6:.0f}M ({source}), bf16, sdpa, prompt 32, {args.new_tokens} new tokens, "
        f"greedy; bandwidth floor: {weight_bytes / 1e6:.0f} MB of weights per step at {args.bandwidth_tb_s} "
        f"TB/s = {weight_bytes / bandwidth * 1e3:.3f} ms"
    )
    print(f"{'batch':>5} | {'cache':>16} | {'tokens/s':>9} | {'ms/step':>7} | {'of floor':>8} | same tokens")
    for r in results:
        print(
            f"{r['batch_size']:>5} | {r['cache']:>16} | {r['tokens_per_s']:>9.1f} | "
            f"{r['ms_per_token_step']:>7.2f} | {r['share_of_bandwidth_floor']:>8.1%} | "
            f"{r['same_tokens_as_dynamic']}"
        )
    print(
        json.dumps(
            {
                "check": "generate", "model": source, "parameters": parameters, "weight_bytes": weight_bytes,
                "bandwidth_tb_s": args.bandwidth_tb_s, "device": device_name(args.device),
                "torch": torch.__version__, "new_tokens": args.new_tokens, "results": results,
            }
        )
    )
    return 0


def syncs(args) -> int:
    from transformers import StaticCache

    config = config_from_file(args.vocab_size, Path(args.model_config))
    torch.manual_seed(0)
    model = TinyTxForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16).to(
        args.device
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    rows = torch.randint(2, config.vocab_size, (4, args.seq_len), generator=torch.Generator().manual_seed(1))
    ids = rows.to(args.device)

    def train_step():
        model(input_ids=ids, labels=ids).loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    prompt = ids[:1, :32]
    cache = StaticCache(config=config, max_cache_len=64)
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
    token, position = prompt[:, -1:], torch.tensor([32], device=args.device)

    @torch.no_grad()
    def decode_step():
        model(input_ids=token, past_key_values=cache, cache_position=position, position_ids=position[None],
              use_cache=True)

    results = {}
    for name, step in (("training step", train_step), ("decoding step", decode_step)):
        step()  # first calls allocate and set up lazily: not part of a steady step
        synchronize(args.device)
        error = None
        with sync_debug_mode(args.device):
            try:
                step()
            except RuntimeError as caught:
                error = str(caught).strip().splitlines()[0]
        synchronize(args.device)
        results[name] = error
    print(
        f"host-device synchronisations, TinyTx {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M, "
        "bf16, sdpa (torch.cuda.set_sync_debug_mode('error'))"
    )
    for name, error in results.items():
        print(f"{name:>13} | {'none' if error is None else 'SYNCS: ' + error}")
    print(json.dumps({"check": "syncs", "device": device_name(args.device), "torch": torch.__version__,
                      "steps": {name: error or "none" for name, error in results.items()}}))
    return 0 if all(error is None for error in results.values()) else 1


@contextlib.contextmanager
def sync_debug_mode(device: str):
    if not device.startswith("cuda"):
        yield  # a CPU never waits on itself: the dry run only runs the steps
        return
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("check", choices=["parity", "generate", "syncs"])
    parser.add_argument("--batch_sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--model", default=None,
        help="generate: a saved model folder (default: the ~124M shape, random weights)",
    )
    parser.add_argument(
        "--bandwidth_tb_s", type=float, default=4.8,
        help="generate: the memory bandwidth that sets the floor (default: the H200's datasheet 4.8 TB/s)",
    )
    parser.add_argument(
        "--model_config", default=str(BASE_CONFIG), help="syncs: the model's shape (a config file)"
    )
    parser.add_argument(
        "--seq_len", type=int, default=512, help="syncs: the training step's sequence length (>= 32)"
    )
    parser.add_argument("--vocab_size", type=int, default=50304, help="syncs: the model's vocabulary")
    parser.add_argument(
        "--device", default="cuda", help="cpu: a dry run of the code path (bf16 on CPU), no figures"
    )
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu/check.py: no CUDA GPU here (torch.cuda.is_available() is False); nothing to check.")
        return 0
    return {"parity": parity, "generate": generate, "syncs": syncs}[args.check](args)


if __name__ == "__main__":
    sys.exit(main())
