"""Pre-train a TinyTx model from scratch, then export a complete, shareable Hugging Face model folder.

    python training/pretrain.py                                   # ~1M params on the embedded corpus, CPU, minutes
    python training/pretrain.py training/configs/tiny.yaml        # the same arguments, from a file
    accelerate launch --config_file training/configs/accelerate-ddp.yaml training/pretrain.py --model_preset small
    torchrun --nproc_per_node 2 training/pretrain.py              # CPU data parallelism

Reads top to bottom: arguments -> data and tokenizer -> model -> optimizer -> training loop -> evaluation, probes
and samples -> export (-> Hub).

With --push_to_hub every checkpoint is also exported as a complete model folder and uploaded in the background to
checkpoints/step_N/ of the Hub repo (training goes on meanwhile); the final model goes to the repo root at the end.
A failed upload is retried, then reported: it never stops training or touches the local folder.
"""

import json
import math
import os
import re
import shutil
import sys
import time


if __package__ in (None, ""):  # run as `python training/pretrain.py`: import `training` from the checkout
    sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import torch
import transformers
from accelerate import Accelerator
from accelerate.utils import ProjectConfiguration, set_seed
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, get_scheduler

import hf_tinytx  # noqa: F401  (registers the "tinytx" model type)
from hf_tinytx.tokenization import train_bpe_tokenizer
from training import cards, export
from training.args import UserInputError, args_to_dict, parse_args
from training.data import DEFAULT_CORPUS_DOCUMENTS, EpochShuffleSampler, load_text_datasets, tokenize_and_pack, training_texts
from training.hub import HubPusher
from training.tokenizer import load_tokenizer


CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
CHECKPOINT_NAME = re.compile(r"^step_(\d+)$")
HUB_WAIT_SECONDS = 300  # at the end, how long to wait for checkpoint uploads before saying they are slow


