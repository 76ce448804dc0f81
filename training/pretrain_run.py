"""Pre-training on Accelerate, the run that pretrain.py starts once its input is checked:
`setup` -> `fit` (the loop) -> `finish` (final checkpoint, evaluation, probes) ->
`export_and_push` (the model folder, then the Hub).

Every input is checked before anything is written. A checkpoint always comes before the export, so
an interrupted run continues with `--resume_from_checkpoint latest`; SIGTERM or SIGINT stops it at
the next step boundary with a checkpoint.
"""

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import TextIO

import torch
from accelerate import Accelerator
from accelerate.scheduler import AcceleratedScheduler
from accelerate.utils import ProjectConfiguration, set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

import hf_tinytx  # noqa: F401  (registers the "tinytx" model type)
from hf_tinytx.commands.quiet import quiet_notices
from hf_tinytx.folders.safe import folders_to_create
from hf_tinytx_training import checkpoints
from hf_tinytx_training.cli import print_own, program_name
from hf_tinytx_training.data import packing, token_store
from hf_tinytx_training.data.fingerprint import pretrain_data
from hf_tinytx_training.data.handoff import Handoff, prepare_as_main, receive_data, take_back
from hf_tinytx_training.data.packing import PackedData, make_dataloaders
from hf_tinytx_training.data.sizing import passes
from hf_tinytx_training.data.sources import DEFAULT_CORPUS_DOCUMENTS
from hf_tinytx_training.distributed import cluster, cpu_memory, sharding
from hf_tinytx_training.distributed.cluster import refuse_lone_process
from hf_tinytx_training.distributed.cpu_threads import BusyCores, set_threads
from hf_tinytx_training.distributed.preemption import Stopped, signal_of, stop_message, stop_requests
from hf_tinytx_training.errors import RunError, UserInputError
from hf_tinytx_training.evaluation import (
    ProbeReport,
    own_text_prompts,
    run_probes_and_samples,
    validation_metrics,
)
from hf_tinytx_training.memorising import memorising_warning
from hf_tinytx_training.model.build import make_model
from hf_tinytx_training.model.config import check_model_builds, load_model_config
from hf_tinytx_training.optim.optimizers import chosen_optimizer, make_optimizer, make_schedule
from hf_tinytx_training.optim.schedules import Clock
from hf_tinytx_training.plan import choose as planning
from hf_tinytx_training.plan import flags as plan_flags
from hf_tinytx_training.pretrain_args import (
    DataArguments,
    ModelArguments,
    PretrainArguments,
    apply_total_batch_size,
    args_to_dict,
    check_schedule,
    explicit_flags,
    hub_repo_id,
    parse_args,
    plan_steps,
)
from hf_tinytx_training.publish import cards, export, hub_checkpoint
from hf_tinytx_training.publish.hub import HubPusher, push_final
from hf_tinytx_training.publish.output_dir import (
    check_output_dir,
    claim,
    refuse_writing_where_read,
    release_lock,
)
from hf_tinytx_training.publish.run_log import RunLog


PROGRAM = program_name("pretrain")  # "tinytx pretrain" or "pretrain.py", as the user started it
STOP = stop_requests(PROGRAM)  # SIGTERM and SIGINT: a checkpoint at the next step boundary, then a clean stop


@dataclass
class Progress:
    """What changes as the run trains; everything else in `Run` is fixed by `setup`."""

    step: int = 0  # optimizer steps completed
    epoch: int = 0
    batch_in_epoch: int = 0  # micro-batches of the current epoch already trained on
    saved_step: int | None = None  # the step of the newest checkpoint this launch saved or resumed from
    train_seconds: float = 0.0  # this launch's time in `fit`
    earlier_seconds: float = 0.0  # the time in `fit` of the launches this one resumes
    launches: int = 1
    stopped_by_clock: bool = False


@dataclass(frozen=True)
class Run:
    """What a training run holds: built by `setup`, advanced by `fit` (in
    `progress` only), read by the rest."""

    model_args: ModelArguments
    data_args: DataArguments
    train_args: PretrainArguments
    accelerator: Accelerator
    output_dir: str
    tokenizer: PreTrainedTokenizerBase
    packed: PackedData
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    lr_scheduler: AcceleratedScheduler
    train_dataloader: DataLoader
    eval_dataloader: DataLoader
    num_parameters: int
    max_train_steps: int | None  # None: planned in seconds (--max_train_seconds alone)
    tokens_per_step: int
    clock: Clock
    log: RunLog
    pusher: HubPusher | None  # on the main process with --push_to_hub
    lock: TextIO | None  # on the main process: the output folder's lock, held until the export
    own_fsdp2: bool  # sharded by distributed/sharding.py, not by Accelerate (FSDP2 on CPUs)
    data_fingerprint: dict  # what decides the data (data/fingerprint.py), recorded in every checkpoint
    threads: int | None  # torch's CPU threads (distributed/cpu_threads.py), recorded in every checkpoint
    plan: "planning.Plan | None"  # the run planned itself (plan/choose.py), recorded in every checkpoint
    progress: Progress = field(default_factory=Progress)

    @property
    def checkpoints_dir(self) -> str:
        return os.path.join(self.output_dir, "checkpoints")

    @property
    def layout(self) -> checkpoints.Layout:
        return checkpoints.Layout(self.checkpoints_dir)

    @property
    def signature(self) -> dict:
        global_batch = self.tokens_per_step // self.data_args.block_size
        return checkpoints.make_run_signature(self.train_args, self.data_args.block_size, global_batch,
                                              self.accelerator.num_processes, self.model_args)

    @property
    def sharded(self) -> tuple | None:
        """(model, optimizer, scheduler) when distributed/sharding.py shards them:
        saved beside Accelerate's state."""
        return (self.model, self.optimizer, self.lr_scheduler) if self.own_fsdp2 else None


