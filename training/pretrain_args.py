"""pretrain's flags as dataclasses parsed by `HfArgumentParser`, named as in transformers'
`run_clm_no_trainer.py` where they mean the same. A YAML or JSON file given first sets the
defaults; flags after it override them:

    python training/pretrain.py training/configs/tiny.yaml --max_train_steps 50
"""

import json
import math
import os
import sys
from dataclasses import MISSING, dataclass, field, fields

from transformers import HfArgumentParser

from hf_tinytx.commands.flags import OneLineParser
from hf_tinytx.folders import location as sources
from hf_tinytx_training.cli import program_name
from hf_tinytx_training.data.files import local_data_files
from hf_tinytx_training.data.token_store import check_folder, store_folder, tokenized_files
from hf_tinytx_training.distributed.cluster import refuse_lone_process
from hf_tinytx_training.errors import UserInputError
from hf_tinytx_training.model.config_file import config_file_path, read_config_file
from hf_tinytx_training.optim.schedules import CLOCK_SHAPES
from hf_tinytx_training.plan.flags import refuse_plan_only_without_a_plan
from hf_tinytx_training.publish.hub_checkpoint import OWN_REPO, STRATEGIES, WHOLE
from hf_tinytx_training.publish.output_dir import check_output_dir


def flag(default, help: str):
    """A dataclass field as HfArgumentParser reads it: the flag's default and its --help text."""
    return field(default=default, metadata={"help": help})


@dataclass
class ModelArguments:
    model_preset: str = flag(
        "micro",
        "A model size from training/configs/ (micro ~0.17M, the default run's; tiny ~1M, small ~10M, base "
        "~124M).",
    )
    model_config: str | None = flag(None, "A TinyTxConfig as a .json/.yaml file; replaces --model_preset.")
    init_from: str | None = flag(
        None, "Continue training the model (and tokenizer) in this saved model folder."
    )
    tokenizer_name: str | None = flag(
        None, "A tokenizer folder or Hub id. Default: train a byte-level BPE on the data.")
    vocab_size: int = flag(1024, "Vocabulary size of the BPE trained when none is named.")
    hidden_size: int | None = flag(None, "Override the preset's width.")
    intermediate_size: int | None = flag(None, "Override the preset's MLP width.")
    num_hidden_layers: int | None = flag(None, "Override the preset's depth.")
    num_attention_heads: int | None = flag(None, "Override the preset's head count.")
    num_key_value_heads: int | None = flag(None, "Override the preset's kv heads.")
    max_position_embeddings: int | None = flag(None, "Override the longest context.")
    attn_implementation: str = flag("sdpa", "eager, sdpa, flash_attention_2, ...")
    torch_compile: bool = flag(
        False,
        "Compile the model with torch.compile for training and evaluation (the final probes and samples "
        "run eagerly: their many shapes would each compile again).",
    )
    gradient_checkpointing: bool = flag(False, "Recompute activations to save memory.")


@dataclass
class DataArguments:
    dataset_name: str | None = flag(None, "A dataset on the Hub (datasets.load_dataset).")
    dataset_config_name: str | None = flag(None, "The Hub dataset's configuration.")
    train_file: str | None = flag(None, "Local training text: .txt/.json/.jsonl/.parquet file or glob.")
    validation_file: str | None = flag(None, "Local validation text, same formats.")
    text_column: str = flag("text", "The column holding the documents.")
    streaming: bool = flag(
        False,
        "Read the data as training goes, tokenizing it on the way (shuffled in a buffer), instead of "
        "tokenizing it all into the token store first: a Hub dataset, or local files with --train_file.",
    )
    token_store: str | None = flag(
        None,
        "The folder of the token store (the data tokenized once, reused by resumes and later runs on the "
        "same files). Default: token_store/ in --output_dir.",
    )
    num_train_documents: int | None = flag(
        None, "Documents of the embedded default corpus (default 60000), or at most this many read.")
    validation_split_percentage: int = flag(
        5, "Percent of the documents held out when no validation split is given."
    )
    block_size: int = flag(128, "Tokens per training sequence (packed documents).")
    preprocessing_num_workers: int | None = flag(
        None, "Processes that tokenize the data side by side. Default: one per core this process may use.")