def main(argv=None):
    # ---------------------------------------------------------------- arguments
    model_args, data_args, train_args = parse_args(argv)
    output_dir = os.path.abspath(train_args.output_dir)
    checkpoints_dir = os.path.join(output_dir, "checkpoints")
    check_output_dir(output_dir, train_args)
    model_config = load_model_config(model_args)  # before the data: a bad size should not wait for tokenization
    if data_args.block_size > model_config.max_position_embeddings:
        raise UserInputError(
            f"--block_size {data_args.block_size} is longer than the model's max_position_embeddings "
            f"({model_config.max_position_embeddings}); lower --block_size or raise --max_position_embeddings."
        )

    # Without a GPU, say so explicitly: under torchrun Accelerate would otherwise not set up CPU data parallelism.
    has_gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    accelerator = Accelerator(
        cpu=not has_gpu,
        mixed_precision=train_args.mixed_precision,
        gradient_accumulation_steps=train_args.gradient_accumulation_steps,
        log_with=None if train_args.report_to == "none" else train_args.report_to.split(","),
        project_config=ProjectConfiguration(project_dir=output_dir, logging_dir=os.path.join(output_dir, "runs")),
    )
    accelerator.print(f"{accelerator.num_processes} process(es) on {accelerator.device} ({accelerator.distributed_type})")
    set_seed(train_args.seed)

    resume_dir = find_checkpoint(train_args.resume_from_checkpoint, checkpoints_dir)
    if train_args.resume_from_checkpoint and resume_dir is None:
        accelerator.print(f"No checkpoint in {checkpoints_dir} yet: starting from scratch.")

    # ---------------------------------------------------------------- data and tokenizer
    saved_tokenizer_dir = os.path.join(checkpoints_dir, "tokenizer")  # a resumed run must reuse the same tokenizer
    with accelerator.main_process_first():  # the main process fills the datasets cache and saves the tokenizer
        raw = load_text_datasets(data_args, seed=train_args.seed)
        replacing = train_args.overwrite_output_dir and not resume_dir and accelerator.is_main_process
        if os.path.isdir(saved_tokenizer_dir) and not replacing:  # resuming, or after the main process saved it
            tokenizer = load_tokenizer(saved_tokenizer_dir)
        elif model_args.tokenizer_name or model_args.init_from:
            tokenizer = load_tokenizer(model_args.tokenizer_name or model_args.init_from)
        else:
            accelerator.print(f"Training a byte-level BPE tokenizer ({model_args.vocab_size} tokens) on the data...")
            texts = training_texts(raw["train"], data_args.text_column)
            tokenizer = train_bpe_tokenizer(texts, model_args.vocab_size, model_config.max_position_embeddings)
        packed = tokenize_and_pack(
            raw, tokenizer, data_args.block_size, data_args.text_column, data_args.preprocessing_num_workers
        )
        if replacing:  # every input check has passed: only now may the earlier run's training files go
            shutil.rmtree(checkpoints_dir, ignore_errors=True)
        if accelerator.is_main_process and not os.path.isdir(saved_tokenizer_dir):
            tokenizer.save_pretrained(saved_tokenizer_dir)
    streaming = not hasattr(packed.train, "__len__")
    packed.validation.set_format("torch")
    if not streaming:
        packed.train.set_format("torch")
        accelerator.print(f"{len(packed.train):,} training and {len(packed.validation):,} validation blocks "
                          f"of {data_args.block_size} tokens; {packed.bytes_per_token:.2f} bytes/token")

    sampler = None if streaming else EpochShuffleSampler(len(packed.train), seed=train_args.seed)
    train_dataloader = torch.utils.data.DataLoader(
        packed.train.with_format("torch") if streaming else packed.train,
        sampler=sampler,
        batch_size=train_args.per_device_train_batch_size,
        drop_last=True,  # full batches only: every micro-batch weighs the same in the averaged loss
    )
    eval_dataloader = torch.utils.data.DataLoader(packed.validation, batch_size=train_args.per_device_eval_batch_size)

    # ---------------------------------------------------------------- model
    if not model_args.init_from:
        model_config.vocab_size = len(tokenizer)
    elif len(tokenizer) > model_config.vocab_size:
        raise UserInputError(
            f"The tokenizer has {len(tokenizer)} tokens but the --init_from model only {model_config.vocab_size}; "
            f"use the tokenizer saved with that model (leave --tokenizer_name out)."
        )
    model_config.bos_token_id = tokenizer.bos_token_id
    model_config.eos_token_id = tokenizer.eos_token_id
    model_config.pad_token_id = tokenizer.pad_token_id
    if model_args.init_from:
        model = AutoModelForCausalLM.from_pretrained(
            model_args.init_from, config=model_config, attn_implementation=model_args.attn_implementation
        )
    else:
        model = AutoModelForCausalLM.from_config(model_config, attn_implementation=model_args.attn_implementation)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    num_parameters = sum(p.numel() for p in model.parameters())
    accelerator.print(f"TinyTx with {num_parameters:,} parameters ({export.human_count(num_parameters)})")
    if model_args.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if model_args.torch_compile:
        model = torch.compile(model)

    # ---------------------------------------------------------------- optimizer and schedule
    # Weight decay pulls matrices towards zero; norms' gains and biases (1-D) are left alone.
    parameters = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in parameters if p.dim() >= 2], "weight_decay": train_args.weight_decay},
        {"params": [p for p in parameters if p.dim() < 2], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(
        groups, lr=train_args.learning_rate, betas=(0.9, train_args.adam_beta2), fused=True
    )
    tokens_per_step = (
        train_args.per_device_train_batch_size
        * train_args.gradient_accumulation_steps
        * accelerator.num_processes
        * data_args.block_size
    )
    max_train_steps = train_args.max_train_steps
    if max_train_steps is None:
        max_train_steps = math.ceil(train_args.max_train_tokens / tokens_per_step) if train_args.max_train_tokens else 600
    # A prepared scheduler advances once per process per step (Accelerate's convention), hence the factor.
    lr_scheduler = get_scheduler(
        train_args.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=min(train_args.num_warmup_steps, max_train_steps) * accelerator.num_processes,
        num_training_steps=max_train_steps * accelerator.num_processes,
    )
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = accelerator.prepare(
        model, optimizer, train_dataloader, eval_dataloader, lr_scheduler
    )
    if not streaming and len(train_dataloader) == 0:
        raise UserInputError(
            f"Fewer training blocks ({len(packed.train)}) than one batch per process "
            f"({train_args.per_device_train_batch_size} x {accelerator.num_processes}); lower the batch size or add data."
        )

    # ---------------------------------------------------------------- resume
    run_signature = {  # what fixes the data order: resuming with other values could not continue exactly
        "seed": train_args.seed,
        "block_size": data_args.block_size,
        "global_batch": tokens_per_step // data_args.block_size,
        "gradient_accumulation_steps": train_args.gradient_accumulation_steps,
        "num_processes": accelerator.num_processes,
    }
    completed_steps = 0
    if resume_dir:
        state = read_json(os.path.join(resume_dir, "trainer_state.json"))
        if state["run_signature"] != run_signature:
            raise UserInputError(
                f"{resume_dir} was written with {state['run_signature']}, but this run has {run_signature}; resume "
                f"with the same arguments (and process count), or start a new run with --init_from."
            )
        accelerator.load_state(resume_dir)
        completed_steps = state["step"]
        accelerator.print(f"Resumed from {resume_dir} at step {completed_steps}")
    history = start_metrics_log(output_dir, completed_steps, accelerator)

    accelerator.init_trackers("tinytx-pretrain", config=flat_scalars(args_to_dict(model_args, data_args, train_args)))
    # One pusher, on the main process only: its thread uploads checkpoints while training goes on. A token of None
    # lets huggingface_hub find HF_TOKEN or the login cache; the pusher keeps it in memory and out of every message.
    pusher = None
    if train_args.push_to_hub and accelerator.is_main_process:
        pusher = HubPusher(train_args.hub_model_id, token=train_args.hub_token, private=train_args.hub_private_repo)

    # ---------------------------------------------------------------- training loop
    micro_batches_done = completed_steps * train_args.gradient_accumulation_steps
    batches_per_epoch = None if streaming else len(train_dataloader)
    epoch, skip = (0, micro_batches_done) if streaming else divmod(micro_batches_done, batches_per_epoch)
    accelerator.print(
        f"Training for {max_train_steps} steps of {tokens_per_step:,} tokens "
        f"({max_train_steps * tokens_per_step:,} tokens)"
        + (f", at most {train_args.max_train_seconds:.0f} s" if train_args.max_train_seconds else "")
    )
    progress = tqdm(
        total=max_train_steps, initial=completed_steps, disable=not accelerator.is_local_main_process, desc="train"
    )
    model.train()
    start_time = time.perf_counter()
    start_step = completed_steps
    step_loss = 0.0
    stop = completed_steps >= max_train_steps
    while not stop:
        if sampler is not None:
            sampler.set_epoch(epoch)
        elif hasattr(packed.train, "set_epoch"):
            packed.train.set_epoch(epoch)
        epoch_batches = accelerator.skip_first_batches(train_dataloader, skip) if skip else train_dataloader
        for batch in epoch_batches:
            with accelerator.accumulate(model):
                # Labels are the inputs: the model shifts them by one position to score each next token.
                loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients and train_args.max_grad_norm > 0:
                    accelerator.clip_grad_norm_(model.parameters(), train_args.max_grad_norm)
                optimizer.step()
                lr_scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            step_loss += loss.item() / train_args.gradient_accumulation_steps
            if not accelerator.sync_gradients:
                continue

            completed_steps += 1
            elapsed = time.perf_counter() - start_time
            tokens_per_second = (completed_steps - start_step) * tokens_per_step / elapsed
            row = {
                "step": completed_steps,
                "loss": round(step_loss, 5),
                "lr": lr_scheduler.get_last_lr()[0],
                "tokens": completed_steps * tokens_per_step,
                "tokens_per_second": round(tokens_per_second),
                "elapsed_seconds": round(elapsed, 2),
            }
            log_metrics(row, history, output_dir, accelerator)
            progress.update(1)
            progress.set_postfix(loss=f"{step_loss:.3f}", tok_s=f"{tokens_per_second:,.0f}")
            step_loss = 0.0

            if completed_steps % train_args.eval_steps == 0 and completed_steps < max_train_steps:
                metrics = evaluate(model, eval_dataloader, accelerator, packed.bytes_per_token, train_args)
                log_metrics({"step": completed_steps, **metrics}, history, output_dir, accelerator)
                progress.write(f"step {completed_steps}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
            if train_args.checkpointing_steps and completed_steps % train_args.checkpointing_steps == 0:
                save_checkpoint(accelerator, checkpoints_dir, completed_steps, run_signature, train_args)
                if train_args.push_to_hub:
                    state_dict = accelerator.get_state_dict(model)  # every process: FSDP / ZeRO-3 gather shards
                    if pusher is not None:
                        push_checkpoint(pusher, accelerator.unwrap_model(model), state_dict, tokenizer, history,
                                        checkpoints_dir, completed_steps,
                                        {**args_to_dict(model_args, data_args, train_args),
                                         "transformers": transformers.__version__})
            if train_args.max_train_seconds and elapsed > train_args.max_train_seconds:
                accelerator.set_trigger()  # every process stops at the same step
            if completed_steps >= max_train_steps or accelerator.check_trigger():
                stop = True
                break
        epoch, skip = epoch + 1, 0
    progress.close()
    train_seconds = time.perf_counter() - start_time
    if completed_steps < max_train_steps:
        accelerator.print(f"Stopped at step {completed_steps} after {train_seconds:.0f} s (--max_train_seconds).")
    debug_write_parameter_checksum(accelerator, model, completed_steps)

    # ---------------------------------------------------------------- evaluation, probes, samples
    final_metrics = evaluate(model, eval_dataloader, accelerator, packed.bytes_per_token, train_args)
    log_metrics({"step": completed_steps, **final_metrics}, history, output_dir, accelerator)
    accelerator.print(
        f"validation: loss {final_metrics['eval_loss']:.4f}, perplexity {final_metrics['perplexity']:.2f}, "
        f"{final_metrics['bits_per_byte']:.4f} bits/byte ({train_seconds:.1f} s of training)"
    )
    unwrapped = accelerator.unwrap_model(model)
    probe_results = {}
    if accelerator.is_main_process:
        probe_results = run_probes_and_samples(unwrapped, tokenizer, train_args, accelerator)
        if probe_results:
            log_metrics({"step": completed_steps, **{f"probe_{k}": v for k, v in probe_results.items()}},
                        history, output_dir, accelerator)

    # ---------------------------------------------------------------- export
    accelerator.wait_for_everyone()
    state_dict = accelerator.get_state_dict(model)  # every process takes part: FSDP / ZeRO-3 gather the shards
    if accelerator.is_main_process:
        card_context = {
            "model_name": os.path.basename(output_dir),
            "repo_id": train_args.hub_model_id or os.path.basename(output_dir),
            "init_from": model_args.init_from,
            "config": unwrapped.config,
            "num_parameters": num_parameters,
            "num_parameters_text": export.human_count(num_parameters),
            "tokenizer_description": model_args.tokenizer_name or model_args.init_from or "byte-level BPE trained on the training text",
            "data_description": describe_data(data_args),
            "dataset_id": data_args.dataset_name or ("local-files" if data_args.train_file else "hf_tinytx-default-corpus"),
            "dataset_is_hub": bool(data_args.dataset_name),
            "synthetic_data": not (data_args.dataset_name or data_args.train_file),
            "tokens_seen": completed_steps * tokens_per_step,
            "steps": completed_steps,
            "global_batch_size": tokens_per_step // data_args.block_size,
            "block_size": data_args.block_size,
            "hyperparameters": args_to_dict(train_args),
            "hardware": export.hardware_description(accelerator.num_processes, accelerator.device.type),
            "train_seconds": train_seconds,
            "eval": {"loss": final_metrics["eval_loss"], "perplexity": final_metrics["perplexity"],
                     "bits_per_byte": final_metrics["bits_per_byte"]},
            "eval_tokens": final_metrics["eval_tokens"],
            "probes": probe_results,
            "example_prompt": "The dog didn't cross the street because it was too",
        }
        card = cards.pretrained_card(card_context)
        staged = export.staging_dir(output_dir)
        if os.path.exists(staged):
            shutil.rmtree(staged)  # left by an interrupted export; only ever written by this script
        export.write_model_folder(
            staged, unwrapped, state_dict, tokenizer, card, history,
            training_args={**args_to_dict(model_args, data_args, train_args), "transformers": transformers.__version__},
            max_shard_size="2GB",
        )
        shutil.copy2(os.path.join(output_dir, "metrics.jsonl"), os.path.join(staged, "metrics.jsonl"))
        pushed = False
        if pusher is not None:
            # The final upload queues behind the checkpoints' anyway; waiting first only lets us say why it is slow.
            if not pusher.wait(timeout=HUB_WAIT_SECONDS):
                accelerator.print("Checkpoint uploads are still running; the final model's upload follows them...")
            # `staged` holds the model files only (checkpoints join it below): optimizer and RNG state stay local.
            pushed = pusher.push(staged, f"TinyTx pre-trained for {completed_steps} steps")
        export.swap_into_place(staged, output_dir)
        accelerator.print(f"Model folder: {output_dir}")
        if pusher is not None:
            report_hub_pushes(pusher, pushed, train_args.hub_model_id, output_dir, accelerator)
    accelerator.wait_for_everyone()
    accelerator.end_training()


def check_output_dir(output_dir: str, train_args) -> None:
    """Fails early (nothing written yet) when the output folder cannot be written or would lose a saved model."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UserInputError(f"--output_dir {output_dir} is a file; choose a folder path.")
    ancestor = output_dir
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor) or not os.access(ancestor, os.W_OK):
        raise UserInputError(
            f"--output_dir {output_dir} cannot be created: {ancestor} is "
            f"{'not a folder' if not os.path.isdir(ancestor) else 'not writable'}. Choose another --output_dir."
        )
    if not os.path.isdir(output_dir) or train_args.resume_from_checkpoint:
        return
    existing = set(os.listdir(output_dir))
    earlier_run = sorted(existing & {*export.MODEL_FILES, "checkpoints", "metrics.jsonl"})
    if earlier_run and not train_args.overwrite_output_dir:
        raise UserInputError(
            f"--output_dir {output_dir} already holds an earlier run ({', '.join(earlier_run)}). Pass "
            f"--resume_from_checkpoint latest to continue it, --overwrite_output_dir to replace it, or pick a new folder."
        )
    # With --overwrite_output_dir the old checkpoints go once the data has passed its checks, metrics.jsonl starts
    # afresh with training, and the export replaces the old model files; anything else in the folder is kept.


def load_model_config(model_args):
    """The preset (or --model_config file, or --init_from model), with command-line overrides applied."""
    if model_args.init_from:
        try:
            config = AutoConfig.from_pretrained(model_args.init_from)
        except (OSError, ValueError) as error:
            raise UserInputError(f"--init_from {model_args.init_from!r} is not a model folder: {error}") from error
    else:
        path = model_args.model_config or os.path.join(CONFIGS_DIR, f"model-{model_args.model_preset}.json")
        if not os.path.isfile(path):
            presets = sorted(name[6:-5] for name in os.listdir(CONFIGS_DIR) if re.match(r"model-.*\.json$", name))
            raise UserInputError(
                f"No model config at {path}; use --model_preset with one of {presets} or --model_config FILE."
            )
        with open(path, encoding="utf-8") as f:
            if path.endswith((".yaml", ".yml")):
                import yaml

                values = yaml.safe_load(f)
            else:
                values = json.load(f)
        values = {key: value for key, value in values.items() if not key.startswith("_")}
        config = AutoConfig.for_model("tinytx", **values)
    overrides = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "max_position_embeddings")
    changes = {name: getattr(model_args, name) for name in overrides if getattr(model_args, name) is not None}
    if changes:
        if model_args.init_from:
            raise UserInputError(f"--init_from keeps the saved architecture; drop {sorted(changes)}.")
        if "hidden_size" in changes or "num_attention_heads" in changes:
            config.head_dim = None  # let the config derive it again from the new width / head count
        if "num_attention_heads" in changes and "num_key_value_heads" not in changes:
            config.num_key_value_heads = None
        values = {**config.to_dict(), **changes}
        try:
            config = AutoConfig.for_model("tinytx", **{k: v for k, v in values.items() if k != "model_type"})
        except ValueError as error:
            raise UserInputError(str(error)) from error
    return config


def describe_data(data_args) -> str:
    if data_args.dataset_name:
        return f"the Hub dataset `{data_args.dataset_name}` ({data_args.dataset_config_name or 'default config'})"
    if data_args.train_file:
        return f"local files `{data_args.train_file}`"
    return (
        "the embedded synthetic corpus of `hf_tinytx.corpus` (coreference, recall and copy documents), "
        f"{data_args.num_train_documents or DEFAULT_CORPUS_DOCUMENTS:,} documents"
    )


@torch.no_grad()
def evaluate(model, dataloader, accelerator, bytes_per_token: float, train_args) -> dict:
    """Mean loss over the validation blocks; every block has the same number of targets, so the mean is exact."""
    model.eval()
    losses = []
    for i, batch in enumerate(dataloader):
        if train_args.max_eval_batches and i >= train_args.max_eval_batches:
            break
        loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
        losses.append(accelerator.gather_for_metrics(loss.float().repeat(batch["input_ids"].shape[0])))
    model.train()
    losses = torch.cat(losses)
    mean_loss = losses.mean().item()
    block_size = batch["input_ids"].shape[1]
    return {
        "eval_loss": mean_loss,
        "perplexity": export.perplexity(mean_loss),
        # bits per byte = total nats / (ln 2 * total bytes), with bytes = tokens * (bytes per validation token)
        "bits_per_byte": mean_loss / (math.log(2) * bytes_per_token),
        "eval_tokens": len(losses) * (block_size - 1),
    }


def run_probes_and_samples(model, tokenizer, train_args, accelerator) -> dict:
    """Probe accuracies (does the model pick the right continuation?) and a few greedy generations."""
    if train_args.num_probes_per_kind <= 0 and train_args.num_samples <= 0:
        return {}
    from hf_tinytx.corpus import make_probes
    from hf_tinytx.probes import score_probes

    model.eval()
    probes = make_probes(num_per_kind=max(train_args.num_probes_per_kind, 1))
    results = {}
    if train_args.num_probes_per_kind > 0:
        scores = score_probes(model, tokenizer, probes, batch_size=train_args.per_device_eval_batch_size)
        results = {name: value for name, value in scores.items() if not name.startswith("n_")}  # drop the counts
        accelerator.print("probe accuracy: " + ", ".join(f"{name} {value:.3f}" for name, value in results.items()))
    prompts = []
    for kind in ("coref", "copy", "coref_new_nouns", "recall"):
        prompts += [probe.prompt for probe in probes if probe.kind == kind][:1]
    for prompt in prompts[: train_args.num_samples]:
        inputs = tokenizer(prompt, return_tensors="pt", add_special_tokens=False).to(model.device)
        output = model.generate(**inputs, max_new_tokens=20, do_sample=False)
        completion = tokenizer.decode(output[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True)
        accelerator.print(f"sample: ...{prompt[-80:]!s}[{completion}]")
    return results


# ---------------------------------------------------------------- checkpoints and metrics


def save_checkpoint(accelerator, checkpoints_dir: str, step: int, run_signature: dict, train_args) -> None:
    """Writes checkpoints/step_N via a temporary name: a run killed mid-save leaves the previous ones intact."""
    final = os.path.join(checkpoints_dir, f"step_{step}")
    temporary = os.path.join(checkpoints_dir, f".tmp_step_{step}")
    if accelerator.is_main_process and os.path.exists(temporary):
        shutil.rmtree(temporary)
    accelerator.wait_for_everyone()
    accelerator.save_state(temporary)  # model (safetensors), optimizer, scheduler, RNG of every process
    if accelerator.is_main_process:
        with open(os.path.join(temporary, "trainer_state.json"), "w", encoding="utf-8") as f:
            json.dump({"step": step, "run_signature": run_signature}, f)
    if os.environ.get("TINYTX_DEBUG_CRASH_IN_CHECKPOINT") == str(step):  # tests: die before the save is complete
        os._exit(17)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        if os.path.exists(final):
            shutil.rmtree(final)
        os.replace(temporary, final)
        steps = sorted(int(m.group(1)) for m in map(CHECKPOINT_NAME.match, os.listdir(checkpoints_dir)) if m)
        for old in steps[: -train_args.checkpoints_total_limit] if train_args.checkpoints_total_limit else []:
            shutil.rmtree(os.path.join(checkpoints_dir, f"step_{old}"))
    accelerator.wait_for_everyone()


def push_checkpoint(pusher, model, state_dict, tokenizer, history, checkpoints_dir, step, training_args) -> None:
    """Queues checkpoint `step` for checkpoints/step_N/ of the Hub repo, as a complete model folder (weights, config,
    code, tokenizer, card) without the optimizer and RNG state. The pusher snapshots the folder by hard links before
    returning, so our copy can go at once and pruning old checkpoints never pulls files from under an upload."""
    folder = os.path.join(checkpoints_dir, f".hub_step_{step}")  # hidden: never taken for a checkpoint to resume
    if os.path.exists(folder):
        shutil.rmtree(folder)  # left by a run killed while exporting this step
    last_loss = next((row["loss"] for row in reversed(history) if "loss" in row), None)
    card = cards.checkpoint_card(pusher.repo_id, step, last_loss)
    try:
        export.write_model_folder(folder, model, state_dict, tokenizer, card, history, training_args, "2GB")
        pusher.push_async(folder, f"Checkpoint at step {step}", path_in_repo=f"checkpoints/step_{step}")
    except Exception as error:  # e.g. a full disk: the checkpoint itself is saved, so go on training
        print(f"Could not export checkpoint {step} for the Hub ({error}); training goes on.", file=sys.stderr)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def report_hub_pushes(pusher, final_pushed: bool, repo_id: str, output_dir: str, accelerator) -> None:
    """A summary at the very end, so a failed upload is not lost in the training log (never with the token)."""
    failures = pusher.failures
    if final_pushed and not failures:
        accelerator.print(f"Pushed to the Hub as {repo_id} (final model at the root, checkpoints under checkpoints/).")
        return
    accelerator.print(f"Hub push to {repo_id}: {len(failures)} upload(s) failed:")
    for message in failures:
        accelerator.print(f"  - {message}")
    if final_pushed:
        accelerator.print(f"The final model did reach the Hub; the local folder {output_dir} is complete.")
    else:
        accelerator.print(
            f"The final model was NOT pushed; the local folder {output_dir} is complete: push it again with "
            f"`hf upload {repo_id} {output_dir} --exclude 'checkpoints/*'`."
        )


def find_checkpoint(resume_from: str | None, checkpoints_dir: str) -> str | None:
    if not resume_from:
        return None
    if resume_from != "latest":
        if not os.path.isfile(os.path.join(resume_from, "trainer_state.json")):
            raise UserInputError(
                f"--resume_from_checkpoint {resume_from} is not a complete checkpoint (no trainer_state.json); "
                f"give a checkpoints/step_N folder or 'latest'."
            )
        return os.path.abspath(resume_from)
    if not os.path.isdir(checkpoints_dir):
        return None
    steps = sorted(int(m.group(1)) for m in map(CHECKPOINT_NAME.match, os.listdir(checkpoints_dir)) if m)
    return os.path.join(checkpoints_dir, f"step_{steps[-1]}") if steps else None


def start_metrics_log(output_dir: str, completed_steps: int, accelerator) -> list[dict]:
    """metrics.jsonl up to the resumed step (a crashed run may have logged beyond its last checkpoint)."""
    path = os.path.join(output_dir, "metrics.jsonl")
    history = []
    if completed_steps and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            history = [row for row in map(json.loads, f) if row["step"] <= completed_steps]
    if accelerator.is_main_process:
        os.makedirs(output_dir, exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in history)
        os.replace(path + ".tmp", path)
    return history


def log_metrics(row: dict, history: list, output_dir: str, accelerator) -> None:
    history.append(row)
    accelerator.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])
    if accelerator.is_main_process:
        with open(os.path.join(output_dir, "metrics.jsonl"), "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def flat_scalars(values: dict) -> dict:
    """Trackers accept numbers, strings and booleans only."""
    return {k: v for k, v in values.items() if isinstance(v, (int, float, str, bool))}


def read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def debug_write_parameter_checksum(accelerator, model, step: int) -> None:
    """Tests of data parallelism: every process writes a hash of the weights it holds."""
    prefix = os.environ.get("TINYTX_DEBUG_CHECKSUM_PREFIX")
    if not prefix:
        return
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(accelerator.unwrap_model(model).state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes())
    with open(f"{prefix}.rank{accelerator.process_index}.json", "w", encoding="utf-8") as f:
        json.dump({"step": step, "sha256": digest.hexdigest(), "num_processes": accelerator.num_processes}, f)


if __name__ == "__main__":
    try:
        main()
    except UserInputError as error:
        print(f"pretrain.py: error: {error}", file=sys.stderr)
        sys.exit(2)