def pretrain(argv=None) -> None:
    """The run of pretrain.py's flags (`argv`, else the command line's), from setup to the export."""
    quiet_notices()
    model_args, data_args, train_args = parse_args(argv)
    explicit = explicit_flags(sys.argv[1:] if argv is None else list(argv))  # sizes the user chose are kept
    run = None
    try:
        run = setup(model_args, data_args, train_args, explicit)
        if run is None:  # --plan_only
            return
        fit(run)
        final_metrics, probe_results = finish(run)
        not_pushed = export_and_push(run, final_metrics, probe_results)
    except RuntimeError as error:
        if STOP.received or not cluster.is_peer_failure(error):
            raise  # a peer that left at a stop signal is a stop
        raise RunError(lost_peer_message(run, train_args, error)) from None
    if not_pushed:
        raise RunError(not_pushed)  # exit 1, as finetune.py: a push that was asked for and did not happen


def lost_peer_message(run: "Run | None", train_args, error: RuntimeError) -> str:
    """A collective another process broke (it froze past --ddp_timeout, or died):
    where the run stands, one line."""
    where = f" during step {run.progress.step + 1}" if run is not None else " before training started"
    newest = checkpoints.Layout(os.path.join(os.path.abspath(train_args.output_dir), "checkpoints")).newest()
    return cluster.lost_peer_message(
        error, train_args.ddp_timeout, where, newest and os.path.basename(newest)
    )


# ---------------------------------------------------------------------------------------------------- setup