@dataclass
class PretrainArguments:
    output_dir: str = flag("out/tinytx", "Where the model folder and checkpoints go.")
    overwrite_output_dir: bool = flag(False, "Replace a model already exported in --output_dir.")
    per_device_train_batch_size: int = flag(16, "Sequences per device per micro-step.")
    per_device_eval_batch_size: int = flag(32, "Sequences per device when evaluating.")
    gradient_accumulation_steps: int = flag(1, "Micro-steps per optimizer step.")
    total_batch_size: int | None = flag(
        None, "Sequences per optimizer step over all processes: sets --gradient_accumulation_steps to this / "
        "(--per_device_train_batch_size x processes), which must divide it exactly.")
    learning_rate: float = flag(5e-3, "Peak learning rate of AdamW.")
    optimizer: str = flag(
        "auto",
        "adamw, or muon: torch.optim.Muon for the matrices inside the blocks, AdamW for the embeddings, "
        "the output head and the norms (one process or DDP); auto: muon, or adamw where FSDP or DeepSpeed "
        "shards the matrices.",
    )
    muon_learning_rate: float | None = flag(
        None, "Peak learning rate of Muon (scaled to AdamW's update size); default: --learning_rate.")
    weight_decay: float = flag(0.1, "Weight decay (2-D weights only).")
    adam_beta2: float = flag(0.95, "AdamW beta2.")
    max_grad_norm: float = flag(1.0, "Clip the gradient norm to this (0 disables).")
    lr_scheduler_type: str = flag("cosine", "Any transformers.get_scheduler name.")
    num_warmup_steps: int = flag(30, "Linear warmup steps.")
    max_train_steps: int | None = flag(
        None, "Optimizer steps. Default: from --max_train_tokens; else a run on your data (--train_file or "
        "--dataset_name, no size flag) is planned on the clock (--max_train_seconds, default 300); else "
        "3000.")
    max_train_tokens: int | None = flag(None, "Token budget; sets --max_train_steps.")
    max_train_seconds: float = flag(
        0.0,
        "Seconds of training. Alone, it plans the run: the learning-rate schedule runs on the clock and "
        "ends at this second; on your data with no size flag, the model's size is chosen for it too (300 s "
        "when neither this nor a step count is given). With --max_train_steps or --max_train_tokens it only "
        "cuts the run short (the run then says so; --resume_from_checkpoint latest continues it for as long "
        "again). 0: no clock.",
    )
    plan_only: bool = flag(
        False, "Print the plan of a run on your data (the model size, vocabulary, tokens and schedule chosen "
        "for the text, the budget and this machine) and stop before anything is written.")
    seed: int = flag(0, "Seed for initialisation, data order and splits.")
    mixed_precision: str = flag("no", "no or bf16.")
    eval_steps: int = flag(200, "Evaluate every N optimizer steps (and at the end).")
    max_eval_tokens: int = flag(
        65536,
        "Evaluate on at most this many validation tokens, in blocks spread evenly over the validation text "
        "(the same blocks on any process count); 0: all of it.",
    )
    max_eval_batches: int | None = flag(
        None,
        "Evaluate on at most N batches of --per_device_eval_batch_size blocks, counted over all processes "
        "(the same blocks on any process count).",
    )
    checkpointing_steps: int | None = flag(
        None, "Save a resumable checkpoint every N steps (one is always saved at the end).")
    checkpoints_total_limit: int | None = flag(2, "Keep only the last K checkpoints.")
    resume_from_checkpoint: str | None = flag(
        None,
        "'latest' or a checkpoint folder to continue from exactly; or from the Hub: 'hub' (the "
        "last-checkpoint/ of --hub_model_id) or REPO_ID[@REVISION]. An intact local checkpoint as new as "
        "the Hub's wins.",
    )
    report_to: str = flag("none", "tensorboard, trackio, wandb (several joined by commas), all or none.")
    num_probes_per_kind: int = flag(100, "Probe prompts per kind after training (0: off).")
    num_samples: int = flag(3, "Sample generations printed after training.")
    push_to_hub: bool = flag(
        False, "Upload each checkpoint (in the background) and the final model to the Hub."
    )
    hub_model_id: str | None = flag(None, "Hub repo id; default: the output dir name.")
    hub_token: str | None = flag(None, "Hub token; default: HF_TOKEN / stored login.")
    hub_strategy: str = flag(
        "every_save",
        "What goes to the Hub (Trainer's values): end (the final model only); every_save (also each "
        "checkpoint as a model folder, checkpoints/step_N/); checkpoint (also the newest checkpoint whole, "
        "optimizer and all, to last-checkpoint/, from which --resume_from_checkpoint hub continues); "
        "all_checkpoints (as checkpoint, and each one whole to checkpoints/step_N/ too).",
    )
    hub_private_repo: bool | None = field(default=None, metadata={
        "help": "Create the Hub repo as private (default: private with --hub_strategy checkpoint or "
        "all_checkpoints, whose checkpoints hold the run's whole state; --hub_private_repo false: public).",
        "nargs": "?", "const": True,  # the bare flag says yes, as before
    })
    hub_timeout: float = flag(600.0, "At the end, wait at most this many seconds for the uploads to finish.")
    hub_stop_timeout: float = flag(
        20.0,
        "With --hub_strategy checkpoint or all_checkpoints: at a stop signal, wait at most this many seconds "
        "for the stop's checkpoint to reach the Hub (0: keep it local). Keep it under the time your "
        "scheduler leaves before SIGKILL (Kubernetes: terminationGracePeriodSeconds; SLURM: --signal).",
    )
    ddp_timeout: float = flag(
        1800.0,
        "Seconds a process waits for the others at any collective (a step's all-reduce, a barrier) before "
        "the run stops with a line naming the checkpoint to resume from: a frozen or lost node ends the "
        "job instead of hanging it (Trainer's flag and default). While the main process prepares the data "
        "the others wait without a collective, for as long as it makes progress.",
    )


