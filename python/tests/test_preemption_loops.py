"""Preemption of training loops as people write them: DataLoader worker
processes of every start method, persistent or not, pinned memory, and the
stop signal arriving every way a scheduler sends it. Every rank must stop at
the agreed step with exit code 75 and its checkpoint saved (no step lost),
and no process of the job may outlive the launcher."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import wait_for
from test_launch_tracking import events, get

from relaunch._fork_guard import affected
from relaunch._subprocess import alive, children

WORKERS = Path(__file__).resolve().parent / "workers"
LOADER_TRAIN = WORKERS / "loader_train.py"
SLEEPER = WORKERS / "sleeper.py"


def descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        for child in children(todo.pop()):
            out.append(child)
            todo.append(child)
    return out


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts `relaunch run ARGS` in a session of its own, as a terminal or
    a batch system starts it (its process group is the job's foreground
    group); kills whatever is left of it at the end."""
    started: list[subprocess.Popen] = []

    def run(*args: object) -> subprocess.Popen:
        job = subprocess.Popen(
            [sys.executable, "-m", "relaunch", "run", *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            start_new_session=True,
        )
        started.append(job)
        return job

    yield run
    for job in started:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.communicate(timeout=30)


def under_way(job: subprocess.Popen, out: Path) -> list[dict]:
    """Waits for both ranks of `loader_train.py` to reach step 20; their pids."""
    wait_for(
        lambda: all((out / f"pids.{r}").exists() for r in range(2)) or job.poll() is not None,
        180,
        "training to be under way",
    )
    assert job.poll() is None, job.communicate()
    return [json.loads((out / f"pids.{r}").read_text()) for r in range(2)]


def deliver(how: str, launcher: subprocess.Popen) -> None:
    if how == "launcher":  # Kubernetes: SIGTERM to PID 1 only
        launcher.send_signal(signal.SIGTERM)
    elif how == "every-process":  # SLURM: every process of the step at once
        for pid in [launcher.pid, *descendants(launcher.pid)]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    elif how == "process-groups":  # kill -TERM -- -PGID, for each group of the job
        groups = {os.getpgid(p) for p in [launcher.pid, *descendants(launcher.pid)]}
        for group in groups:
            try:
                os.killpg(group, signal.SIGTERM)
            except ProcessLookupError:
                pass
    elif how == "ctrl-c":  # the terminal: SIGINT to its foreground process group
        os.killpg(launcher.pid, signal.SIGINT)
    else:
        raise ValueError(how)


# (DataLoader workers, start method, persistent_workers, pin_memory, how the signal arrives):
# every start method, worker count and delivery at least once, without the
# full product (each case starts a real 2-rank DDP job).
CASES = [
    (0, "fork", False, False, "launcher"),
    (2, "fork", True, False, "launcher"),
    (2, "spawn", False, False, "every-process"),
    (4, "forkserver", False, True, "every-process"),
    (4, "fork", False, False, "every-process"),
    (2, "fork", True, True, "process-groups"),
    (2, "forkserver", True, False, "launcher"),
    (2, "spawn", True, False, "ctrl-c"),
]


@pytest.mark.parametrize(("workers", "method", "persistent", "pin", "how"), CASES)
def test_every_rank_stops_at_the_agreed_step_whatever_its_data_loader(
    start, tmp_path, workers, method, persistent, pin, how
):
    args = ["--nproc-per-node", "2", "--shutdown-timeout", "60", LOADER_TRAIN, tmp_path]
    args += ["--workers", workers, "--start-method", method]
    args += ["--persistent"] * persistent + ["--pin-memory"] * pin
    job = start(*args)
    pids = under_way(job, tmp_path)
    job_pids = [p["rank"] for p in pids] + [c for p in pids for c in p["children"]]
    assert sum(len(p["children"]) for p in pids) >= 2 * workers, pids
    deliver(how, job)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 75, err
    assert "killed by signal" not in err, err
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert all(r["preempted"] and r["step"] == r["agreed"] for r in reports), reports
    assert reports[0]["step"] == reports[1]["step"], reports
    assert (tmp_path / f"ckpt_{reports[0]['step']}.pt").exists()
    assert not [p for p in job_pids if alive(p)], "a process of the job outlived the launcher"


def test_a_daemon_a_rank_started_does_not_keep_the_launcher_waiting(start, tmp_path):
    # A process in a session of its own (setsid; logging services start
    # theirs so) is reparented to the launcher when its rank exits, and
    # holds the rank's output open.
    job = start(
        *("--nproc-per-node", "2", "--shutdown-timeout", "5"),
        *(LOADER_TRAIN, tmp_path, "--workers", "2", "--daemon"),
    )
    under_way(job, tmp_path)
    daemon = int((tmp_path / "daemon").read_text())
    assert alive(daemon)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 75, err
    assert not alive(daemon)
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert reports[0]["step"] == reports[1]["step"] and reports[0]["preempted"], reports


def test_an_unclean_stop_is_recorded_as_a_failure_not_a_preemption(
    start, tracking_server, tmp_path
):
    # The sleeper has no preemption support: SIGTERM kills it.
    job = start(
        *("--server", tracking_server.url, "--run-id", "unclean", "--nproc-per-node", "2"),
        *(SLEEPER, tmp_path),
    )
    wait_for(lambda: len(list(tmp_path.glob("pid.*"))) == 2, 60, "the workers")
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 128 + signal.SIGTERM, err
    assert "rank 0 (local rank 0" in err and "signal SIGTERM" in err, err
    run = get(tracking_server, "/runs/unclean")
    assert isinstance(run, dict) and run["status"] == "failed", run
    found = events(tracking_server, "unclean")
    assert [e["kind"] for e in found][-1] == "failed", found
    failed = [e for e in found if e["kind"] == "worker_failed"]
    assert failed and {r["rank"] for r in failed[0]["data"]["ranks"]} == {0, 1}, failed


def test_a_dead_ranks_loader_workers_are_killed_at_once(start, tmp_path):
    job = start(
        *("--nproc-per-node", "2", "--max-restarts", "0", "--shutdown-timeout", "60"),
        *(LOADER_TRAIN, tmp_path, "--workers", "2"),
    )
    victim = under_way(job, tmp_path)[1]
    os.kill(victim["rank"], signal.SIGKILL)
    # torch's own watchdog would end them within 5 s; the launcher, at once.
    wait_for(
        lambda: not any(alive(c) for c in victim["children"]),
        2,
        "the dead rank's DataLoader workers to be killed",
    )
    _, err = job.communicate(timeout=120)
    assert job.returncode == 1, err
    assert "rank 1" in err, err


def test_after_a_rank_fails_the_others_end_at_once_despite_the_preemption_handler(start, tmp_path):
    """relaunch.preemption turns SIGTERM into a stop request; the SIGTERM that
    follows a failure (the launcher's `workers/failed` key is set first) ends
    the rank at once, as torchrun's would, instead of after the grace period."""
    job = start(
        *("--nproc-per-node", "2", "--max-restarts", "0", "--shutdown-timeout", "60"),
        *(SLEEPER, tmp_path, "--preemption"),
    )
    wait_for(lambda: len(list(tmp_path.glob("pid.*"))) == 2, 60, "the workers")
    os.kill(int((tmp_path / "pid.1").read_text()), signal.SIGKILL)
    _, err = job.communicate(timeout=20)
    assert job.returncode == 1, err
    assert "ending this rank now for the restart" in err, err
    assert "rank 0 (local rank 0): signal SIGTERM (15) (stopped by relaunch)" in err, err


BURST_CHILD = """
import time
from relaunch import preemption
print("ready", flush=True)
end = time.monotonic() + 2.5
while time.monotonic() < end:
    pass
print("requested", preemption.requested(), flush=True)
"""


def test_stop_signals_in_quick_succession_neither_deadlock_nor_crash_the_handler(tmp_path):
    """A rank gets the same stop signal more than once, and close together:
    from the scheduler and again from the launcher (SLURM, ``kill -- -PGID``).
    A handler that runs while the previous one is still running must not
    wait on a lock that one holds (it did, in ``threading.Event.set``: both
    ranks hung until the grace period's SIGKILL) nor recurse until Python
    gives up. A burst of signals makes the overlap certain."""
    script = tmp_path / "child.py"
    script.write_text(BURST_CHILD)
    for trial in range(4):
        child = subprocess.Popen(
            [sys.executable, script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout.readline().strip() == "ready", child.communicate()
            end = time.monotonic() + 1.0
            while time.monotonic() < end and child.poll() is None:
                child.send_signal(signal.SIGTERM)
            try:
                out, err = child.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                pytest.fail(f"trial {trial}: the process hung in its signal handler")
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
        assert child.returncode == 0, f"trial {trial}: exit {child.returncode}\n{err[-3000:]}"
        assert out.strip().endswith("requested True"), out


FORK_STUCK = WORKERS / "fork_stuck.py"
GH_112275 = pytest.mark.skipif(
    not affected(),
    reason="CPython gh-112275 is fixed in this Python: its forks need no guard",
)


def fork_stuck(*args: str) -> subprocess.CompletedProcess:
    """Runs workers/fork_stuck.py in a session of its own: a child it left
    stuck (without the guard) is killed with it."""
    proc = subprocess.Popen(
        [sys.executable, FORK_STUCK, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"fork_stuck.py {' '.join(args)} still ran after 120 s:\n{err[-3000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@GH_112275
def test_a_forked_worker_stuck_before_it_runs_python_is_killed_and_forked_again():
    """Before Python 3.11.10 a fork while a native thread (gloo's, dropping a
    collective's tensors) creates a thread state leaves the child blocked on
    the runtime lock forever (CPython gh-112275): a DataLoader worker that
    never starts and a rank that waits for its batch forever. Here the first
    two forks stick the same way (an earlier after-fork hook waits on a lock
    nothing can release); the DataLoader still reads every sample."""
    run = fork_stuck("2")
    assert run.returncode == 0, run.stderr[-3000:]
    every = " ".join(map(str, range(20)))
    assert run.stdout.splitlines()[:2] == [f"samples {every}"] * 2, run.stdout
    assert run.stdout.splitlines()[2].startswith("ok"), run.stdout
    assert run.stderr.count("deadlocked before it started (CPython gh-112275") == 2, run.stderr
    assert "killed it and forked again (2 of 5)" in run.stderr, run.stderr


@GH_112275
def test_a_start_whose_every_fork_sticks_fails_with_what_to_do():
    run = fork_stuck("0", "always")
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "refused: 5 processes forked in a row deadlocked" in run.stdout, run.stdout
    assert "upgrade Python to 3.11.10" in run.stdout and "'spawn'" in run.stdout, run.stdout
    assert "(5 of 5)" in run.stderr, run.stderr


def test_the_pythons_whose_fork_can_deadlock_are_told_apart():
    assert affected((3, 10, 14)) and affected((3, 11, 0)) and affected((3, 11, 9))
    assert not affected((3, 10, 15)) and not affected((3, 11, 10))
    assert not affected((3, 12, 0)) and not affected((3, 13, 1))


AGREES_UNDER_TORCHRUN = """
import os, signal, sys, time
from pathlib import Path
from relaunch import preemption
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
out = Path(sys.argv[1])
for step in range(10_000):
    if rank == 1 and step == 5:
        os.kill(os.getpid(), signal.SIGTERM)  # a stop that reaches one rank only
    time.sleep(0.1)
    dist.all_reduce(torch.ones(1))
    if preemption.reached(step):
        (out / f"stopped.{rank}").write_text(str(step))
        break
dist.destroy_process_group()
"""


def test_under_torchrun_the_ranks_agree_through_torchruns_store(tmp_path, free_port):
    """Issue 34: without relaunch run's store, relaunch.preemption fell
    back to each rank's own step, so a SIGTERM to one rank stopped that rank
    alone and left the other waiting for it in all_reduce. Under torchrun
    the ranks agree through its agent's store (MASTER_ADDR:MASTER_PORT)."""
    script = tmp_path / "agrees.py"
    script.write_text(AGREES_UNDER_TORCHRUN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_")}
    torchrun = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
         "--master-port", str(free_port), str(script), str(tmp_path)],
        capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path,
    )  # fmt: skip
    log = torchrun.stdout + torchrun.stderr
    assert torchrun.returncode == 0, log
    steps = {int((tmp_path / f"stopped.{rank}").read_text()) for rank in range(2)}
    assert len(steps) == 1 and steps.pop() > 5, (steps, log)


def test_several_ranks_without_a_store_are_told_at_start_that_no_stop_is_agreed(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAUNCH_", "TORCHELASTIC_"))}
    env.update(WORLD_SIZE="2", RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    proc = subprocess.run(
        [sys.executable, "-c", "import relaunch.preemption"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("no store to agree on a stop step through") == 1, proc.stderr
    env.update(WORLD_SIZE="1")
    alone = subprocess.run(
        [sys.executable, "-c", "import relaunch.preemption"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert "no store" not in alone.stderr, alone.stderr