def setup(model_args, data_args, train_args, explicit: frozenset = frozenset()) -> Run | None:
    """Every input checked, then the accelerator, the plan, the data, the model, its optimizer
    and schedule, and the resume (None: --plan_only, the plan printed)."""
    output_dir = os.path.abspath(train_args.output_dir)
    checkpoints_dir = os.path.join(output_dir, "checkpoints")
    model_config, sharded_by = check_inputs(model_args, data_args, train_args, output_dir)
    if plan_flags.wanted(data_args, explicit) and "mixed_precision" not in explicit:
        train_args.mixed_precision = planning.precision()  # before the accelerator, which fixes it
    accelerator, own_fsdp2 = start_accelerator(model_args, train_args, output_dir, model_config, sharded_by)
    cluster.check_shared_folder(output_dir, accelerator.num_processes, accelerator.is_main_process)
    set_seed(train_args.seed)

    threads = None  # a GPU run keeps torch's count: its threads only feed the GPU
    plan = None
    if plan_flags.wanted(data_args, explicit):
        plan, threads = make_plan(model_args, data_args, train_args, explicit, accelerator, checkpoints_dir)
        model_config = load_model_config(model_args)
        if train_args.plan_only:
            return None
    # One process decides (they might not all see the same folder), every process gets its answer.
    found = cluster.decided_by_main(accelerator, lambda: find_resume_point(
        model_args, data_args, train_args, accelerator, checkpoints_dir, model_config))
    # a checkpoint from the Hub is copied into checkpoints/step_N once the folder is claimed
    from_hub = found if isinstance(found, hub_checkpoint.HubCheckpoint) else None
    resume_dir = checkpoints.Layout(checkpoints_dir).path(from_hub.step) if from_hub else found
    if train_args.resume_from_checkpoint and resume_dir is None:
        accelerator.print(f"No intact checkpoint in {checkpoints_dir} yet: starting from scratch.")
    read_from = from_hub.folder if from_hub else resume_dir  # the checkpoint's files, wherever they are now
    if accelerator.device.type == "cpu" and (threads is None or from_hub or resume_dir):
        threads = set_threads(checkpoints.recorded_threads(read_from), accelerator.is_main_process,
                              accelerator.print)
    data_fingerprint = cluster.decided_by_main(accelerator, lambda: checked_data(data_args, read_from))
    tokenizer, packed, lock = prepare_data(
        model_args, data_args, train_args, accelerator, output_dir, resume_dir, model_config, explicit,
        from_hub,
    )
    max_train_steps, tokens_per_step = plan_steps(data_args, train_args, accelerator.num_processes)
    global_batch = tokens_per_step // data_args.block_size
    train_dataloader, eval_dataloader = make_dataloaders(packed, train_args, train_args.seed, global_batch)
    model, num_parameters = make_model(model_args, model_config, tokenizer, accelerator, own_fsdp2)
    clock = Clock(train_args.max_train_seconds, accelerator)
    optimizer = make_optimizer(model, train_args)
    lr_scheduler = make_schedule(optimizer, train_args, max_train_steps, accelerator.num_processes, clock)
    model, optimizer, train_dataloader, eval_dataloader, lr_scheduler = sharding.prepare(
        accelerator, own_fsdp2, model, optimizer, train_dataloader, eval_dataloader, lr_scheduler)
    if hasattr(packed.train, "__len__") and len(train_dataloader) == 0:
        raise UserInputError(
            f"Fewer training blocks ({len(packed.train)}) than one optimizer step takes ({global_batch}: "
            f"{train_args.per_device_train_batch_size} per process x {accelerator.num_processes} process(es) "
            f"x {train_args.gradient_accumulation_steps} accumulated); lower the batch size or add data."
        )
    # A token of None lets huggingface_hub find HF_TOKEN or the login cache; the pusher never shows it.
    pusher = (
        HubPusher(train_args.hub_model_id, token=train_args.hub_token, private=train_args.hub_private_repo)
        if train_args.push_to_hub and accelerator.is_main_process
        else None
    )
    run = Run(
        model_args=model_args, data_args=data_args, train_args=train_args, accelerator=accelerator,
        output_dir=output_dir, tokenizer=tokenizer, packed=packed, model=model, optimizer=optimizer,
        lr_scheduler=lr_scheduler, train_dataloader=train_dataloader, eval_dataloader=eval_dataloader,
        num_parameters=num_parameters, max_train_steps=max_train_steps, tokens_per_step=tokens_per_step,
        clock=clock, log=RunLog(output_dir, accelerator), pusher=pusher, lock=lock, own_fsdp2=own_fsdp2,
        data_fingerprint=data_fingerprint, threads=threads, plan=plan,
    )
    if resume_dir:
        try:
            resume(run, resume_dir)
        except UserInputError:  # a refused resume leaves the folder as it found it
            release_lock(lock, output_dir)
            raise
    run.log.start(run.progress.step)
    config = cards.flat_scalars(args_to_dict(model_args, data_args, train_args))
    accelerator.init_trackers("tinytx-pretrain", config=config)
    return run


def make_plan(model_args, data_args, train_args, explicit, accelerator, checkpoints_dir: str):
    """(the plan, the CPU threads set to measure with): a resume's recorded plan, else one made for this text,
    budget and machine; its flags applied, its line printed."""
    threads = None
    repo = hub_repo_id(train_args.hub_model_id, train_args.output_dir)
    plan = cluster.decided_by_main(accelerator, lambda: planning.recorded(
        train_args.resume_from_checkpoint, checkpoints_dir, repo, train_args.hub_token,
    )) if train_args.resume_from_checkpoint else None
    if plan is None:
        if accelerator.device.type == "cpu":  # measured with the threads the run trains with
            threads = set_threads(None, accelerator.is_main_process, accelerator.print)
        plan = cluster.decided_by_main(accelerator, lambda: planning.plan_run(
            model_args, data_args, train_args, explicit, accelerator.num_processes, accelerator.device))
    planning.apply(plan, explicit, model_args, data_args, train_args)
    accelerator.print(plan.line())
    return plan, threads


def check_inputs(model_args, data_args, train_args, output_dir: str):
    """The checks that need transformers or the model's config; returns (model
    config, the sharding asked for)."""
    check_schedule(train_args)  # the one flag check that needs transformers loaded
    refuse_lone_process()
    check_output_dir(output_dir, train_args)
    refuse_writing_where_read(model_args, output_dir)
    # before the data: a bad size should not wait for tokenization
    model_config = load_model_config(model_args)
    if data_args.block_size > model_config.max_position_embeddings:
        raise UserInputError(
            f"--block_size {data_args.block_size} is longer than the model's max_position_embeddings "
            f"({model_config.max_position_embeddings}); lower --block_size or raise "
            "--max_position_embeddings."
        )
    sharded_by = sharding.asked_sharding()
    train_args.optimizer = chosen_optimizer(train_args.optimizer, sharded_by)
    if train_args.optimizer == "muon" and sharded_by:
        raise UserInputError(
            f"--optimizer muon needs whole weight matrices on every process, which {sharded_by} does not "
            "keep; use --optimizer adamw, or Muon with one process or DDP."
        )
    return model_config, sharded_by