ALL_ARGUMENTS = (ModelArguments, DataArguments, PretrainArguments)
POSITIVE = (
    "vocab_size", "block_size", "num_train_documents",
    "preprocessing_num_workers",  # > 0 where given
    "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps", "eval_steps",
    "max_train_steps", "max_train_tokens", "checkpointing_steps", "checkpoints_total_limit",
    "total_batch_size", "max_eval_batches",
)


def parse_args(argv: list[str] | None = None) -> tuple[ModelArguments, DataArguments, PretrainArguments]:
    """Flags, or a .yaml/.json file first (its values become the defaults) followed by optional flags."""
    argv = list(sys.argv[1:] if argv is None else argv)
    explicit = explicit_flags(argv)
    parser = build_parser(ALL_ARGUMENTS)
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        parser.set_defaults(**_read_args_file(argv.pop(0), parser))
    model_args, data_args, train_args = parser.parse_args_into_dataclasses(
        args=argv, look_for_args_file=False
    )
    check_args(model_args, data_args, train_args)
    refuse_plan_only_without_a_plan(data_args, train_args, explicit)
    if train_args.push_to_hub:
        train_args.hub_model_id = hub_repo_id(train_args.hub_model_id, train_args.output_dir)
    if train_args.hub_private_repo is None:  # a whole checkpoint holds the run's data position and RNG
        train_args.hub_private_repo = train_args.hub_strategy in WHOLE
    return model_args, data_args, train_args


