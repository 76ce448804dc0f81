"""The finished, shareable model folder: weights, config, code, tokenizer, model card, loss curve, arguments;
written into a staging folder, then published file by file (an interrupted export is redone by resuming). With
--push_to_hub each checkpoint is also exported for the Hub (`push_checkpoint`).
"""

import os
import shutil
import sys

import torch
from huggingface_hub import ModelCard

from hf_tinytx.folders.safe import STAGING_NAME, publish, regular_files, remove_tree, staging_folder
from hf_tinytx_training.checkpoints import Layout, disk_space_guard
from hf_tinytx_training.errors import RunError
from hf_tinytx_training.pretrain_args import write_args_json
from hf_tinytx_training.publish import cards


def write_model_folder(
    folder, model, state_dict, tokenizer, card: ModelCard, history, training_args, max_shard_size,
    coref_head: dict | None = None,
):
    """Writes every file of the model repository into `folder` (created if needed)."""
    os.makedirs(folder, exist_ok=True)
    # `state_dict`: the full one, gathered from FSDP or ZeRO-3 shards.
    model.save_pretrained(
        folder, state_dict=state_dict, max_shard_size=max_shard_size, safe_serialization=True
    )
    tokenizer.save_pretrained(folder)
    plot_loss_curve(history, os.path.join(folder, "loss_curve.png"))
    if coref_head:
        draw_coref_head(coref_head, os.path.join(folder, COREF_HEAD_PICTURE))
    write_args_json(os.path.join(folder, "training_args.json"), training_args)
    card.save(os.path.join(folder, "README.md"))


def export_final(
    output_dir: str, checkpoints_dir: str, model, state_dict, tokenizer, card, history, training_args,
    coref_head: dict | None = None,
):
    """Writes the model folder's files into `output_dir` (see the module docstring); returns their names."""
    nonfinite = [name for name, tensor in state_dict.items()
                 if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if nonfinite:
        raise RunError(
            f"Not exporting: {len(nonfinite)} weight tensors hold NaN or inf (first: {nonfinite[0]}); the "
            f"checkpoints in {checkpoints_dir} are kept. Lower --learning_rate or set --max_grad_norm, and "
            "train again."
        )
    staged = os.path.join(output_dir, STAGING_NAME)
    with disk_space_guard(staged, Layout(checkpoints_dir)):
        staged = staging_folder(output_dir)
        write_model_folder(
            staged, model, state_dict, tokenizer, card, history, training_args, "2GB", coref_head
        )
        names = regular_files(staged)
        publish(staged, output_dir)
    return names


def plot_loss_curve(history: list[dict], path: str) -> None:
    train = [(row["step"], row["loss"]) for row in history if "loss" in row]
    evals = [(row["step"], row["eval_loss"]) for row in history if "eval_loss" in row]
    # A bare Figure draws to a file without pyplot's backend or global figures; imported only when exporting.
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=100)
    ax = fig.subplots()
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


COREF_HEAD_PICTURE = "coref_head.png"


def draw_coref_head(found: dict, path: str) -> None:
    """The attention map of the head that resolves "it" (training/evaluation.py
    `find_coref_head`) on one sentence."""
    from hf_tinytx.interpret.attention_maps import render_attention_map

    title = f"layer {found['layer']} head {found['head']}: the last row is where the model names the noun"
    render_attention_map(found["weights"], found["tokens"], title).savefig(path)


def push_checkpoint(pusher, model, state_dict, tokenizer, log, checkpoints_dir: str, step: int,
                    training_record: dict) -> None:
    """Queues checkpoint `step` for checkpoints/step_N/ of the Hub repo as a model folder (no optimizer or RNG
    state); the pusher snapshots it before returning, so our copy can go at once."""
    # hidden: never taken for a checkpoint to resume
    folder = os.path.join(checkpoints_dir, f".hub_step_{step}")
    remove_tree(folder)  # left by a run killed while exporting this step
    card = cards.checkpoint_card(pusher.repo_id, step, log.last("loss"))
    try:
        write_model_folder(folder, model, state_dict, tokenizer, card, log.rows, training_record, "2GB")
        pusher.push_async(folder, f"Checkpoint at step {step}", path_in_repo=f"checkpoints/step_{step}")
    except Exception as error:  # e.g. a full disk: the checkpoint itself is saved, so go on training
        print(f"Could not export checkpoint {step} for the Hub ({error}); training goes on.", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