def find_resume_point(model_args, data_args, train_args, accelerator, checkpoints_dir: str, model_config):
    """The main process: the local checkpoint folder to resume from, a checked `HubCheckpoint`, or None."""
    args, processes = train_args, accelerator.num_processes
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * processes
    signature = checkpoints.make_run_signature(
        args, data_args.block_size, global_batch, processes, model_args)
    return hub_checkpoint.resume_point(
        args.resume_from_checkpoint, hub_repo_id(args.hub_model_id, args.output_dir),
        checkpoints.Layout(checkpoints_dir), args.hub_token,
        lambda folder: checkpoints.refuse_other_run(folder, signature, model_config), accelerator.print,
    )


def checked_data(data_args, resume_dir: str | None) -> dict:
    """The data's fingerprint (names, sizes and times of its files), refused before the data is prepared when
    it is not what the checkpoint to resume was trained on."""
    data = pretrain_data(data_args, DEFAULT_CORPUS_DOCUMENTS)
    if resume_dir:
        checkpoints.refuse_data_change(resume_dir, data, "or start a new run on this data from its weights "
                                       f"(--init_from {resume_dir} and another --output_dir)")
    return data


def start_accelerator(model_args, train_args, output_dir: str, model_config, sharded_by: str | None):
    """(Accelerator, whether distributed/sharding.py shards the model), checked
    against the batch and the model."""
    accelerator = Accelerator(
        **sharding.device_options(sharded_by, train_args.ddp_timeout),
        mixed_precision=train_args.mixed_precision,
        gradient_accumulation_steps=train_args.gradient_accumulation_steps,
        log_with=None if train_args.report_to == "none" else train_args.report_to.split(","),
        project_config=ProjectConfiguration(
            project_dir=output_dir, logging_dir=os.path.join(output_dir, "runs")
        ),
    )
    accelerator.print(f"{accelerator.num_processes} process(es) on {accelerator.device} "
                      f"({accelerator.distributed_type})")
    if (problem := cluster.check_process_count(accelerator.num_processes)):
        raise UserInputError(problem)
    if sharding.gpu_config_without_gpus():
        accelerator.print(
            "The Accelerate config asks for GPUs, but this machine has none: the processes train on its "
            "CPUs over gloo."
        )
    if accelerator.device.type == "cpu":
        bf16 = "--mixed_precision bf16" if train_args.mixed_precision == "bf16" else None
        cpu_memory.train_on_cpu(bf16, accelerator.print)
    own_fsdp2 = sharding.shards_itself(accelerator, sharded_by)
    apply_total_batch_size(train_args, accelerator.num_processes)
    # --total_batch_size sets it
    accelerator.gradient_accumulation_steps = train_args.gradient_accumulation_steps
    sharding.apply_flags_to_deepspeed_config(accelerator, train_args)
    check_model_builds(model_config, model_args.attn_implementation, accelerator.num_processes)
    return accelerator, own_fsdp2


def prepare_data(
    model_args, data_args, train_args, accelerator, output_dir, resume_dir, model_config, explicit,
    from_hub=None,
):
    """The tokenizer, the data prepared once by the main process for every process, and the
    output folder's lock, taken once every input has passed its checks. A start refused for its
    input takes back the folders it made. `from_hub`: the checked download to resume from, copied
    to `resume_dir` once the folder is claimed."""
    checkpoints_dir = os.path.join(output_dir, "checkpoints")
    own_tokenizer = os.path.join(checkpoints_dir, checkpoints.TOKENIZER_DIR)
    saved_tokenizer = from_hub.tokenizer if from_hub else own_tokenizer  # a resumed run reuses it
    store = token_store.store_folder(data_args, output_dir)
    made = [folders_to_create(folder) for folder in (store, output_dir)]
    fresh = accelerator.is_main_process and not resume_dir  # a fresh start makes (or finds) its own tokenizer
    handoff = Handoff(accelerator, output_dir, train_args.ddp_timeout)
    try:
        if accelerator.is_main_process:
            tokenizer, description, sources = prepare_as_main(
                model_args, data_args, train_args, handoff, store, saved_tokenizer, fresh, model_config,
                accelerator.print,
            )
        else:
            tokenizer, description, sources = receive_data(data_args, train_args, handoff, store)
        if description["kind"] == "stream":
            packed = packing.pack_streamed(
                sources, tokenizer, data_args, train_args.max_eval_tokens, train_args.seed
            )
        else:
            packed = packing.pack_fitted(
                packing.tokens(description, sources, tokenizer, data_args), data_args, train_args,
                accelerator.num_processes, explicit, say=accelerator.print,
            )
        handoff.close()
    except BaseException as error:
        if accelerator.is_main_process:
            take_back(handoff, store, made, refused=isinstance(error, UserInputError))
        raise
    lock = None
    if accelerator.is_main_process:  # every input check has passed
        lock = claim(output_dir, checkpoints_dir, replace=train_args.overwrite_output_dir and not resume_dir)
        if from_hub:
            hub_checkpoint.keep_locally(from_hub, resume_dir, os.path.join(output_dir, "metrics.jsonl"))
        if fresh or from_hub or not os.path.isdir(own_tokenizer):
            checkpoints.save_tokenizer(tokenizer, checkpoints_dir)
    accelerator.wait_for_everyone()
    if hasattr(packed.train, "__len__"):
        accelerator.print(f"{len(packed.train):,} training and {len(packed.validation):,} validation blocks "
                          f"of {data_args.block_size} tokens; {packed.bytes_per_token:.2f} bytes/token")
    return tokenizer, packed, lock


