"""A real multi-node SLURM (slurmctld, one slurmd per node, munge) on one
machine: every SLURM host is a network namespace of ``netns.Hosts``.

::

    hosts[0]  10.77.0.1  the controller: munged, slurmctld; the clients
                         (sbatch, scontrol, scancel) run here
    hosts[1]  10.77.0.2  node rl0: slurmd -N rl0
    hosts[2]  10.77.0.3  node rl1: slurmd -N rl1     ...

Every node has ``GPUS`` GPUs as SLURM sees them (``Gres=gpu:2``, a
gres.conf with a count and no device files): a job's ``--gpus-per-node``
is scheduled and sets ``SLURM_GPUS_ON_NODE`` as on a GPU cluster, and
nothing touches a device. The namespaces share the filesystem, so the
munge socket, the state directories and a job's files are reachable from
every host, as on a cluster with shared storage; per-node files carry
SLURM's ``%n`` (node name).

Every process of the cluster starts through :meth:`SlurmCluster.command`:
``nsenter --net`` into the host's namespace, then a mount namespace of its
own whose ``/etc/hosts`` names the nodes, the controller (``rlctl``) and
this machine's hostname (the UTS name, which the namespaces share) as the
host's own address. Not ``ip netns exec``: it remounts ``/sys`` for the
namespace, without the cgroup hierarchy that slurmd 22.05 insists on
("No filesystem mounted on /sys/fs/cgroup") even with proctrack/linuxproc.
The daemons and every job's processes live in the namespaces, so
``Hosts.close`` kills them; nothing is written outside the cluster's
directory.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import netns

DAEMONS = ("slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "munged")
GPUS = 2
# Fixed ports: every namespace has its own network stack.
CTLD_PORT = 6817
SLURMD_PORT = 6818
# Job states after which nothing of the job runs.
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def missing() -> list[str]:
    """The SLURM and munge programs that are not installed."""
    return [p for p in DAEMONS if shutil.which(p) is None]


class SlurmCluster:
    """The controller on ``hosts[0]`` and a node on each other host; files
    under ``root``. :attr:`env` is the environment for the clients and
    (through ``sbatch``'s default ``--export=ALL``) for the jobs."""

    def __init__(self, hosts: netns.Hosts, root: Path, env: dict[str, str]) -> None:
        self.hosts = hosts
        self.controller = hosts[0]
        self.nodes = {f"rl{i}": h for i, h in enumerate(hosts[1:])}
        self.root = root
        self.conf = root / "slurm.conf"
        self.env = {**env, "SLURM_CONF": str(self.conf)}
        self._daemons: list[subprocess.Popen] = []

    # --- start ---------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> None:
        """Starts munged, slurmctld and every slurmd; returns once every node is idle."""
        for d in ("munge", "state", "etc", *(f"spool/{n}" for n in self.nodes)):
            (self.root / d).mkdir(parents=True)
        self.root.chmod(0o755)
        (self.root / "munge").chmod(0o700)
        self._write_hosts_files()
        self._start_munge(timeout)
        self._write_conf()
        self.daemon(self.controller, "slurmctld", ["slurmctld", "-D", "-c", "-f", self.conf])
        for name, host in self.nodes.items():
            self.daemon(host, f"slurmd-{name}", ["slurmd", "-D", "-N", name, "-f", self.conf])
        self._wait(lambda: all(s == "IDLE" for s in self.node_states().values()), timeout,
                   "every node to be IDLE")  # fmt: skip

    def _write_hosts_files(self) -> None:
        me = socket.gethostname()
        names = {self.controller.addr: ["rlctl"]}
        for name, host in self.nodes.items():
            names[host.addr] = [name]
        for host in self.hosts:
            lines = ["127.0.0.1 localhost"]
            for addr, aliases in names.items():
                # This machine's hostname is each namespace's own address,
                # as on a cluster of separate machines.
                own = [me] if addr == host.addr else []
                lines.append(" ".join([addr, *aliases, *own]))
            (self.root / "etc" / f"{host.name}.hosts").write_text("\n".join(lines) + "\n")

    def _start_munge(self, timeout: float) -> None:
        d = self.root / "munge"
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.munge_socket = d / "munge.socket"
        # In the controller's namespace, so that Hosts.close kills it; a
        # unix socket on a path is reachable from every namespace.
        self.daemon(self.controller, "munged", [
            "munged", "--foreground", "--force", f"--key-file={key}",
            f"--socket={self.munge_socket}", f"--pid-file={d / 'munged.pid'}",
            f"--log-file={d / 'munged.log'}", f"--seed-file={d / 'munged.seed'}",
        ])  # fmt: skip
        self._wait(self.munge_socket.exists, timeout, "munged's socket")

    def _write_conf(self) -> None:
        d = self.root
        # The CPUs, sockets and memory as slurmd sees this machine (every
        # node is this machine), less 1 GiB of memory so that a busy
        # machine still passes slurmd's check.
        probe = subprocess.run(["slurmd", "-C"], capture_output=True, text=True, timeout=30)
        line = probe.stdout.splitlines()[0]
        resources = [f for f in line.split() if not f.startswith(("NodeName=", "UpTime="))]
        resources = [_less_memory(f) for f in resources]
        nodes = "\n".join(
            f"NodeName={name} NodeAddr={host.addr} {' '.join(resources)} Gres=gpu:{GPUS} "
            "State=UNKNOWN"
            for name, host in self.nodes.items()
        )
        self.conf.write_text(f"""\
ClusterName=relaunchnodes
SlurmctldHost={socket.gethostname()}({self.controller.addr})
SlurmctldPort={CTLD_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long slurmd refuses a job id it just stopped, and so how
# long SLURM holds a requeued job before it may start again (120 s by default).
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool/%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd-%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
# A scheduling pass every 2 s rather than every 60: a requeued job becomes
# eligible (cred_expire) without an event that would start one.
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
GresTypes=gpu
ReturnToService=2
JobRequeue=1
# A job's processes get SIGTERM, then this long before SIGKILL.
KillWait=60
# Ended jobs stay visible to scontrol (ExitCode=, Restarts=) this long.
MinJobAge=600
{nodes}
PartitionName=main Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        # GPUs that SLURM counts and allocates. SLURM 22.05 drops a GPU
        # without a device file ("Removing file-less GPU"), so each has an
        # empty file of its own for one; nothing opens it.
        (d / "dev").mkdir()
        for i in range(GPUS):
            (d / "dev" / f"gpu{i}").touch()
        (d / "gres.conf").write_text(f"Name=gpu File={d}/dev/gpu[0-{GPUS - 1}]\n")

    def daemon(self, host: netns.Host, name: str, args: Sequence[object]) -> Path:
        """Starts ``args`` on ``host`` until :meth:`close`; returns the file
        that gets its output."""
        out_path = self.root / f"{name}.stdout"
        with out_path.open("w") as out:
            proc = subprocess.Popen(
                self.command(host, args), env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._daemons.append(proc)
        return out_path

    def daemon_pids(self) -> set[int]:
        """The daemons' pids (``command`` execs, so each is the program's)."""
        return {p.pid for p in self._daemons if p.poll() is None}

    def command(self, host: netns.Host, args: Sequence[object]) -> list[str]:
        """``args`` as a command that runs on ``host``: in its network
        namespace, with its /etc/hosts (see the module's docstring)."""
        hosts_file = self.root / "etc" / f"{host.name}.hosts"
        return [
            "nsenter", f"--net=/run/netns/{host.ns}", "unshare", "--mount", "--propagation=private",
            "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts_file),
            *map(str, args),
        ]  # fmt: skip

    def _wait(self, condition, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {what}\n{self.logs()}")
            time.sleep(0.2)

    # --- use -----------------------------------------------------------------

    def run(self, args: Sequence[object], **kwargs) -> subprocess.CompletedProcess[str]:
        """A SLURM client command on the controller's host."""
        kwargs = {"capture_output": True, "text": True, "timeout": 30, "env": self.env, **kwargs}
        return subprocess.run(self.command(self.controller, args), **kwargs)

    def sbatch(self, *args: object, cwd: Path, env: dict[str, str]) -> int:
        """``sbatch --parsable ARGS`` (options, the script, its arguments) in
        ``cwd`` with ``env`` added to :attr:`env`; returns the job id."""
        out = self.run(["sbatch", "--parsable", *args], cwd=cwd, env={**self.env, **env})
        if out.returncode != 0:
            raise RuntimeError(f"sbatch failed: {out.stderr}\n{self.logs()}")
        return int(out.stdout.strip().split(";")[0])

    def show(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields ({} once SLURM has forgotten it)."""
        out = self.run(["scontrol", "show", "job", "-o", job])
        if out.returncode != 0:
            return {}
        return dict(re.findall(r"(\S+?)=(\S*)", out.stdout))

    def state(self, job: int) -> str:
        return self.show(job).get("JobState", "")

    def node_states(self) -> dict[str, str]:
        out = self.run(["sinfo", "--noheader", "--Node", "--format=%N %T"])
        states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
        return {name: states.get(name, "").upper().rstrip("*") for name in self.nodes}

    def logs(self, lines: int = 30) -> str:
        """The tail of every daemon's log, for a failure's message."""
        parts = []
        for path in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.stdout")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)

    # --- stop ----------------------------------------------------------------

    def close(self) -> None:
        """Kills the daemons (the jobs' processes, children of slurmd, die
        with the namespaces: ``Hosts.close``)."""
        for proc in self._daemons:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
        self._daemons.clear()


def _less_memory(field: str) -> str:
    if not field.startswith("RealMemory="):
        return field
    mib = int(field.split("=", 1)[1])
    return f"RealMemory={mib - 1024 if mib > 2048 else mib}"
