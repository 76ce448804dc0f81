"""finetune.py's own arguments, its --help and the checks that need neither torch nor transformers' Trainer.

`preflight` runs them before torch loads (~8 s), so a bad flag, model folder or data line is answered in about
a second; sft/finetune_run.py's `parse_args` runs the same checks again on the full `TrainingArguments`.
--help lists Trainer's flags too, so it loads torch.
"""

import difflib
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

from transformers import HfArgumentParser

from hf_tinytx.folders import location as sources
from hf_tinytx.folders import weights as stored_weights
from hf_tinytx_training.cli import program_name
from hf_tinytx_training.distributed.cluster import refuse_lone_process
from hf_tinytx_training.errors import UserInputError, as_user_input_error
from hf_tinytx_training.pretrain_args import (
    build_parser,
    check_hub_repo_id,
    check_hub_timeout,
    check_ranges,
    env_flag,
    flag,
    refuse_empty_values,
    warn_if_token_in_argv,
)
from hf_tinytx_training.publish.output_dir import check_output_dir, check_second_destination, refuse_overlap
from hf_tinytx_training.sft.records import read_records


LLAMA_LINEAR_NAMES = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
# its name in the record of the files it wrote into a folder (hf_tinytx.folders.safe)
WRITER = "tinytx finetune"
# finetune's, over Trainer's
TRAINER_DEFAULTS = {"logging_steps": 10, "report_to": "none", "save_total_limit": 2}
DESCRIPTION = (
    "Fine-tunes a causal LM (a model folder or a Hub id) with transformers' Trainer, in full or as a LoRA "
    "adapter (--use_peft). finetune's own flags come first, then every flag of transformers' "
    "TrainingArguments. Without a GPU, --dataloader_pin_memory defaults to False, and a launch of several "
    "processes sets --use_cpu."
)


@dataclass
class FinetuneArguments:
    model_name_or_path: str = field(
        metadata={"help": "The model to fine-tune: a saved model folder or a Hub id."}
    )
    train_file: str = field(
        metadata={
            "help": ".jsonl of {prompt, response} or {messages} records, or .txt with one document per line."
        }
    )
    validation_file: str | None = flag(None, "Held-out data in the same format.")
    max_seq_length: int | None = flag(
        None, "Longest training row in tokens. Default: min(1024, the model's context)."
    )
    packing: bool = flag(False, "Pack examples end to end into full rows instead of padding each one.")
    use_peft: bool = flag(False, "Train a LoRA adapter instead of every weight.")
    lora_r: int = flag(8, "LoRA rank.")
    lora_alpha: int = flag(16, "LoRA scaling numerator (the update is scaled by alpha/r).")
    lora_dropout: float = flag(0.05, "Dropout on the LoRA input.")
    lora_target_modules: str = flag(
        LLAMA_LINEAR_NAMES,
        "Comma-separated module names to adapt (those the model lacks are skipped), or all-linear.",
    )
    lora_trainable_tokens: str | None = flag(
        None,
        "With --use_peft: also train the embedding rows of the tokens this text encodes to (PEFT's "
        "trainable_token_indices), for tokens the base model barely saw. Default: none.",
    )
    merge: bool = flag(False, "With --use_peft: also save base + adapter merged into one model folder.")
    merged_output_dir: str | None = flag(None, "Where --merge writes; default output_dir/merged.")
    attn_implementation: str | None = flag(None, "eager, sdpa, ...; default: the model's.")
    hub_timeout: float = flag(600.0, "With --push_to_hub: wait at most this many seconds for the upload.")
    hub_stop_timeout: float = flag(
        20.0,
        "With --hub_strategy checkpoint or all_checkpoints: at a stop signal, wait at most this many seconds "
        "for the stop's checkpoint to reach the Hub (0: keep it local).",
    )
    trust_remote_code: bool = flag(
        False, "Allow a checkpoint's own code (models transformers does not know)."
    )
    overwrite_output_dir: bool = flag(  # TrainingArguments dropped its flag of this name in transformers 5
        False, "Replace the earlier run in --output_dir (its model and checkpoints; other files stay).")