def resume(run: Run, folder: str) -> None:
    """Continues from the checkpoint in `folder`: weights, optimizer, schedule, RNG,
    step, place in the data, clock."""
    deepspeed = sharding.zero_stage(run.accelerator) is not None
    checkpoints.refuse_architecture_change(
        folder,
        run.accelerator.unwrap_model(run.model).config,
        "resume with the sizes it was started with (the same --model_config and size flags), or start a "
        "new run (another --output_dir, or --overwrite_output_dir)",
    )
    state = checkpoints.load_state(
        folder, run.accelerator, run.signature, (run.model, run.optimizer, run.lr_scheduler), run.own_fsdp2,
        deepspeed_engine=run.model if deepspeed else None,
    )
    progress = run.progress
    progress.step = progress.saved_step = state.step
    # The checkpoint's run may have had other processes and accumulation, but every
    # step reads the same global batch.
    steps_into_epoch = state.batch_in_epoch // state.run_signature["gradient_accumulation_steps"]
    progress.epoch = state.epoch
    progress.batch_in_epoch = steps_into_epoch * run.train_args.gradient_accumulation_steps
    # where `accumulate` counts to its next optimizer step from
    run.accelerator.step = progress.batch_in_epoch
    progress.earlier_seconds, progress.launches = state.trained_seconds, state.launches + 1
    # Planned in seconds, the schedule goes on with the seconds left; next to a step count the clock
    # bounds each launch, like a job's time slot.
    if run.max_train_steps is None:
        run.clock.resume_at(state.train_seconds)
    if run.accelerator.is_main_process:
        checkpoints.set_aside_after(run.layout, progress.step, run.accelerator.print)
    run.accelerator.wait_for_everyone()
    written_by = state.run_signature["num_processes"]
    elsewhere = f" (written by {written_by} process(es), now {run.accelerator.num_processes})" \
        if written_by != run.accelerator.num_processes else ""
    run.accelerator.print(f"Resumed from {folder} at step {progress.step}{elsewhere}")


def training_state(run: Run) -> checkpoints.TrainingState:
    """What the next checkpoint records of the run (`resume` reads it back)."""
    progress = run.progress
    return checkpoints.TrainingState(
        step=progress.step, epoch=progress.epoch, batch_in_epoch=progress.batch_in_epoch,
        run_signature=run.signature, planned_steps=run.max_train_steps, train_seconds=run.clock.seconds,
        trained_seconds=progress.earlier_seconds + progress.train_seconds, launches=progress.launches,
        torch_threads=run.threads, plan=run.plan and run.plan.to_dict(),
    )


# ---------------------------------------------------------------------------------------------------- fit