def preflight(argv: list[str] | None = None) -> None:
    """The flags, the output folder, the model's config file and the data files, checked before torch loads
    (pretrain.py's `main`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    warn_if_token_in_argv(argv, program_name("pretrain"))
    model_args, data_args, train_args = parse_args(argv)
    refuse_lone_process()
    check_output_dir(os.path.abspath(train_args.output_dir), train_args)
    if not model_args.init_from:
        read_config_file(config_file_path(model_args))
    store = store_folder(data_args, train_args.output_dir)
    if (data_args.train_file or data_args.dataset_name) and not data_args.streaming:
        check_folder(store)  # a folder of other files is no store: refused before anything is written
    if data_args.train_file:  # a file already in the token store was checked when it was tokenized
        local_data_files(data_args, frozenset(tokenized_files(store)))


def _read_args_file(path: str, parser: HfArgumentParser) -> dict:
    if not os.path.isfile(path):
        raise UserInputError(
            f"Arguments file {path!r} does not exist; give the path of a .yaml or .json file."
        )
    with open(path, encoding="utf-8") as f:
        if path.endswith(".json"):
            values = json.load(f)
        else:
            import yaml

            values = yaml.safe_load(f)
    if not isinstance(values, dict):
        raise UserInputError(f"Arguments file {path!r} must hold a mapping of argument names to values.")
    known = {action.dest for action in parser._actions}
    unknown = sorted(set(values) - known)
    if unknown:
        raise UserInputError(
            f"Arguments file {path!r} has unknown arguments {unknown}; see --help for the names."
        )
    return values


def check_args(model_args: ModelArguments, data_args: DataArguments, train_args: PretrainArguments) -> None:
    """Catch impossible settings now, not after the data is tokenized."""
    refuse_empty_values(model_args, data_args, train_args)
    given = {**vars(model_args), **vars(data_args), **vars(train_args)}
    for name in POSITIVE:
        if given[name] is not None and given[name] <= 0:
            raise UserInputError(f"--{name} must be a positive number, got {given[name]}.")
    if not (math.isfinite(train_args.ddp_timeout) and train_args.ddp_timeout > 0):
        raise UserInputError(
            f"--ddp_timeout must be a positive number of seconds, got {train_args.ddp_timeout}."
        )
    if not 0 <= train_args.max_train_seconds < math.inf:
        raise UserInputError(
            f"--max_train_seconds must be >= 0 (0: no limit), got {train_args.max_train_seconds}."
        )
    if train_args.total_batch_size is not None and train_args.gradient_accumulation_steps != 1:
        raise UserInputError(
            "--total_batch_size sets --gradient_accumulation_steps itself; give one of the two."
        )
    check_optimizer_args(train_args)
    if not 0 < data_args.validation_split_percentage < 100:
        raise UserInputError("--validation_split_percentage must lie between 1 and 99.")
    if train_args.mixed_precision not in ("no", "bf16"):
        raise UserInputError(f"--mixed_precision must be 'no' or 'bf16', got {train_args.mixed_precision!r}.")
    if data_args.dataset_name and data_args.train_file:
        raise UserInputError("Give either --dataset_name or --train_file, not both.")
    if data_args.validation_file and not data_args.train_file:
        raise UserInputError("--validation_file needs --train_file as well.")
    if data_args.streaming and not (data_args.dataset_name or data_args.train_file):
        raise UserInputError(
            "--streaming reads a Hub dataset (--dataset_name) or local files (--train_file); give one of "
            "them."
        )
    if not 0 <= train_args.seed < 2**32:
        raise UserInputError(f"--seed must be a whole number from 0 to 2**32 - 1, got {train_args.seed}.")
    for name in ("num_probes_per_kind", "num_samples"):
        if given[name] < 0:
            raise UserInputError(f"--{name} must be 0 or more (0: none), got {given[name]}.")
    if train_args.max_eval_tokens < 0:
        raise UserInputError(f"--max_eval_tokens must be >= 0 (0: the whole validation text), got "
                             f"{train_args.max_eval_tokens}.")
    if data_args.streaming and train_args.max_train_steps is None and train_args.max_train_tokens is None \
            and not train_args.max_train_seconds:
        raise UserInputError("A streamed dataset has no length: set --max_train_steps, --max_train_tokens or "
                             "--max_train_seconds.")
    if model_args.vocab_size < 260:
        raise UserInputError("--vocab_size must be at least 260 (256 bytes + special tokens), got "
                             f"{model_args.vocab_size}.")
    check_report_to(train_args.report_to)
    if train_args.push_to_hub or train_args.resume_from_checkpoint == OWN_REPO:
        check_hub_repo_id(train_args.hub_model_id, train_args.output_dir)
        check_hub_timeout(train_args.hub_timeout)
    check_ranges({"hub_stop_timeout": (train_args.hub_stop_timeout, 0, True, "a number of seconds >= 0 such "
                                       "as 20 (0: the stop's checkpoint stays local)")})
    if train_args.hub_strategy not in STRATEGIES:
        raise UserInputError(f"--hub_strategy must be one of {', '.join(STRATEGIES)}, got "
                             f"{train_args.hub_strategy!r}.")
    # The schedule is checked by pretrain_run.py's setup (check_schedule):
    # transformers' schedules are a heavy import.


def check_report_to(report_to: str) -> None:
    """Each tracker named must be installed: Accelerate would only warn, and the run would log to nothing."""
    if report_to in ("all", "none"):
        return
    # loads torch
    from accelerate.utils import is_tensorboard_available, is_trackio_available, is_wandb_available

    installed = {
        "tensorboard": is_tensorboard_available, "trackio": is_trackio_available, "wandb": is_wandb_available,
    }
    for name in report_to.split(","):
        if name not in installed:
            raise UserInputError(
                f"--report_to {report_to!r}: use tensorboard, trackio or wandb (several joined by commas), "
                "all, or none."
            )
        if not installed[name]():
            raise UserInputError(f"--report_to {name} needs the {name} package, which is not installed: "
                                 f"pip install {name}, or leave --report_to out.")


def apply_total_batch_size(train_args: PretrainArguments, num_processes: int) -> None:
    """Sets --gradient_accumulation_steps from --total_batch_size and the processes launched, or stops before
    any data is read when the processes cannot share it in whole micro-batches."""
    total = train_args.total_batch_size
    if total is None:
        return
    per_micro_step = train_args.per_device_train_batch_size * num_processes
    if total % per_micro_step:
        raise UserInputError(
            f"--total_batch_size {total} cannot be split over {num_processes} process(es) x "
            f"--per_device_train_batch_size {train_args.per_device_train_batch_size}: it must be a multiple "
            f"of {per_micro_step}; change the total, the per-device batch or the process count."
        )
    train_args.gradient_accumulation_steps = total // per_micro_step


def check_optimizer_args(train_args: PretrainArguments) -> None:
    """Non-finite or out-of-range optimizer values would train on NaN (or silently not clip): refuse them."""
    check_ranges({
        "learning_rate": (train_args.learning_rate, 0, False, "a small positive number such as 3e-3"),
        "weight_decay": (train_args.weight_decay, 0, True, "a number >= 0 such as 0.1"),
        "max_grad_norm": (
            train_args.max_grad_norm, 0, True, "a number > 0 such as 1.0, or 0 to turn clipping off",
        ),
    })
    if train_args.optimizer not in ("auto", "adamw", "muon"):
        raise UserInputError(f"--optimizer must be auto, adamw or muon, got {train_args.optimizer!r}.")
    muon_lr = train_args.muon_learning_rate
    if muon_lr is not None and not (math.isfinite(muon_lr) and muon_lr > 0):
        raise UserInputError(
            f"--muon_learning_rate must be a small positive number such as 3e-3, got {muon_lr}."
        )
    if not (math.isfinite(train_args.adam_beta2) and 0 <= train_args.adam_beta2 < 1):
        raise UserInputError(f"--adam_beta2 must lie in [0, 1), such as 0.95; got {train_args.adam_beta2}.")
    if train_args.num_warmup_steps < 0:
        raise UserInputError(f"--num_warmup_steps must be >= 0, got {train_args.num_warmup_steps}.")


def check_ranges(ranges: dict) -> None:
    """{flag: (value, lowest, whether the lowest is allowed, what to give)}: a value that is not a finite
    number in range is refused, naming the flag and a good value. None: the flag was not given."""
    for name, (value, low, low_ok, fix) in ranges.items():
        if value is not None and not (math.isfinite(value) and (value > low or (low_ok and value == low))):
            raise UserInputError(f"--{name} must be {fix}, got {value}.")


def refuse_empty_values(*parts) -> None:
    """A flag given an empty text (`--train_file ""`, often an unset shell variable) would silently mean
    its default (the built-in corpus, for --train_file): refused instead."""
    for part in parts:
        for spec in fields(part):
            value = getattr(part, spec.name)
            if isinstance(value, str) and not value.strip() and value != spec.default \
                    and spec.default_factory is MISSING:
                raise UserInputError(
                    f"--{spec.name} is empty; give it a value or leave the flag out (an unset shell "
                    "variable?)."
                )


def check_schedule(train_args: PretrainArguments) -> None:
    """--lr_scheduler_type must name a schedule that runs on the plan: a step count, or the clock."""
    if not planned_by_clock(train_args):
        _check_scheduler(train_args.lr_scheduler_type)
    elif train_args.lr_scheduler_type not in CLOCK_SHAPES:
        raise UserInputError(
            f"--lr_scheduler_type {train_args.lr_scheduler_type!r} has no form over the clock "
            f"(--max_train_seconds without a step count); use one of {', '.join(CLOCK_SHAPES)}, or give "
            "--max_train_steps."
        )


def planned_by_clock(train_args: PretrainArguments) -> bool:
    """--max_train_seconds alone: the schedule runs on the clock, not over a step count."""
    return bool(train_args.max_train_seconds) and train_args.max_train_steps is None \
        and train_args.max_train_tokens is None


def plan_steps(
    data_args: DataArguments, train_args: PretrainArguments, num_processes: int
) -> tuple[int | None, int]:
    """(optimizer steps, tokens per step): --max_train_steps, else from --max_train_tokens, else None when
    --max_train_seconds plans the run, else 3000."""
    tokens_per_step = (train_args.per_device_train_batch_size * train_args.gradient_accumulation_steps
                       * num_processes * data_args.block_size)
    if planned_by_clock(train_args):
        return None, tokens_per_step
    steps = train_args.max_train_steps
    if steps is None:
        steps = (
            math.ceil(train_args.max_train_tokens / tokens_per_step) if train_args.max_train_tokens else 3000
        )
    return steps, tokens_per_step


def _check_scheduler(name: str) -> None:
    """Builds and steps the schedule on a dummy optimizer: what fails here would
    fail at the first training step."""
    import torch
    from transformers import SchedulerType, get_scheduler

    if name not in [kind.value for kind in SchedulerType]:
        raise UserInputError(
            f"--lr_scheduler_type {name!r} is not a transformers schedule; use cosine, linear, "
            "constant_with_warmup, warmup_stable_decay, ... (transformers.SchedulerType lists them)."
        )
    try:
        optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
        scheduler = get_scheduler(name, optimizer=optimizer, num_warmup_steps=1, num_training_steps=10)
        optimizer.step()
        scheduler.step()
    except Exception as error:  # schedules that need extra arguments or a metric
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise UserInputError(
            f"--lr_scheduler_type {name!r} cannot run on the step count alone ({reason}); use cosine, linear "
            "or constant_with_warmup."
        ) from None


def hub_repo_id(hub_model_id: str | None, output_dir: str) -> str:
    """The Hub repo a run pushes to: --hub_model_id, or else the --output_dir
    folder's name (as Trainer names it)."""
    return hub_model_id or os.path.basename(os.path.abspath(output_dir))


