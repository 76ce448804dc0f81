"""The final, shareable model folder: weights, config, code, tokenizer, model card, loss curve, arguments.

It is assembled in a temporary sibling of the output folder and swapped in only when complete, so an interrupted
export leaves the previous state untouched and never a half folder. Files already in the output folder (checkpoints,
metrics.jsonl, anything of the user's) are moved into the new folder, never deleted.
"""

import json
import math
import os
import platform
import shutil

import matplotlib


matplotlib.use("Agg")  # no display needed
import matplotlib.pyplot as plt
from huggingface_hub import ModelCard


# Names an export writes; an output folder holding some of them already holds an exported model.
MODEL_FILES = ("config.json", "model.safetensors", "model.safetensors.index.json")


def staging_dir(output_dir: str) -> str:
    output_dir = os.path.abspath(output_dir)
    return os.path.join(os.path.dirname(output_dir), f".{os.path.basename(output_dir)}.export-tmp")


def write_model_folder(folder, model, state_dict, tokenizer, card: ModelCard, history, training_args, max_shard_size):
    """Writes every file of the model repository into `folder` (which must not exist yet)."""
    os.makedirs(folder)
    # safetensors only; `state_dict` is the gathered full one (FSDP / ZeRO-3 shard it across processes otherwise).
    model.save_pretrained(folder, state_dict=state_dict, max_shard_size=max_shard_size, safe_serialization=True)
    tokenizer.save_pretrained(folder)
    plot_loss_curve(history, os.path.join(folder, "loss_curve.png"))
    with open(os.path.join(folder, "training_args.json"), "w", encoding="utf-8") as f:
        json.dump(training_args, f, indent=2, sort_keys=True, default=str)
    card.save(os.path.join(folder, "README.md"))


def swap_into_place(staged: str, output_dir: str) -> None:
    """Moves what the output folder already holds into the staged folder (unless the export replaces it), then
    makes the staged folder the output folder."""
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            if not os.path.exists(os.path.join(staged, name)):
                os.replace(os.path.join(output_dir, name), os.path.join(staged, name))
        retired = staged + "-old"
        os.replace(output_dir, retired)  # now holds only the previous export's files, replaced by the new ones
        os.replace(staged, output_dir)
        shutil.rmtree(retired)
    else:
        os.replace(staged, output_dir)


def plot_loss_curve(history: list[dict], path: str) -> None:
    train = [(row["step"], row["loss"]) for row in history if "loss" in row]
    evals = [(row["step"], row["eval_loss"]) for row in history if "eval_loss" in row]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=100)
    if train:
        ax.plot(*zip(*train), label="train loss", linewidth=1)
    if evals:
        ax.plot(*zip(*evals), "o-", label="validation loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats / token)")
    ax.set_title("TinyTx pre-training")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def hardware_description(num_processes: int, device_type: str) -> str:
    cpu = platform.processor() or platform.machine()
    return f"{num_processes} x {device_type} process(es) on {os.cpu_count()} CPU cores ({cpu}, {platform.system()})"


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def perplexity(loss: float) -> float:
    return math.exp(loss) if loss < 50 else float("inf")
