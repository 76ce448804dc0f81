"""`python -m hf_tinytx_training.distributed TORCHRUN_FLAGS`: torchrun for one node of a scheduler's
job, whose exit status a job script can act on. training/configs/slurm.sbatch and
kubernetes-job.yaml run it on every node.

    0            the run finished
    128 + signal every training process of this node stopped at SIGTERM (143) or SIGINT (130): at a step
                 boundary, with a checkpoint, or before training started, with nothing to save. A scheduler
                 may requeue it.
    1            anything else, with torchrun's own report: a crash, bad input, a lost or frozen peer.

A training process still running --shutdown_timeout seconds (torchrun's flag; 30 by default) after the stop
signal is killed (SIGKILL), and the node exits 128 + the signal all the same: a scheduler's grace period
ends with the launcher gone, never with a worker left behind.

torchrun exits 1 for a stop too, and a SIGTERM reaches it also when srun ends the step because another node
failed: only the workers' statuses tell the two apart. So torchrun's agent runs in a thread, and this process
takes the stop signals, passes them on to the node's training processes and reads how they ended.
"""

import logging
import os
import re
import signal
import sys
import threading
import time

from hf_tinytx.commands.exits import say
from hf_tinytx.commands.signals import STOP_SIGNALS, Forwarder
from hf_tinytx_training.distributed.cluster import running_children


class LeaveOutMisleadingLines(logging.Filter):
    """torchrun lines wrong here: that it could not take the stop signals, and a
    worker's stop called a failure."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (
            "Failed to register signal handlers" in text or re.search(r"failed \(exitcode: 1(43|30)\)", text)
        )


def stop_status(failures) -> int | None:
    """128 + the stop signal when every failed worker stopped at it (or was
    ended by it: -signal), else None."""
    statuses = {
        128 - code if code < 0 else code for code in (failure.exitcode for failure in failures.values())
    }
    stops = {128 + signum for signum in STOP_SIGNALS}
    return statuses.pop() if len(statuses) == 1 and statuses <= stops else None


DEFAULT_SHUTDOWN_TIMEOUT = 30  # torchrun's own, when --shutdown_timeout is not given


def kill_after_grace(passing: Forwarder, since: float | None, grace: float) -> tuple[float | None, bool]:
    """(when the stop signal came, whether the workers were killed now): past `grace` seconds after it,
    every training process still running gets SIGKILL."""
    if passing.first is None:
        return since, False
    since = since if since is not None else time.monotonic()
    if time.monotonic() - since < grace:
        return since, False
    left = running_children(os.getpid())
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    say(f"hf_tinytx_training.distributed: {len(left)} training process(es) still running {grace:g} s after "
        f"{signal.Signals(passing.first).name} were killed (SIGKILL); raise --shutdown_timeout if a step "
        "and a checkpoint take longer.")
    return since, True


def launch_node(argv: list[str]) -> int:
    """torchrun with `argv`; returns the exit status above, or raises torchrun's failure."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    outcome = {}
    grace = parse_args(argv).shutdown_timeout
    grace = DEFAULT_SHUTDOWN_TIMEOUT if grace is None else grace

    def agent():  # in a thread, torchrun installs no signal handlers of its own
        try:
            run(parse_args(argv))
        except BaseException as error:  # handed to the main thread as it is
            outcome["error"] = error

    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(LeaveOutMisleadingLines())
    passing = Forwarder(lambda: running_children(os.getpid())).install()  # the node's training processes
    thread = threading.Thread(target=agent, name="torchrun-agent", daemon=True)
    thread.start()
    since, killed = None, False
    while thread.is_alive():
        thread.join(0.2)
        passing.forward()  # workers started after the signal get it too
        if not killed:
            since, killed = kill_after_grace(passing, since, grace)
    if killed:
        return 128 + passing.first
    error = outcome.get("error")
    if error is None:
        return 0
    if isinstance(error, ChildFailedError) and (status := stop_status(error.failures)) is not None:
        return status
    raise error


def main() -> int:
    from torch.distributed.elastic.multiprocessing.errors import record

    return record(launch_node)(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