def fit(run: Run) -> None:
    """Optimizer steps until --max_train_steps (or the clock the user set),
    evaluating and checkpointing on the way."""
    progress, args = run.progress, run.train_args
    announce_plan(run)
    # The main process draws the bar, on a terminal only (disable=None); in a log
    # file `log_step` prints lines.
    bar = tqdm(total=run.max_train_steps, initial=progress.step, desc="train",
               disable=None if run.accelerator.is_main_process else True)
    planned = run.max_train_steps or args.eval_steps * 20  # planned in seconds: a line every --eval_steps
    pace = Pace(
        time.perf_counter(), first_step=progress.step, line_every=max(1, min(args.eval_steps, planned // 20))
    )
    batches = micro_batches(run)
    # the machine's cores
    on_cpu = run.accelerator.device.type == "cpu" and run.accelerator.is_local_main_process
    busy = BusyCores(torch.get_num_threads()) if on_cpu else None
    run.model.train()
    STOP.training()  # a signal from now on is honoured at the next step boundary, with a checkpoint
    try:  # the bar is closed even when a fault stops the run, so the error line stands on its own
        while not training_done(run):
            loss, stop_signal = train_step(run, batches)
            progress.step += 1
            # one reading for the clock, the log, the checkpoint
            seconds = progress.train_seconds = pace.seconds()
            if run.clock.budget:  # every process reads the same clock: same learning rate, same last step
                run.clock.read(seconds)
            log_step(run, loss, pace, seconds, bar)
            if busy and (line := busy.notice(PROGRAM)):
                bar.write(line)
            if stop_signal is not None:  # before an evaluation: a preempted job has seconds, not minutes
                stop_for_signal(run, stop_signal)
            more = steps_left(run) != 0  # after the last step `finish` evaluates and saves
            if more and progress.step % args.eval_steps == 0:
                log_evaluation(run, bar)
            if more and args.checkpointing_steps and progress.step % args.checkpointing_steps == 0:
                save_checkpoint(run)
    finally:
        bar.close()
    progress.train_seconds = pace.seconds()
    progress.stopped_by_clock = run.clock.ran_out and bool(steps_left(run))
    if run.own_fsdp2 or sharding.zero_stage(run.accelerator) is not None:  # every process says what it holds
        print_own(sharding.shard_report(run.model, run.optimizer, run.accelerator))


@dataclass
class Pace:
    """This launch's time in `fit`, and the step it started from: tokens per
    second are this launch's alone."""

    started: float  # time.perf_counter() when `fit` began
    first_step: int
    line_every: int  # steps between two progress lines where no bar is drawn: about 20 a run

    def seconds(self) -> float:
        return time.perf_counter() - self.started


def train_step(run: Run, batches) -> tuple[float, int | None]:
    """One optimizer step over its micro-batches. Returns the step's mean loss over every process's
    targets and the stop signal any process got."""
    accelerator, model, args = run.accelerator, run.model, run.train_args
    summed_loss, targets = torch.zeros((), device=accelerator.device), 0  # loss x targets, read back once
    for batch in batches:
        with accelerator.accumulate(model):
            # Labels are the inputs: the model shifts them by one position to score each next token.
            loss = model(input_ids=batch["input_ids"], labels=batch["input_ids"]).loss
            accelerator.backward(loss)
            # all but each block's first
            batch_targets = batch["input_ids"].numel() - batch["input_ids"].shape[0]
            summed_loss, targets = (
                summed_loss + loss.detach().float() * batch_targets, targets + batch_targets,
            )
            step_ends = accelerator.sync_gradients
            if step_ends:
                # Clipping at inf only measures: a non-finite norm must stop the run
                # before it reaches the weights.
                norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm or math.inf)
                read_back = read_step(run, summed_loss, targets, norm)
            run.optimizer.step()
            run.lr_scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
        run.progress.batch_in_epoch += 1
        if step_ends:
            return read_back
    raise AssertionError("micro_batches never ends")


def micro_batches(run: Run):
    """Every micro-batch from where the run stands: the rest of the current epoch, then epoch after epoch."""
    while True:
        yield from epoch_batches(run)
        run.progress.epoch, run.progress.batch_in_epoch = run.progress.epoch + 1, 0


def epoch_batches(run: Run):
    """The current epoch's batches in its (seed, epoch) order, without those a resumed run
    already trained on. The loader counts epochs from 0 in every launch: told the run's, a
    resumed run reads each epoch as the first did."""
    run.train_dataloader.set_epoch(run.progress.epoch)  # skip_first_batches copies it
    if run.progress.batch_in_epoch:
        return run.accelerator.skip_first_batches(run.train_dataloader, run.progress.batch_in_epoch)
    return run.train_dataloader


def read_step(run: Run, summed_loss: torch.Tensor, targets: int, norm) -> tuple[float, int | None]:
    """(loss, stop signal or None), read back in one all-reduce with every process's stop signals, so that all
    stop after the same step; a non-finite loss or gradient norm stops the run."""
    norm = 0.0 if norm is None else norm  # DeepSpeed: a float (None: not measured)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP2: a replicated DTensor
    device = summed_loss.device
    summed = torch.cat([summed_loss.view(1), torch.tensor([float(targets), *STOP.counts()], device=device)])
    if run.accelerator.num_processes > 1:
        torch.distributed.all_reduce(summed)
    values = torch.cat([summed, torch.as_tensor(norm, device=device).float().view(1)]).tolist()
    loss_value, norm_value = values[0] / values[1], values[-1]
    for what, value in (("training loss", loss_value), ("gradient norm", norm_value)):
        if not math.isfinite(value):
            raise RunError(nonfinite_message(run, f"the {what} is {value}"))
    return loss_value, signal_of(values[2:-1])


def nonfinite_message(run: Run, what: str) -> str:
    newest = run.layout.newest()
    intact = f"checkpoint {os.path.basename(newest)} is intact" if newest else "no checkpoint was saved"
    return (f"Stopped at step {run.progress.step + 1}: {what}, so the weights would turn to NaN; nothing was "
            f"exported and {intact}. Lower --learning_rate (now {run.train_args.learning_rate}) or keep "
            f"--max_grad_norm on.")


def announce_plan(run: Run) -> None:
    args = run.train_args
    if run.max_train_steps is None:
        run.accelerator.print(
            f"Training for {args.max_train_seconds:g} s in steps of {run.tokens_per_step:,} tokens (the "
            f"{args.lr_scheduler_type} learning-rate schedule runs on the clock)"
        )
    else:
        clock = f", at most {args.max_train_seconds:g} s" if args.max_train_seconds else ""
        read = ""
        if hasattr(run.packed.train, "__len__"):  # a fact, no advice: validation says when it is too many
            global_batch = run.tokens_per_step // run.data_args.block_size
            times = passes(run.max_train_steps, global_batch, len(run.packed.train))
            read = f", {times:.1f} passes over the training text"
        run.accelerator.print(f"Training for {run.max_train_steps} steps of {run.tokens_per_step:,} tokens "
                              f"({run.max_train_steps * run.tokens_per_step:,} tokens{read}){clock}")


def training_done(run: Run) -> bool:
    return run.clock.ran_out or steps_left(run) == 0


def steps_left(run: Run) -> int | None:
    """Optimizer steps still planned (None: the clock decides)."""
    return None if run.max_train_steps is None else max(0, run.max_train_steps - run.progress.step)


def log_step(run: Run, loss: float, pace: Pace, elapsed: float, bar) -> None:
    """The step just counted, `elapsed` seconds into this launch, to metrics.jsonl and the progress bar."""
    step = run.progress.step
    tokens_per_second = (step - pace.first_step) * run.tokens_per_step / elapsed
    run.log.log({"step": step, "loss": round(loss, 5), "lr": run.lr_scheduler.get_last_lr()[0],
                 "tokens": step * run.tokens_per_step, "tokens_per_second": round(tokens_per_second),
                 "elapsed_seconds": round(run.progress.earlier_seconds + elapsed, 2)})
    bar.update(1)
    bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{tokens_per_second:,.0f}")
    first = step == pace.first_step + 1
    if bar.disable and run.accelerator.is_main_process and (first or step % pace.line_every == 0):
        planned = run.max_train_steps
        done = f"{100 * step / planned:3.0f}% | {step}/{planned}" if planned else f"{step}"
        run.accelerator.print(f"train: {done} steps, loss {loss:.4f}, {tokens_per_second:,.0f} tokens/s, "
                              f"{elapsed:.1f} s", flush=True)


def log_evaluation(run: Run, bar) -> None:
    metrics = evaluate(run)
    run.log.log({"step": run.progress.step, **metrics})
    bar.write(f"step {run.progress.step}: " + ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v:.4f}"
                                                        for k, v in metrics.items()))
    if run.accelerator.is_main_process and (line := learning_by_heart(run)):
        bar.write(line)