def check_hub_repo_id(hub_model_id: str | None, output_dir: str) -> None:
    """A repo id the Hub would reject is refused now, not at the first push after training."""
    repo_id = hub_repo_id(hub_model_id, output_dir)
    if not sources.is_repo_id(repo_id):
        named = "--hub_model_id" if hub_model_id else "The Hub repo id from --output_dir's name,"
        raise UserInputError(
            f"{named} {repo_id!r} is not a valid Hub repo id; set --hub_model_id to 'name' or 'owner/name' "
            "(letters, digits, '-', '_' and '.', at most 96 characters)."
        )


def check_hub_timeout(hub_timeout: float) -> None:
    if not (math.isfinite(hub_timeout) and hub_timeout > 0):
        raise UserInputError(f"--hub_timeout must be a positive number of seconds, got {hub_timeout}.")


def warn_if_token_in_argv(argv: list[str], script: str) -> None:
    """A command line is readable by every user of the machine (ps): said once, by the first process."""
    if os.environ.get("RANK", "0") == "0" and any(arg.split("=")[0] == "--hub_token" for arg in argv):
        sys.stderr.write(
            f"{script}: warning: --hub_token puts the token on the command line, where other users of this "
            "machine can read it while the run lasts; set HF_TOKEN or run `hf auth login` instead.\n"
        )