@dataclass
class EarlyTrainerFlags:
    """The `TrainingArguments` flags the checks read, spelled and typed as
    Trainer's; preflight ignores the rest."""

    output_dir: str = "trainer_output"  # Trainer's default
    push_to_hub: bool = False
    hub_model_id: str | None = None
    fsdp: str | None = None
    deepspeed: str | None = None
    resume_from_checkpoint: str | None = None
    # Numbers Trainer would take and fail on (or train NaN with) once torch has loaded: None is not given.
    learning_rate: float | None = None
    weight_decay: float | None = None
    num_train_epochs: float | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None


def preflight(argv: list[str] | None = None) -> None:
    """The flags, the model folder and the data files checked before the heavy
    imports (finetune.py's `main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:  # every flag, Trainer's too, listed and exit 0
        from transformers import TrainingArguments  # loads torch: a few seconds

        finetune_parser(TrainingArguments).parse_known_args(argv)
    warn_if_token_in_argv(argv, program_name("finetune"))
    refuse_lone_process()
    parser = build_parser((FinetuneArguments, EarlyTrainerFlags))
    args, trainer_flags, _ = parser.parse_args_into_dataclasses(
        args=argv, return_remaining_strings=True, look_for_args_file=False
    )  # the rest are Trainer's flags, or typos that parse_args names
    refuse_empty_values(args, trainer_flags)
    check_trainer_numbers(trainer_flags)
    check_args(args, trainer_flags)
    check_destinations(args, trainer_flags)
    model_source(args.model_name_or_path)
    for path in filter(None, (args.train_file, args.validation_file)):
        read_records(path)


def finetune_parser(training_arguments: type, **defaults) -> HfArgumentParser:
    """finetune's flags and those of `training_arguments` (transformers' TrainingArguments)."""
    parser = build_parser((FinetuneArguments, training_arguments), **TRAINER_DEFAULTS, **defaults)
    parser.description = DESCRIPTION
    return parser


def check_args(args: FinetuneArguments, trainer_flags) -> None:
    """`trainer_flags`: the `TrainingArguments`, or preflight's `EarlyTrainerFlags`."""
    if args.overwrite_output_dir and trainer_flags.resume_from_checkpoint:
        raise UserInputError("--overwrite_output_dir replaces the earlier run that --resume_from_checkpoint "
                             "continues: pass one of them.")
    if args.merge and not args.use_peft:
        raise UserInputError("--merge folds a LoRA adapter into the model, so it needs --use_peft.")
    if args.use_peft and importlib.util.find_spec("peft") is None:
        raise UserInputError(
            '--use_peft needs the peft package: pip install -e ".[peft]" (or pip install peft).'
        )
    if args.max_seq_length is not None and args.max_seq_length < 2:
        raise UserInputError(f"--max_seq_length must be at least 2 tokens, got {args.max_seq_length}.")
    check_hub_timeout(args.hub_timeout)
    check_ranges({"hub_stop_timeout": (args.hub_stop_timeout, 0, True, "a number of seconds >= 0 such as 20 "
                                       "(0: the stop's checkpoint stays local)")})
    if args.lora_r <= 0:
        raise UserInputError(f"--lora_r must be a positive rank, got {args.lora_r}.")
    if not 0.0 <= args.lora_dropout < 1.0:
        raise UserInputError(f"--lora_dropout must lie in [0, 1), got {args.lora_dropout}.")
    if args.lora_trainable_tokens and not args.use_peft:
        raise UserInputError("--lora_trainable_tokens trains embedding rows beside a LoRA adapter: add "
                             "--use_peft (without it every weight is trained).")
    # `accelerate launch` with an FSDP or DeepSpeed config tells Trainer so through the environment.
    launched_sharded = env_flag("ACCELERATE_USE_FSDP") or env_flag("ACCELERATE_USE_DEEPSPEED")
    if trainer_flags.fsdp or trainer_flags.deepspeed or launched_sharded:
        raise UserInputError(
            "finetune.py runs on one process or data-parallel (torchrun) and saves the weights one process "
            "holds, which FSDP and DeepSpeed split up: drop --fsdp/--deepspeed (or the accelerate config "
            "that sets them)."
        )
    if trainer_flags.push_to_hub:
        check_hub_repo_id(trainer_flags.hub_model_id, trainer_flags.output_dir)