def learning_by_heart(run: Run) -> str | None:
    """memorising.py's warning when this evaluation is the first whose validation loss says so (the
    evaluations of earlier launches count: metrics.jsonl keeps them)."""
    evaluations = [(row["step"], row["eval_loss"]) for row in run.log.rows if "eval_loss" in row]
    data = run.data_args
    more = ("a larger --train_file" if data.train_file else "a larger dataset" if data.dataset_name
            else "more documents (--num_train_documents)")
    return memorising_warning(evaluations, run.train_args.num_warmup_steps, more)


def save_checkpoint(run: Run, push: bool = True) -> None:
    """checkpoints/step_N (every process takes part); with --push_to_hub also queued for the Hub as
    --hub_strategy says: a model folder (every_save), the checkpoint whole (checkpoint, all_checkpoints)."""
    checkpoints.save_state(
        run.accelerator, run.checkpoints_dir, training_state(run), run.train_args.checkpoints_total_limit,
        run.sharded, model_config=run.accelerator.unwrap_model(run.model).config, data=run.data_fingerprint,
    )
    run.progress.saved_step = run.progress.step
    strategy = run.train_args.hub_strategy
    if not (run.train_args.push_to_hub and push) or strategy == "end":
        return
    if strategy in hub_checkpoint.WHOLE:
        if run.pusher is not None:  # the checkpoint as saved, optimizer and all
            step, tokenizer = run.progress.step, os.path.join(run.checkpoints_dir, checkpoints.TOKENIZER_DIR)
            hub_checkpoint.push_whole(run.pusher, run.layout.path(step), step, strategy == "all_checkpoints",
                                      tokenizer, run.log.path)
        return
    to_save = sharding.gather_for_saving(run.accelerator, run.model, run.own_fsdp2)
    if run.pusher is not None:
        export.push_checkpoint(run.pusher, *to_save, run.tokenizer, run.log, run.checkpoints_dir,
                               run.progress.step, cards.training_record(run))


