"""A real SLURM cluster on this host: munged, slurmctld and two slurmd (nodes n1 and n2 at 127.0.0.1), on a
throw-away config in a temporary folder (found through SLURM_CONF; the host's own setup is never read),
stopped by their PIDs. Where Debian's packages are missing, `require_slurm` skips, naming the install command
(under TINYTX_CI=1 it installs them, or fails).

The config: no cgroups (proctrack/linuxproc, task/none), 4 CPUs a node whatever the host has,
CPUs as the unit of allocation (two jobs share a node), finished jobs kept 10 minutes so
`scontrol show job` tells how each ended.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.helpers.cluster_runs import free_port
from tests.helpers.processes import command_line, environment, pids


PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
INSTALL = f"apt-get install -y --no-install-recommends {' '.join(PACKAGES)}"
DAEMONS = ("munged", "slurmctld", "slurmd", "slurmstepd", "sbatch", "scontrol")
NODES = ("n1", "n2")


def find(program: str) -> str | None:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/usr/bin:/sbin")


def require_slurm() -> None:
    """Skips (or, under TINYTX_CI=1, installs or fails) where SLURM or munge is missing."""
    missing = [program for program in DAEMONS if find(program) is None]
    if not missing:
        return
    if os.environ.get("TINYTX_CI") != "1":
        pytest.skip(f"needs SLURM and munge ({', '.join(missing)} missing): {INSTALL} (as root)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for command in (["apt-get", "update", "-q"], INSTALL.split()):
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            output = result.stdout[-2000:] + result.stderr[-2000:]
            pytest.fail(f"{' '.join(command)} failed under TINYTX_CI=1:\n{output}")
    missing = [program for program in DAEMONS if find(program) is None]
    assert not missing, f"still missing after {INSTALL}: {missing}"


class SlurmCluster:
    """The daemons, and the client commands run against them (`env`: theirs, and
    what sbatch exports to jobs)."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.daemons: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self) -> None:
        for name in ("state", "log", "munge", *(f"spool/{node}" for node in NODES)):
            (self.folder / name).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder / "munge", 0o700)
        key = self.folder / "munge" / "munge.key"
        # a munge key is random bytes that every daemon of the cluster shares
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        socket_path = self.folder / "munge" / "munge.socket"
        munge = self.folder / "munge"
        self.run_daemon("munged", [find("munged"), "--foreground", "--force", f"--key-file={key}",
                                   f"--socket={socket_path}", f"--pid-file={munge / 'munged.pid'}",
                                   f"--log-file={munge / 'munged.log'}", f"--seed-file={munge / 'seed'}"])
        self.wait_for(socket_path.exists, "munged's socket")
        self.conf.write_text(self.config(socket_path))
        self.run_daemon("slurmctld", [find("slurmctld"), "-D", "-i", "-f", str(self.conf)])
        for node in NODES:
            self.run_daemon(f"slurmd {node}", [find("slurmd"), "-D", "-N", node, "-f", str(self.conf)])
        self.wait_for(lambda: self.node_states() == ["idle"] * len(NODES), "both nodes idle", timeout=60)

    def config(self, munge_socket: Path) -> str:
        folder, host = self.folder, socket.gethostname()
        nodes = "\n".join(f"NodeName={node} NodeAddr=127.0.0.1 NodeHostname={host} Port={free_port()} CPUs=4 "
                          f"State=UNKNOWN" for node in NODES)
        return f"""ClusterName=tinytx
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={munge_socket}
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool/%n
SlurmctldPidFile={folder}/state/slurmctld.pid
SlurmdPidFile={folder}/spool/%n/slurmd.pid
SlurmctldLogFile={folder}/log/slurmctld.log
SlurmdLogFile={folder}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=600
InactiveLimit=0
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""

    def run_daemon(self, name: str, command: list[str]) -> None:
        log = open(self.folder / "log" / f"{name.replace(' ', '-')}.out", "w")  # noqa: SIM115 (the daemon's)
        self.daemons[name] = subprocess.Popen(command, env=self.env, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def stop(self) -> None:
        """Every job cancelled, then the slurmstepd processes left (they detach), then each daemon, by PID."""
        if "slurmctld" in self.daemons:
            subprocess.run(
                ["scancel", "--full", "--user", "root"], env=self.env, capture_output=True, timeout=60
            )
            deadline = time.monotonic() + 60
            while self.squeue() and time.monotonic() < deadline:
                time.sleep(0.5)
        for pid in self.step_daemons():
            kill(pid)
        for process in reversed(self.daemons.values()):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def step_daemons(self) -> list[int]:
        """The slurmstepd processes of this cluster (their environment names its config)."""
        return [pid for pid in pids() if "slurmstepd" in command_line(pid)
                and environment(pid).get("SLURM_CONF") == str(self.conf)]

    def wait_for(self, condition, what: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            for name, process in self.daemons.items():
                assert process.poll() is None, f"{name} ended ({process.returncode}):\n{self.logs()}"
            assert time.monotonic() < deadline, f"no {what} after {timeout} s:\n{self.logs()}"
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"== {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted((self.folder / "log").iterdir()))

    def command(self, *argv: str, check: bool = True, **kwargs) -> str:
        result = subprocess.run(
            argv, env={**self.env, **kwargs.pop("env", {})}, capture_output=True, text=True, timeout=60,
            **kwargs,
        )
        assert result.returncode == 0 or not check, f"{' '.join(argv)}: {result.stderr}{result.stdout}"
        return result.stdout

    def node_states(self) -> list[str]:
        return self.command("sinfo", "--noheader", "--Node", "--format=%t", check=False).split()

    def squeue(self) -> list[str]:
        return self.command("squeue", "--noheader", "--format=%i", check=False).split()

    def sbatch(self, script, *argv, options=(), cwd, env) -> str:
        """Submits `script` with `argv` after it, from `cwd`, with `env` exported to
        the job; returns the job id."""
        return self.command("sbatch", "--parsable", *options, str(script), *map(str, argv), cwd=cwd,
                            env=env).strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Reason, Restarts, ExitCode, ...)."""
        text = self.command("scontrol", "--oneliner", "show", "job", job_id)
        return dict(item.split("=", 1) for item in text.split() if "=" in item)

    def wait_job(self, job_id: str, states: set[str], timeout: float = 240, release: bool = True) -> dict:
        """Waits for the job to reach one of `states`. SLURM holds a requeued job ~120 s (Reason=BeginTime);
        with `release`, it is told to start 3 s after the requeue instead."""
        deadline, held_since = time.monotonic() + timeout, None
        while (info := self.job(job_id))["JobState"] not in states:
            held = info["JobState"] == "PENDING" and info.get("Reason") == "BeginTime"
            held_since = (held_since or time.monotonic()) if held else None
            if release and held and time.monotonic() - held_since >= 3:
                self.command("scontrol", "update", f"JobId={job_id}", "StartTime=now")
            assert (
                time.monotonic() < deadline
            ), f"job {job_id} is {info['JobState']}, not {states}, after {timeout} s"
            time.sleep(0.3)
        return info


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@contextlib.contextmanager
def running(folder: Path):
    """The cluster, started in `folder` (skipped or installed first where SLURM is
    missing), stopped at the end."""
    require_slurm()
    cluster = SlurmCluster(folder)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