def env_flag(name: str) -> bool:
    """A yes/no setting from the environment, as `accelerate launch` writes its
    config there (ACCELERATE_USE_FSDP)."""
    return os.environ.get(name, "false").lower() in ("1", "true", "yes")


def args_to_dict(*parts) -> dict:
    """Arguments (dataclasses, or dicts of more values) as one dict, without the Hub
    token (never in a file or log)."""
    values = {}
    for part in parts:
        values.update(part if isinstance(part, dict) else vars(part))
    values.pop("hub_token", None)
    return values


def write_args_json(path: str | os.PathLike, *parts) -> None:
    """The run's arguments (`args_to_dict`: never the Hub token) as a JSON file beside the model it made."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(args_to_dict(*parts), f, indent=2, sort_keys=True, default=str)


def build_parser(dataclass_types, **defaults) -> HfArgumentParser:
    """An `HfArgumentParser` for these dataclasses that takes flags only as spelled in full and reports every
    mistake on one line (`prog: error: ...`, exit 2), a typo with the nearest flag."""
    # `--max_train_step` must not mean `..._steps`
    parser = _OneLineErrorParser(dataclass_types, allow_abbrev=False)
    parser.set_defaults(**defaults)
    return parser


class _OneLineErrorParser(HfArgumentParser, OneLineParser):
    def parse_args_into_dataclasses(self, args=None, return_remaining_strings=False, **kwargs):
        # HfArgumentParser raises ValueError (a traceback) for leftover strings; they are named here instead.
        try:
            *outputs, remaining = super().parse_args_into_dataclasses(
                args, return_remaining_strings=True, **kwargs
            )
        except ValueError as error:  # a dataclass's own check, e.g. TrainingArguments.__post_init__
            self.refuse(" ".join(str(error).split()))
        if return_remaining_strings:
            return (*outputs, remaining)
        if remaining:
            self.refuse(self.unknown(remaining[0]))
        return tuple(outputs)


def explicit_flags(argv: list[str]) -> frozenset:
    """The argument names the command line sets (flags, and those of a leading .yaml/.json file): sizes the
    user chose are kept, the others may be fitted to a small text (data/sizing.py)."""
    names = {arg[2:].split("=", 1)[0] for arg in argv if arg.startswith("--")}
    if argv and argv[0].endswith((".yaml", ".yml", ".json")) and os.path.isfile(argv[0]):
        names |= set(_read_args_file(argv[0], build_parser(ALL_ARGUMENTS)))
    return frozenset(names)