def stop_for_signal(run: Run, signum: int) -> None:
    """Every process, at the same step boundary: the checkpoint, then `Stopped`, exporting nothing. Pushed
    only whole (--hub_strategy checkpoint), within --hub_stop_timeout: a preempted job has seconds, and the
    Hub is then all that is left of a machine that goes away."""
    whole = run.train_args.hub_strategy in hub_checkpoint.WHOLE
    if run.progress.saved_step != run.progress.step:
        save_checkpoint(run, push=whole)
    if whole and run.accelerator.is_main_process:
        hub_checkpoint.wait_at_stop(run.pusher, run.train_args.hub_stop_timeout, STOP.received,
                                    run.progress.step, run.accelerator.print)
    run.accelerator.wait_for_everyone()  # none leaves first: the launcher would end the rest
    run.accelerator.end_training()  # the trackers' files closed
    raise Stopped(stop_message(PROGRAM, signum, run.progress.step, run.max_train_steps,
                               f"step_{run.progress.step}"), signum)


def stop_if_asked(run: Run) -> None:
    """Outside the training loop: a stop signal any process got."""
    signum = STOP.asked(run.accelerator)
    if signum is not None:
        stop_for_signal(run, signum)


# ---------------------------------------------------------------------------------------------------- finish


def finish(run: Run) -> tuple[dict, "ProbeReport"]:
    """The final checkpoint (so the export can always be redone), the final evaluation, probes and samples."""
    accelerator, progress = run.accelerator, run.progress
    if progress.stopped_by_clock:
        accelerator.print(f"Stopped by the clock at step {progress.step} of {run.max_train_steps} planned "
                          f"(--max_train_seconds {run.train_args.max_train_seconds:g}).")
    if progress.saved_step != progress.step:
        save_checkpoint(run)
    stop_if_asked(run)
    metrics = evaluate(run)
    clock = (
        {"stopped_by_clock": True, "planned_steps": run.max_train_steps} if progress.stopped_by_clock else {}
    )
    memory = sharding.peak_gpu_memory(accelerator)
    run.log.log({"step": progress.step, **metrics, **clock, **memory, "final": True})
    accelerator.print(
        f"validation: loss {metrics['eval_loss']:.4f}, perplexity {metrics['perplexity']:.2f}, "
        f"{metrics['bits_per_byte']:.4f} bits/byte ({progress.train_seconds:.1f} s of training)"
        + (f"; peak GPU memory {memory['peak_gpu_memory_gib']:.2f} GiB" if memory else "")
    )
    if accelerator.is_main_process and (line := learning_by_heart(run)):
        accelerator.print(line)
    probe_results = ProbeReport()
    sharded = run.own_fsdp2 or sharding.zero_stage(accelerator) == 3
    if accelerator.is_main_process or sharded:  # a sharded model's forward needs every process
        # Eagerly, under --torch_compile too: probes and samples come in many shapes,
        # each of which would compile again.
        with torch.compiler.set_stance("force_eager"):
            prompts = own_text_prompts(
                run.data_args, run.packed.validation, run.tokenizer, run.train_args.num_samples
            )
            probe_results = run_probes_and_samples(accelerator.unwrap_model(run.model), run.tokenizer,
                                                   run.train_args, accelerator, prompts)
        if probe_results.accuracy:
            run.log.log(
                {
                    "step": progress.step, **{f"probe_{k}": v for k, v in probe_results.accuracy.items()},
                    "final": True,
                }
            )
    return metrics, probe_results


def evaluate(run: Run) -> dict:
    return validation_metrics(run.model, run.eval_dataloader, run.accelerator, run.packed.bytes_per_token)


# ---------------------------------------------------------------------------------------------------- export


def export_and_push(run: Run, final_metrics: dict, probe_results: "ProbeReport") -> str | None:
    """The model folder first (complete on disk), then the Hub. Returns None, or the line saying that the
    final model was not pushed (raised by `pretrain` once every process is past the barrier)."""
    accelerator = run.accelerator
    # a signal during the evaluation or the probes: the checkpoint is saved, the export waits
    stop_if_asked(run)
    to_save = sharding.gather_for_saving(run.accelerator, run.model, run.own_fsdp2)
    not_pushed = None
    if accelerator.is_main_process:
        card = cards.pretrained_card(cards.card_context(run, final_metrics, probe_results))
        names = export.export_final(
            run.output_dir, run.checkpoints_dir, *to_save, run.tokenizer, card, run.log.rows,
            cards.training_record(run), probe_results.coref_head,
        )
        accelerator.print(f"Model folder: {run.output_dir}")
        try:
            if run.pusher is not None:
                # The exported files only: not the checkpoints, nor anything else in the folder.
                not_pushed = push_final(
                    run.pusher, run.output_dir, [*names, "metrics.jsonl"],
                    f"TinyTx pre-trained for {run.progress.step} steps", "final model",
                    run.train_args.hub_timeout, exclude=("checkpoints/*", ".*"), stop=STOP,
                    say=accelerator.print,
                )
        finally:
            # the folder is complete, also when a signal ended the push
            release_lock(run.lock, run.output_dir)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return not_pushed
