"""The Trainer callbacks finetune.py runs with: each checkpoint moved into checkpoints/ whole
(`CheckpointsAside`), and a stop signal honoured at a step's end with a checkpoint (`StopAtStepEnd`)."""

import os

from accelerate import PartialState
from transformers import TrainerCallback

from hf_tinytx_training import checkpoints
from hf_tinytx_training.distributed.preemption import StopRequests
from hf_tinytx_training.publish.hub_checkpoint import push_whole


CHECKPOINT = "checkpoint-"  # Trainer's names, checkpoints/checkpoint-N (pretrain's are step_N)
# In checkpoints/: Trainer writes checkpoint-N here, CheckpointsAside renames it into place
CHECKPOINT_STAGING = f"{checkpoints.TEMPORARY_PREFIX}checkpoint"
# Flags whose values Trainer's optimizer.pt and scheduler.pt hold, so a resume must keep them.
OPTIMIZER_FLAGS = ("optim", "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon")
OPTIMIZER_FLAGS_FILE = "optimizer_flags.json"  # beside Trainer's files in each checkpoint


def optimizer_flags(training_args) -> dict:
    return {flag: str(getattr(getattr(training_args, flag), "value", getattr(training_args, flag)))
            for flag in OPTIMIZER_FLAGS}


class CheckpointsAside(TrainerCallback):
    """Each checkpoint-N Trainer wrote into the staging folder is checksummed and renamed into
    checkpoints/ whole; then the oldest beyond --save_total_limit go. `where`:
    finetune.Destinations; `data` and the CPU `threads` (None on a GPU): written into each; `pusher`: takes
    each to the Hub whole."""

    def __init__(self, where, resumed: str | None, data: dict, threads: int | None = None, pusher=None):
        self.where, self.resumed, self.data, self.threads, self.pusher = where, resumed, data, threads, pusher
        # the newest checkpoint's (step, folder), the same on every process
        self.saved: tuple[int, str] | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if self.resumed:  # the state is the checkpoint's by now
            self.saved = (state.global_step, self.resumed)

    def on_save(self, args, state, control, **kwargs):
        PartialState().wait_for_everyone()  # every process has written its part (its RNG state)
        if state.is_world_process_zero:
            self.move_in(args, state)
        PartialState().wait_for_everyone()
        self.saved = (state.global_step, self.final_folder(state))

    def final_folder(self, state) -> str:
        return self.where.layout.path(state.global_step)

    def move_in(self, args, state) -> None:
        final = self.final_folder(state)
        written = os.path.join(self.where.checkpoint_staging, os.path.basename(final))
        # Trainer recorded where it wrote: a resume must find it here
        if state.best_model_checkpoint == written:
            state.best_model_checkpoint = final
            state.save_to_json(os.path.join(written, checkpoints.STATE_FILE))
        checkpoints.write_json(os.path.join(written, OPTIMIZER_FLAGS_FILE), optimizer_flags(args))
        checkpoints.write_json(os.path.join(written, checkpoints.DATA_FILE), self.data)
        if self.threads is not None:  # a resume keeps them: another count trains other weights
            threads = {"torch_threads": self.threads}
            checkpoints.write_json(os.path.join(written, checkpoints.THREADS_FILE), threads)
        checkpoints.write_json(
            os.path.join(written, checkpoints.CHECKSUM_FILE), checkpoints.checksums(written)
        )
        checkpoints.rename_into_place(written, final)
        if self.pusher is not None:  # before the prune: keeping one checkpoint must not lose this one
            push_whole(self.pusher, final, state.global_step, self.where.hub_strategy == "all_checkpoints")
        checkpoints.prune(self.where.layout, self.where.keep_checkpoints)


class StopAtStepEnd(TrainerCallback):
    """A stop signal honoured when a step ends: a checkpoint, then a stop, every process at the same step
    (Trainer's --enable_jit_checkpoint saves mid-step and reports a finished run)."""

    def __init__(self, accelerator, stop: StopRequests):
        self.accelerator, self.stop = accelerator, stop

    def on_step_end(self, args, state, control, **kwargs):
        if self.stop.asked(self.accelerator) is not None:  # one all-reduce on a launch: the processes agree
            control.should_save = control.should_training_stop = True
        return control
