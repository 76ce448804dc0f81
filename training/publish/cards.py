"""Every model card the training scripts write, rendered from model_cards/: the pre-trained model
(`pretrained_card`), a checkpoint pushed to the Hub (`checkpoint_card`), what finetune.py saved
(`finetuned_card`); and training_args.json.
"""

import importlib.resources
import os
import platform

import transformers
from huggingface_hub import EvalResult, ModelCard, ModelCardData

from hf_tinytx_training.data.sources import DEFAULT_CORPUS_DOCUMENTS
from hf_tinytx_training.pretrain_args import args_to_dict


TEMPLATES = importlib.resources.files("hf_tinytx_training.model_cards")


def _card(template: str, card_data: ModelCardData, **context) -> ModelCard:
    text = TEMPLATES.joinpath(template).read_text(encoding="utf-8")
    return ModelCard.from_template(card_data, template_str=text, **context)


def pretrained_card(context: dict) -> ModelCard:
    """The pre-trained model's card; `context` is `card_context`'s."""
    eval_results = [
        EvalResult(
            task_type="text-generation", dataset_type=context["dataset_id"],
            dataset_name=context["dataset_id"], dataset_split="validation", metric_type=metric,
            metric_name=label, metric_value=round(float(context["eval"][metric]), 4),
        )
        for metric, label in (
            ("loss", "Validation loss"), ("perplexity", "Perplexity"), ("bits_per_byte", "Bits per byte"),
        )
    ]
    eval_results += [
        EvalResult(
            task_type="text-generation", dataset_type="hf_tinytx-probes", dataset_name="hf_tinytx probes",
            metric_type="accuracy", metric_name=f"Probe accuracy: {name}",
            metric_value=round(float(value), 4),
        )
        for name, value in context.get("probes", {}).items()
    ]
    card_data = ModelCardData(
        license="apache-2.0", library_name="transformers", pipeline_tag="text-generation",
        tags=["tinytx", "causal-lm", "text-generation", "custom_code", "from-scratch"],
        datasets=[context["dataset_id"]] if context.get("dataset_is_hub") else None,
        model_name=context["model_name"], eval_results=eval_results,
    )
    return _card("tinytx_model_card.md", card_data, **context)


def checkpoint_card(repo_id: str, step: int, training_loss: float | None) -> ModelCard:
    card_data = ModelCardData(
        license="apache-2.0", library_name="transformers", pipeline_tag="text-generation",
        tags=["tinytx", "causal-lm", "text-generation", "custom_code", "checkpoint"],
    )
    return _card(
        "tinytx_checkpoint_card.md", card_data, repo_id=repo_id, step=step, training_loss=training_loss
    )


def finetuned_card(context: dict) -> ModelCard:
    """What training/finetune.py saved: `context["kind"]` is "full" (every weight trained), "adapter" (a LoRA
    adapter) or "merged" (base + adapter folded together); the rest is what tinytx_finetune_card.md uses."""
    adapter = context["kind"] == "adapter"
    tags = ["text-generation", "fine-tuned", "sft"] + (["lora"] if context.get("lora") else [])
    if context["tinytx"] and not adapter:
        tags += ["tinytx", "custom_code"]  # the folder holds the model's code
    # the Hub only accepts repo ids as base_model: a local base is named in the text
    card_data = ModelCardData(
        base_model=context["base_model"] if context["base_is_hub"] else None,
        library_name="peft" if adapter else "transformers", pipeline_tag="text-generation", tags=tags,
        model_name=context["model_name"],
    )
    return _card("tinytx_finetune_card.md", card_data, **context)


def card_context(run, metrics: dict, probe_results) -> dict:
    """What tinytx_model_card.md shows of a pretrain run (pretrain.Run), its final metrics and its probes."""
    model_args, data_args, train_args = run.model_args, run.data_args, run.train_args
    name = os.path.basename(run.output_dir)
    return {
        # absolute
        "model_name": name,
        "repo_id": train_args.hub_model_id or name,
        "local_path": run.output_dir,
        "hub_id": train_args.hub_model_id if train_args.push_to_hub else None,
        "resumable": train_args.hub_strategy in ("checkpoint", "all_checkpoints"),
        "init_from": model_args.init_from,
        "config": run.accelerator.unwrap_model(run.model).config,
        "num_parameters": run.num_parameters,
        "num_parameters_text": human_count(run.num_parameters),
        "tokenizer_description": model_args.tokenizer_name
        or model_args.init_from
        or f"byte-level BPE trained on the training text; {model_args.vocab_size} tokens asked",
        "data_description": describe_data(data_args),
        "dataset_id": data_args.dataset_name
        or ("local-files" if data_args.train_file else "hf_tinytx-default-corpus"),
        "dataset_is_hub": bool(data_args.dataset_name),
        "synthetic_data": not (data_args.dataset_name or data_args.train_file),
        "tokens_seen": run.progress.step * run.tokens_per_step,
        "steps": run.progress.step,
        "planned_steps": run.max_train_steps,
        "stopped_by_clock": run.progress.stopped_by_clock,
        "global_batch_size": run.tokens_per_step // data_args.block_size,
        "block_size": data_args.block_size,
        "hyperparameters": args_to_dict(train_args),
        "plan": run.plan and run.plan.summary(),
        "hardware": hardware_description(
            run.accelerator.num_processes, run.accelerator.device.type, run.threads
        ),
        "train_seconds": run.progress.earlier_seconds + run.progress.train_seconds,
        "launches": run.progress.launches,
        "launch_seconds": run.progress.train_seconds,
        "eval": {
            "loss": metrics["eval_loss"], "perplexity": metrics["perplexity"],
            "bits_per_byte": metrics["bits_per_byte"],
        },
        "eval_tokens": metrics["eval_tokens"],
        "eval_blocks": len(run.eval_dataloader.dataset),
        "validation_blocks": len(run.packed.validation),
        "max_eval_tokens": train_args.max_eval_tokens,
        "probes": probe_results.accuracy,
        "chance": probe_results.chance,
        "samples": probe_results.samples,
        "coref_head": probe_results.coref_head,
        "example_prompt": "The dog didn't cross the street because it was too",
    }


