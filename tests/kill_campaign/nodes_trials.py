"""The kill campaign's trials of training/pretrain.py on two simulated nodes (__main__.py explains the
design): two `torchrun --nnodes 2 --rdzv-backend c10d` launches, a node's fault once a checkpoint is written
(worker or agent killed, worker frozen), the seconds until every process is gone, then resumes on 1 process or
2 nodes until the run ends, bit for bit equal to one process with the same --total_batch_size."""

import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers.cluster_runs import free_port
from tests.helpers.faults import PRETRAIN
from tests.helpers.processes import alive, descendants, workers_under
from tests.helpers.tiny import TINY_PRETRAIN_ARGS
from tests.kill_campaign.common import (
    MAX_RERUNS,
    notes_kept,
    row,
    run_process,
    same_weights,
    say,
    write_notes,
)


STEPS, EVERY = 40, 5
FLAGS = [
    *TINY_PRETRAIN_ARGS, "--num_train_documents", "100", "--total_batch_size", "16",
    "--max_train_steps", str(STEPS), "--checkpointing_steps", str(EVERY), "--eval_steps", "1000",
    "--num_probes_per_kind", "0", "--num_samples", "0", "--ddp_timeout", "10",
]
FAULTS = ("kill worker", "kill agent", "freeze worker")
# seconds from a fault to every process gone: --ddp_timeout, torchrun's restart and its join timeout
BOUND = 90
JOIN_TIMEOUT = 30  # --rdzv-conf join_timeout: how long a restarted node waits for one that is gone
TRAINING_LINE = "Training for "  # printed by each node's first process once the run trains
# printed by each node's first process: the group's size
GROUP_LINE = re.compile(r"^(\d+) process\(es\) on", re.M)


def torchrun(port: int, run_id: str, max_restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", f"join_timeout={JOIN_TIMEOUT}", "--max-restarts", str(max_restarts),
    ]


def fewer_than(launched: int, outputs: list[str]) -> bool:
    """Whether a node trained in a process group smaller than the launch."""
    return any(TRAINING_LINE in output and [int(n) for n in GROUP_LINE.findall(output)][-1:] != [launched]
               for output in outputs if launched > 1)


