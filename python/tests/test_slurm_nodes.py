"""The N-node branch of ``examples/slurm/train.sbatch`` under a real SLURM
22.05 on several nodes: slurmctld and munged on one network namespace, a
slurmd on each of two others (``slurm_netns.py``), so the job's two
``relaunch run`` launchers (one per node, started by the script's
``srun``) find each other across real addresses, the store on the first
host of ``SLURM_JOB_NODELIST``, and two workers each from
``SLURM_GPUS_ON_NODE`` (``--gpus-per-node=2``).

The script is submitted as it is, its ``#SBATCH`` lines overridden on
sbatch's command line (``--gpus-per-node=2 --cpus-per-task=1``) as a user
would on a smaller cluster; arguments after it go to examples/resume.py.
Each test starts its own cluster (a couple of seconds) and tears it down:
every process in the namespaces is killed. Skipped without root or SLURM,
failed instead under CI."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path

import netns
import pytest
import slurm_netns
from conftest import wait_for
from slurm_netns import ENDED, SlurmCluster
from test_slurm import assert_same_params, uninterrupted_run

from relaunch import Checkpointer

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "examples" / "slurm" / "train.sbatch"
RESUME = ROOT / "examples" / "resume.py"
RELAUNCH = [sys.executable, "-m", "relaunch"]
# The allocation: 2 nodes x 2 GPUs, so 4 ranks.
ALLOCATION = ("--nodes=2", "--gpus-per-node=2", "--cpus-per-task=1")
# 4 ranks x batches of 8 over 512 samples: 16 steps an epoch, 48 in all.
TRAIN = ["--epochs", "3", "--samples", "512", "--batch-size", "8", "--ckpt-every", "10"]
STEPS = 48
# Long enough that a stop always comes first.
LONG = ["--epochs", "50", "--samples", "512", "--batch-size", "8", "--ckpt-every", "10"]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason}; CI is set, so this fails instead of skipping")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def slurm_here() -> None:
    """Skips the module (before the reference run) where no cluster can start."""
    try:
        netns.check_available()
    except netns.Unavailable as e:
        _unavailable(str(e))
    if gone := slurm_netns.missing():
        _unavailable(f"SLURM is not installed (missing: {', '.join(gone)})")


def job_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "RELAUNCH_", "TORCHELASTIC_", "PET_", "MASTER_"))
    }
    # The script runs `relaunch run`: this interpreter's.
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    # gloo would otherwise take an address from the hostname, which every
    # namespace shares (slurm_netns resolves it to each host's own, but a
    # worker must not depend on that).
    env.update(GLOO_SOCKET_IFNAME=netns.IFACE, OMP_NUM_THREADS="1")
    return env


@pytest.fixture
def cluster(slurm_here: None, hosts: netns.Hosts, tmp_path: Path) -> Iterator[SlurmCluster]:
    """The controller on hosts[0], nodes rl0 and rl1 on hosts[1] and hosts[2]."""
    made = SlurmCluster(hosts, tmp_path / "cluster", job_env())
    try:
        made.start()
        yield made
    finally:
        made.close()


class Tracking:
    """``relaunch server`` on the controller's host, reached from every node
    (with a token: it refuses to listen beyond loopback without one)."""

    def __init__(self, cluster: SlurmCluster, data: Path) -> None:
        self.cluster = cluster
        self.url = f"http://{cluster.controller.addr}:8080"
        self.token = secrets.token_hex(16)
        out = cluster.daemon(cluster.controller, "tracking", [
            *RELAUNCH, "server", "--data-dir", data, "--host", cluster.controller.addr,
            "--port", "8080", "--durability", "process", "--token", self.token,
        ])  # fmt: skip

        def serving() -> bool:
            text = out.read_text()
            assert not text.startswith("error"), text
            return "relaunch server: http://" in text

        wait_for(serving, 60, "the tracking server to serve")

    def get(self, path: str) -> object:
        # From the controller's namespace: the test's own has no route there.
        code = (
            "import sys, urllib.request; r = urllib.request.Request(sys.argv[1], "
            "headers={'Authorization': 'Bearer ' + sys.argv[2]}); "
            "print(urllib.request.urlopen(r).read().decode())"
        )
        out = self.cluster.run([sys.executable, "-c", code, f"{self.url}/api/v1{path}", self.token])
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)


def submit(
    cluster: SlurmCluster,
    tmp_path: Path,
    *args: str,
    sbatch: tuple[str, ...] = (),
    tracking: Tracking | None = None,
) -> int:
    """train.sbatch on two nodes; ``args`` go to examples/resume.py,
    ``sbatch`` to sbatch (they win over the script's #SBATCH lines)."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    # No server: RELAUNCH_SERVER unset (job_env drops it), the job untracked.
    env = {}
    if tracking is not None:
        env = {"RELAUNCH_SERVER": tracking.url, "RELAUNCH_SERVER_TOKEN": tracking.token}
    return cluster.sbatch(
        *ALLOCATION, *sbatch, f"--output={tmp_path / 'out.txt'}", f"--chdir={ROOT}",
        SBATCH, *args, cwd=tmp_path, env={"WORK": str(work), **env},
    )  # fmt: skip


def started(out: Path) -> bool:
    """Whether every rank has started (rank 3 is on the second node)."""
    return out.exists() and "rank 3: starting at step 0" in out.read_text()


def losses(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    return [(int(s), v) for s, v in (line.split() for line in path.read_text().splitlines())]


def stops(log: str) -> dict[int, int]:
    """Each rank's ``preempted after step N`` (examples/resume.py's last line)."""
    return {int(r): int(s) for r, s in re.findall(r"rank (\d+): preempted after step (\d+)", log)}


def assert_stopped_at_one_committed_step(log: str, ckpt_dir: Path) -> None:
    """All 4 ranks stopped at one step, and its checkpoint is the latest,
    forced by the stop."""
    stopped = stops(log)
    assert sorted(stopped) == [0, 1, 2, 3], log
    (stop,) = set(stopped.values())
    latest = Checkpointer(ckpt_dir).latest()
    assert latest is not None and (latest.step, latest.forced) == (stop, True), latest


def wait_ended(cluster: SlurmCluster, job: int, timeout: float) -> dict[str, str]:
    wait_for(lambda: cluster.state(job) in ENDED, timeout, f"job {job} to end")
    return cluster.show(job)


@pytest.fixture(scope="module")
def reference(slurm_here: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, dict]:
    """An uninterrupted run of examples/resume.py on one host with the same 4
    ranks: its losses and final parameters. (An uninterrupted run on the
    2-node cluster gives bitwise these: checked by hand, not per test.)"""
    env = {k: v for k, v in job_env().items() if k != "GLOO_SOCKET_IFNAME"}
    return uninterrupted_run(tmp_path_factory.mktemp("reference"), 4, TRAIN, STEPS, env)


def test_a_two_node_job_warned_of_its_time_limit_requeues_itself_and_resumes_exactly(
    cluster, reference, tmp_path
):
    """SLURM's pre-time-limit USR1 to the batch shell (what
    --signal=B:USR1@90 sends) is passed on to the srun step; both nodes'
    launchers stop every rank at one agreed step and checkpoint, node 0
    runs `scontrol requeue`, SLURM starts the job again on both nodes, and
    it resumes to its end: every step once, bitwise the losses and final
    parameters of an uninterrupted run of 4 ranks on one host; one tracking
    run with both attempts; the job COMPLETED with exit code 0 and one
    restart."""
    expected, params = reference
    tracking = Tracking(cluster, tmp_path / "server")
    trajectory = tmp_path / "losses"
    job = submit(
        cluster, tmp_path, "--losses", str(trajectory), "--params", str(tmp_path / "params.pt"),
        "--step-time", "0.2", *TRAIN, tracking=tracking,
    )  # fmt: skip
    out = tmp_path / "out.txt"
    wait_for(lambda: len(losses(trajectory)) >= 5, 120, "the job to train past step 5")
    signal = cluster.run(["scancel", "--batch", "--signal=USR1", job])
    assert signal.returncode == 0, signal.stderr
    wait_for(lambda: int(cluster.show(job).get("Restarts", "0")) >= 1, 60,
             "node 0 to requeue the job")  # fmt: skip
    end = wait_ended(cluster, job, 180)
    log = out.read_text()
    assert (end["JobState"], end["ExitCode"], end["Restarts"]) == ("COMPLETED", "0:0", "1"), log
    # Two launchers (nodes) per allocation, two workers each: 4 ranks.
    assert log.count(f"run slurm-{job}: 2 worker(s) on this node, 2 node(s)") == 4, log
    stopped = stops(log)
    assert sorted(stopped) == [0, 1, 2, 3], log
    (stop,) = set(stopped.values())  # every rank, on both nodes, at one step
    assert stop < STEPS - 1, log
    assert "SIGUSR1" in log, log
    assert f"scontrol requeue {job}" in log, log
    for rank in range(4):
        assert f"rank {rank}: starting at step {stop + 1}" in log, log
    trained = losses(trajectory)
    assert [s for s, _ in trained] == list(range(STEPS))  # every step once
    # Bitwise the uninterrupted run of 4 ranks on one host: every loss and
    # the final parameters (examples/resume.py keeps DDP's gradient buckets
    # in one layout, so the first step after the resume sums as it would have).
    assert trained == expected
    assert_same_params(tmp_path / "params.pt", params)
    run = tracking.get(f"/runs/slurm-{job}")
    assert isinstance(run, dict)
    assert (run["status"], run["attempts"]) == ("finished", 2), run


def test_a_stopped_two_node_job_that_cannot_requeue_ends_with_exit_code_75(cluster, tmp_path):
    """With --no-requeue, node 0's `scontrol requeue` is refused after the
    stop: the batch script, whose `wait` the trapped USR1 interrupted, ends
    with the srun step's exit code 75, so SLURM records the job as FAILED
    75 rather than COMPLETED; the checkpoint of the agreed step is
    committed for the next submission."""
    job = submit(cluster, tmp_path, "--step-time", "0.2", *LONG, sbatch=("--no-requeue",))
    assert cluster.show(job)["Requeue"] == "0", cluster.show(job)
    out = tmp_path / "out.txt"
    wait_for(lambda: started(out), 120, "every rank to start")
    signal = cluster.run(["scancel", "--batch", "--signal=USR1", job])
    assert signal.returncode == 0, signal.stderr
    end = wait_ended(cluster, job, 120)
    log = out.read_text()
    assert (end["JobState"], end["ExitCode"], end["Restarts"]) == ("FAILED", "75:0", "0"), log
    assert "was not requeued" in log, log
    assert_stopped_at_one_committed_step(log, tmp_path / "work" / "ckpt" / str(job))


def test_scancel_stops_both_nodes_at_one_step_and_leaves_nothing_running(cluster, tmp_path):
    """`scancel JOB`: SLURM sends SIGTERM to every process of the job on
    both nodes (the batch shell, srun, both launchers, every worker); every
    rank stops at one agreed step and commits its checkpoint, both
    launchers exit by themselves (75), and nothing of the job is left
    running on either node: only slurmd. (--no-requeue: see the next test.)"""
    job = submit(cluster, tmp_path, "--step-time", "0.2", *LONG, sbatch=("--no-requeue",))
    out = tmp_path / "out.txt"
    wait_for(lambda: started(out), 120, "every rank to start")
    cancel = cluster.run(["scancel", job])
    assert cancel.returncode == 0, cancel.stderr
    end = wait_ended(cluster, job, 60)
    assert end["JobState"] == "CANCELLED", end
    daemons = cluster.daemon_pids()
    nodes = list(cluster.nodes.values())
    wait_for(lambda: all(set(h.pids()) <= daemons for h in nodes), 60,
             "every process of the job to exit")  # fmt: skip
    log = out.read_text()
    # Not SLURM's SIGKILL after KillWait: each launcher saw its workers stop.
    clean = (
        "relaunch: stopped by SIGTERM; every rank stopped at the agreed step (preempted, exit "
        "code 75)"
    )
    assert log.count(clean) == 2, log
    assert_stopped_at_one_committed_step(log, tmp_path / "work" / "ckpt" / str(job))


def test_scancel_of_a_requeueable_job_is_not_undone_by_requeue_on_preempt(cluster, tmp_path):
    """A user's `scancel` of the script's job (#SBATCH --requeue) ends it:
    node 0's launcher, stopped by scancel's SIGTERM, must not requeue it."""
    job = submit(cluster, tmp_path, "--step-time", "0.2", *LONG)
    out = tmp_path / "out.txt"
    wait_for(lambda: started(out), 120, "every rank to start")
    cancel = cluster.run(["scancel", job])
    assert cancel.returncode == 0, cancel.stderr
    daemons = cluster.daemon_pids()
    nodes = list(cluster.nodes.values())

    def settled() -> bool:
        requeued = int(cluster.show(job).get("Restarts", "0")) >= 1
        return requeued or all(set(h.pids()) <= daemons for h in nodes)

    wait_for(settled, 60, "the job's processes to exit or SLURM to requeue it")
    # COMPLETING (with a requeue, or on the way to CANCELLED) until SLURM
    # has heard from both nodes.
    wait_for(lambda: cluster.state(job) != "COMPLETING", 60, "SLURM to finish the job")
    end = cluster.show(job)
    assert (end["JobState"], end["Restarts"]) == ("CANCELLED", "0"), out.read_text()