def describe_data(data_args) -> str:
    if data_args.dataset_name:
        config = data_args.dataset_config_name or "default config"
        return f"the Hub dataset `{data_args.dataset_name}` ({config})"
    if data_args.train_file:
        return f"local files `{data_args.train_file}`"
    return ("the embedded synthetic corpus of `hf_tinytx.corpus` (coreference, recall and copy documents), "
            f"{data_args.num_train_documents or DEFAULT_CORPUS_DOCUMENTS:,} documents")


def training_record(run) -> dict:
    """training_args.json: every argument (never the Hub token) and the transformers version."""
    return {
        **args_to_dict(run.model_args, run.data_args, run.train_args),
        "torch_threads": run.threads,  # None on a GPU; on a CPU another count trains other weights
        "plan": run.plan and run.plan.to_dict(),  # what the run chose for its text, budget and machine
        "transformers": transformers.__version__,
    }


def flat_scalars(values: dict) -> dict:
    """Trackers accept numbers, strings and booleans only."""
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str, bool))}


def hardware_description(num_processes: int, device_type: str, threads: int | None = None) -> str:
    cpu = platform.processor() or platform.machine()
    cores = os.cpu_count()
    each = f", {threads} torch thread(s) each" if threads else ""
    return (f"{num_processes} x {device_type} process(es) on {cores} CPU cores ({cpu}, {platform.system()})"
            f"{each}")


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.1f}{unit}"
    return str(n)


def training_facts(args, training_args, trainer, metrics) -> dict:
    """What the model cards report about the run, read before a merge changes the model."""
    model = trainer.model
    logged = [row for row in trainer.state.log_history if "loss" in row]  # every --logging_steps steps
    lora = None
    if args.use_peft:
        config = model.peft_config["default"]
        targets = config.target_modules  # a set of names, or "all-linear"
        tokens = config.trainable_token_indices or []  # --lora_trainable_tokens: ids, or {embedding: ids}
        lora = {"r": config.r, "alpha": config.lora_alpha, "dropout": config.lora_dropout,
                "target_modules": targets if isinstance(targets, str) else ", ".join(sorted(targets)),
                "trainable_tokens": len(set().union(*tokens.values())) if isinstance(tokens, dict)
                else len(tokens)}
    return {
        "base_model": args.model_name_or_path,
        "base_is_hub": not os.path.isdir(args.model_name_or_path),
        "model_type": model.config.model_type,
        "tinytx": model.config.model_type == "tinytx",
        "trust_remote_code": args.trust_remote_code,
        "train_file": args.train_file,
        "validation_file": args.validation_file,
        "packing": args.packing,
        "steps": trainer.state.global_step,
        "epochs": trainer.state.epoch or 0.0,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "gradient_accumulation_steps": training_args.gradient_accumulation_steps,
        "num_devices": training_args.world_size,
        "learning_rate": training_args.learning_rate,
        "lr_scheduler_type": getattr(
            training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type
        ),
        "warmup_steps": training_args.warmup_steps,
        "seed": training_args.seed,
        "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
        "total_parameters": sum(p.numel() for p in model.parameters()),
        "train_loss": metrics["train_loss"],
        "eval_loss": metrics.get("eval_loss"),
        "last_logged_step": logged[-1]["step"] if logged else None,
        "last_logged_loss": logged[-1]["loss"] if logged else None,
        "lora": lora,
    }


def write_card(folder: str, staged, kind: str, facts: dict, where) -> None:
    """README.md of a saved folder, into its staging folder; the pushed one is named by its repo id."""
    pushed = folder == where.pushed_dir
    context = {**facts, "kind": kind, "load_from": where.hub_model_id if pushed else folder,
               "model_name": where.hub_model_id if pushed else os.path.basename(folder)}
    finetuned_card(context).save(os.path.join(staged, "README.md"))