def check_trainer_numbers(trainer_flags) -> None:
    """Trainer's numbers that preflight can check without loading torch (`EarlyTrainerFlags`)."""
    check_ranges({
        "learning_rate": (trainer_flags.learning_rate, 0, False, "a small positive number such as 1e-4"),
        "weight_decay": (trainer_flags.weight_decay, 0, True, "a number >= 0 such as 0.01"),
        "num_train_epochs": (trainer_flags.num_train_epochs, 0, False, "a positive number such as 3"),
        "per_device_train_batch_size": (trainer_flags.per_device_train_batch_size, 0, False, "at least 1"),
        "gradient_accumulation_steps": (trainer_flags.gradient_accumulation_steps, 0, False, "at least 1"),
    })


def check_destinations(args: FinetuneArguments, trainer_flags) -> tuple[str, str]:
    """(output folder, merged folder), absolute; refused if one overlaps the
    base model, or would lose a run."""
    output_dir = os.path.abspath(trainer_flags.output_dir)
    default_merged = os.path.join(output_dir, "merged")
    merged_dir = os.path.abspath(args.merged_output_dir) if args.merged_output_dir else default_merged
    written = [("--output_dir", output_dir)] + ([("--merged_output_dir", merged_dir)] if args.merge else [])
    if os.path.isdir(args.model_name_or_path):  # the base model is read, never written over
        for flag, folder in written:
            refuse_overlap(args.model_name_or_path, folder, ("--model_name_or_path", flag))
    flags = output_dir_flags(args, trainer_flags)
    check_output_dir(output_dir, flags)
    if args.merge:
        check_second_destination(merged_dir, "--merged_output_dir", output_dir, flags, WRITER, default_merged)
    return output_dir, merged_dir


def output_dir_flags(args: FinetuneArguments, trainer_flags) -> SimpleNamespace:
    """What training/publish/output_dir.py reads to let a run into a folder: resume,
    or replace what finetune wrote."""
    return SimpleNamespace(resume_from_checkpoint=trainer_flags.resume_from_checkpoint,
                           overwrite_output_dir=args.overwrite_output_dir)


def model_source(name_or_path: str) -> str:
    """A saved model folder (as an absolute path) or a Hub id, checked now rather than when it loads."""
    path = os.path.abspath(os.path.expanduser(name_or_path))
    if os.path.isdir(path):
        check_model_folder(path, name_or_path)
        return path
    if os.path.exists(path):
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r} is a file; give a model folder or a Hub id."
        )
    if (problem := sources.link_problem(path)) is not None:  # not a Hub id, whatever its name looks like
        raise UserInputError(f"--model_name_or_path {name_or_path!r} {problem}.")
    try:
        return sources.local_folder_or_hub_id(name_or_path)
    except FileNotFoundError:
        parent = os.path.dirname(path)
        siblings = os.listdir(parent) if os.path.isdir(parent) else []
        closest = difflib.get_close_matches(os.path.basename(path), siblings, n=1)
        hint = (
            f" (did you mean {os.path.join(os.path.dirname(name_or_path), closest[0])!r}?)" if closest else ""
        )
        raise UserInputError(
            f"--model_name_or_path {name_or_path!r}: no such folder{hint}; give a saved model folder or a "
            "Hub id like 'owner/name'."
        ) from None


def check_model_folder(path: str, name: str) -> None:
    names = set(os.listdir(path))
    if "config.json" not in names:
        raise UserInputError(
            f"--model_name_or_path {name!r} has no config.json, so it holds no saved model; give the folder "
            "that save_pretrained wrote."
        )
    if not names.intersection(sources.TOKENIZER_MARKERS):
        raise UserInputError(f"--model_name_or_path {name!r} has no tokenizer (no tokenizer.json or "
                             "tokenizer_config.json); save the base model's tokenizer into it: "
                             "AutoTokenizer.from_pretrained(base).save_pretrained(folder).")
    if stored_weights.has_safetensors(path):
        # A damaged file would otherwise be a SafetensorError traceback once torch has loaded (~8 s in).
        with as_user_input_error(ValueError):
            stored_weights.stored_shapes(path, f"--model_name_or_path {name!r}")
