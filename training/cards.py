"""Every model card the training scripts write, rendered in one place from the templates in model_cards/.

- `pretrained_card`: the finished pre-trained model (metadata, `model-index` with evaluation results, architecture,
  data, hyperparameters, hardware, how to use).
- `checkpoint_card`: an intermediate checkpoint pushed to the Hub under checkpoints/step_N/.
"""

import importlib.resources

from huggingface_hub import EvalResult, ModelCard, ModelCardData


# model_cards/ of the source tree, installed as this package's `model_cards` (pyproject.toml maps it)
TEMPLATES = importlib.resources.files(f"{__package__}.model_cards")


def _template(name: str) -> str:
    return TEMPLATES.joinpath(name).read_text(encoding="utf-8")


def pretrained_card(context: dict) -> ModelCard:
    """`context` holds what the template uses: local_path (absolute) and hub_id (None unless the run pushed), config,
    eval metrics, probe accuracies, hyperparameters."""
    eval_results = [
        EvalResult(
            task_type="text-generation",
            dataset_type=context["dataset_id"],
            dataset_name=context["dataset_id"],
            dataset_split="validation",
            metric_type=metric,
            metric_name=label,
            metric_value=round(float(context["eval"][metric]), 4),
        )
        for metric, label in (
            ("loss", "Validation loss"),
            ("perplexity", "Perplexity"),
            ("bits_per_byte", "Bits per byte"),
        )
    ]
    eval_results += [
        EvalResult(
            task_type="text-generation",
            dataset_type="hf_tinytx-probes",
            dataset_name="hf_tinytx probes",
            metric_type="accuracy",
            metric_name=f"Probe accuracy: {name}",
            metric_value=round(float(value), 4),
        )
        for name, value in context.get("probes", {}).items()
    ]
    card_data = ModelCardData(
        license="apache-2.0",
        library_name="transformers",
        pipeline_tag="text-generation",
        tags=["tinytx", "causal-lm", "text-generation", "custom_code", "from-scratch"],
        datasets=[context["dataset_id"]] if context.get("dataset_is_hub") else None,
        model_name=context["model_name"],
        eval_results=eval_results,
    )
    return ModelCard.from_template(card_data, template_str=_template("tinytx_model_card.md"), **context)


def checkpoint_card(repo_id: str, step: int, training_loss: float | None) -> ModelCard:
    card_data = ModelCardData(
        license="apache-2.0", library_name="transformers", pipeline_tag="text-generation",
        tags=["tinytx", "causal-lm", "text-generation", "custom_code", "checkpoint"],
    )
    return ModelCard.from_template(
        card_data, template_str=_template("tinytx_checkpoint_card.md"), repo_id=repo_id, step=step,
        training_loss=training_loss,
    )


def finetuned_card(context: dict) -> ModelCard:
    """What training/finetune.py saved: `context["kind"]` is "full" (every weight trained), "adapter" (a LoRA
    adapter) or "merged" (base + adapter folded together); the rest is what tinytx_finetune_card.md uses."""
    adapter = context["kind"] == "adapter"
    tags = ["text-generation", "fine-tuned", "sft"] + (["lora"] if context.get("lora") else [])
    if context["tinytx"] and not adapter:
        tags += ["tinytx", "custom_code"]  # the folder holds the model's code
    card_data = ModelCardData(
        # The Hub only accepts repo ids as base_model; a local base is named in the text instead. The data are
        # always local files (no `datasets` entry).
        base_model=context["base_model"] if context["base_is_hub"] else None,
        library_name="peft" if adapter else "transformers",
        pipeline_tag="text-generation",
        tags=tags,
        model_name=context["model_name"],
    )
    return ModelCard.from_template(card_data, template_str=_template("tinytx_finetune_card.md"), **context)