class Nodes:
    name = "nodes"

    def __init__(self, folder: Path, env: dict, quick: bool, trials: int, seed: int):
        self.folder, self.env, self.quick, self.trials, self.seed = folder / "nodes", env, quick, trials, seed
        self.folder.mkdir()
        self.env = {**env, "OMP_NUM_THREADS": "1"}
        self.reference = {}

    def command(self) -> list[str]:
        return ["torchrun", "--nnodes", "2", "--rdzv-backend", "c10d", "...", "training/pretrain.py", *FLAGS,
                "--resume_from_checkpoint", "latest"]

    def prepare(self) -> None:
        output_dir = self.folder / "reference"
        result = run_process(
            [sys.executable, str(PRETRAIN), *FLAGS, "--output_dir", str(output_dir)], self.env, self.folder
        )
        if result.returncode != 0:
            sys.exit(f"kill_campaign: the two-node reference run failed:\n{result.stderr[-3000:]}")
        self.reference = {"seconds": result.seconds, "output_dir": output_dir}
        say(f"nodes reference (1 process): {result.seconds:.1f} s")

    def plans(self) -> list[dict]:
        rng = random.Random(f"{self.seed}-nodes")
        return [{"trial": index + 1, "command": self.name, "config": f"{index // 3 % 2} restart",
                 "kind": FAULTS[index % 3], "max_restarts": index // 3 % 2, "node": rng.randint(0, 1),
                 "after_step": EVERY * rng.randint(1, STEPS // EVERY - 2), "delay": rng.uniform(0, 1.0),
                 "resume_on": [rng.choice((1, 2)) for _ in range(MAX_RERUNS)]}
                for index in range(self.trials)]

    def launch(self, output_dir: Path, max_restarts: int) -> list[subprocess.Popen]:
        port, run_id = free_port(), f"campaign{time.monotonic_ns()}"
        command = [
            *torchrun(port, run_id, max_restarts), str(PRETRAIN), *FLAGS, "--output_dir", str(output_dir),
            "--resume_from_checkpoint", "latest",
        ]
        return [
            subprocess.Popen(
                command, env=self.env, cwd=self.folder, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, start_new_session=True,
            )
            for _ in range(2)
        ]

    def fault(self, plan: dict, nodes: list, output_dir: Path) -> tuple[float | None, list[int], list[int]]:
        """Waits for the planned checkpoint, then injects the fault into one node: the moment it struck (None:
        the run ended first), the workers of both nodes then, and the processes frozen."""
        checkpoint = output_dir / "checkpoints" / f"step_{plan['after_step']}"
        while not checkpoint.exists():
            if any(node.poll() is not None for node in nodes):
                return None, [], []
            time.sleep(0.05)
        time.sleep(plan["delay"])
        node = nodes[plan["node"]]
        every, mine = [p for other in nodes for p in workers_under(other.pid)], workers_under(node.pid)
        targets = [node.pid] if plan["kind"] == "kill agent" else mine
        if not mine or node.poll() is not None:
            return None, every, []
        for pid in targets:
            os.kill(pid, signal.SIGSTOP if plan["kind"] == "freeze worker" else signal.SIGKILL)
        return time.monotonic(), every, mine if plan["kind"] == "freeze worker" else []

    def end_of(self, plan: dict, nodes: list, struck: float | None, pids: list[int], frozen: list[int]):
        """Outputs of both launches, the seconds from the fault until every process but the frozen ones was
        gone, and whether that took past BOUND (a hang: everything is then killed)."""
        frozen_node = nodes[plan["node"]] if frozen else None
        deadline = (struck or time.monotonic()) + (BOUND if struck else 600)

        def running():
            return any(node.poll() is None for node in nodes if node is not frozen_node) or \
                any(alive(pid) for pid in pids if pid not in frozen)

        while running() and time.monotonic() < deadline:
            time.sleep(0.1)
        hung, gone = running(), time.monotonic()
        for pid in [
            *pids, *(p for node in nodes for p in descendants(node.pid)), *(node.pid for node in nodes),
        ]:
            try:  # the frozen node goes once the others have ended, as a scheduler's job step would
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        outputs = [node.communicate()[0] for node in nodes]
        return outputs, (gone - struck) if struck else None, hung

    def rerun(self, processes: int, output_dir: Path, max_restarts: int):
        if processes == 1:
            result = subprocess.run([sys.executable, str(PRETRAIN), *FLAGS, "--output_dir", str(output_dir),
                                     "--resume_from_checkpoint", "latest"], env=self.env, cwd=self.folder,
                                    capture_output=True, text=True, timeout=600)
            return result.returncode, [result.stdout + result.stderr]
        nodes = self.launch(output_dir, max_restarts)
        outputs = [node.communicate(timeout=600)[0] for node in nodes]
        return max(abs(node.returncode) for node in nodes), outputs

    def run_trial(self, plan: dict) -> dict:
        started, output_dir = time.monotonic(), self.folder / f"trial_{plan['trial']:02d}"
        write_notes(output_dir)
        nodes = self.launch(output_dir, plan["max_restarts"])
        struck, pids, frozen = self.fault(plan, nodes, output_dir)
        outputs, seconds, hung = self.end_of(plan, nodes, struck, pids, frozen)
        codes = [node.returncode for node in nodes]
        for index, output in enumerate(outputs):  # what each node printed, to look into with --keep
            (self.folder / f"trial_{plan['trial']:02d}_node{index}.log").write_text(output)
        split = [fewer_than(2, outputs)]
        moment = f"{plan['kind']} n{plan['node']} after step_{plan['after_step']}" + \
            (f", all gone {seconds:.0f} s" if seconds is not None else " (not reached)")
        done_by_itself = all(code == 0 for code in codes) and not hung
        reruns, code, resumed_on = 0, 0 if done_by_itself else 1, []
        while code != 0 and reruns < MAX_RERUNS:
            processes = plan["resume_on"][reruns]
            code, rerun_outputs = self.rerun(processes, output_dir, plan["max_restarts"])
            split.append(fewer_than(processes, rerun_outputs))
            resumed_on.append(str(processes))
            reruns += 1
        equal = code == 0 and same_weights(self.reference["output_dir"] / "model.safetensors",
                                           output_dir / "model.safetensors")
        lost = not notes_kept(output_dir)
        error = (("HUNG past the bound; " if hung else "")
                 + ("TRAINED WITH FEWER PROCESSES THAN LAUNCHED; " if any(split) else ""))
        if not equal:
            error += f"the final model differs, or no run exited 0 (last exit {code})"
        return row(plan, moment=moment, killed=struck is not None, first_exit=max(codes, key=abs),
                   after_kill=[f"on {'+'.join(resumed_on) or '-'}"], reruns=reruns, resumed_from="latest",
                   exit=code, equal=equal, lost=lost, error=error or None, hung=hung, split=any(split),
                   seconds_to_gone=None if seconds is None else round(seconds, 1),
                   seconds=round(time.monotonic() - started, 1))

    def summary(self) -> dict:
        return {"reference_seconds": {"1 process": round(self.reference["seconds"], 2)}, "steps": STEPS,
                "command": self.command(), "bound_seconds": BOUND}
