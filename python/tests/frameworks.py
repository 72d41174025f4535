"""What the framework integration tests share: a job under ``relaunch run``
whose output goes to files, the stop signal delivered the ways schedulers
deliver it, and the traces the training scripts write (every batch each rank
trained: ``epoch step sample...``)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from conftest import wait_for
from test_launch_tracking import get
from test_preemption_loops import descendants

WORKERS = Path(__file__).resolve().parent / "workers"


@dataclass
class Job:
    proc: subprocess.Popen
    out: Path  # the launcher's stdout
    err: Path  # its stderr

    def finish(self, timeout: float = 200) -> tuple[int, str]:
        """Waits for the launcher; its exit code and everything it printed.
        A job still running after ``timeout`` (below pytest's own 300 s) is
        killed after its processes' Python stacks are taken, and the test
        fails with them: a hang says where it hung."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            stacks = python_stacks([self.proc.pid, *descendants(self.proc.pid)])
            raise AssertionError(
                f"the job still ran after {timeout:g} s; its stacks:\n{stacks}\n"
                f"its output:\n{self.out.read_text()}{self.err.read_text()}"
            ) from None
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode, self.out.read_text() + self.err.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def python_stacks(pids: list[int]) -> str:
    """``py-spy dump`` of each process (the launcher itself is not Python:
    py-spy says so), with native frames where py-spy can unwind them, for a
    failure message."""
    py_spy = Path(sys.executable).with_name("py-spy")
    out = []
    for pid in pids:
        try:
            for native in (["--native"], []):  # native unwinding fails in some states
                dump = subprocess.run(
                    [str(py_spy), "dump", *native, "--pid", str(pid)],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                if dump.returncode == 0:
                    break
            out.append(f"--- pid {pid}:\n{dump.stdout}{dump.stderr}")
        except (OSError, subprocess.TimeoutExpired) as e:
            out.append(f"--- pid {pid}: no stack ({e})")
    return "\n".join(out)


def launch(tmp_path: Path, name: str, *args: object, env: dict[str, str] | None = None) -> Job:
    """``relaunch run ARGS`` in a session of its own (as a batch system or a
    terminal starts it), its output in ``tmp_path/name.{out,err}``."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relaunch", "run", *map(str, args)],
            stdout=stdout,
            stderr=stderr,
            cwd=tmp_path,
            start_new_session=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        )
    return Job(proc, out, err)


def trace_lines(out: Path, rank: int) -> list[str]:
    path = out / f"trace.{rank}"
    return path.read_text().splitlines() if path.exists() else []


def wait_for_steps(job: Job, out: Path, steps: int, timeout: float = 180) -> None:
    """Until rank 0 trained ``steps`` batches (or the job ended: the caller's
    assertions say how)."""
    wait_for(
        lambda: len(trace_lines(out, 0)) >= steps or job.proc.poll() is not None,
        timeout,
        f"{steps} training steps",
    )
    assert job.proc.poll() is None, job.finish()[1]


def rank_pids(job: Job) -> dict[int, int]:
    """Global rank of each of the launcher's workers, from their environment."""
    ranks = {}
    for pid in descendants(job.proc.pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError):
            continue
        if parent != job.proc.pid:
            continue  # a DataLoader worker, not a rank
        for entry in environ:
            if entry.startswith(b"RANK="):
                ranks[int(entry[5:])] = pid
    return ranks


def deliver(how: str, job: Job) -> None:
    """The stop signal as a scheduler sends it: to the launcher only
    (Kubernetes, PID 1), to every process of the job (SLURM), or to one
    rank (a user's `kill`, an OOM-watcher)."""
    if how == "launcher":
        job.proc.send_signal(signal.SIGTERM)
    elif how == "every-process":
        for pid in [job.proc.pid, *descendants(job.proc.pid)]:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    elif how == "one-rank":
        os.kill(rank_pids(job)[1], signal.SIGTERM)
    else:
        raise ValueError(how)


def assert_same_training(reference: Path, resumed: Path, ranks: int = 2) -> None:
    """The interrupted and resumed job trained exactly the batches, in the
    order, of the uninterrupted one: every sample of every epoch once."""
    for rank in range(ranks):
        want, got = trace_lines(reference, rank), trace_lines(resumed, rank)
        assert got == want, (rank, [g for g in got if g not in want][:3], len(got), len(want))


def assert_same_params(reference: Path, resumed: Path) -> None:
    """Rank 0's final parameters (``params.pt``), bit for bit."""
    want, got = torch.load(reference / "params.pt"), torch.load(resumed / "params.pt")
    assert want.keys() == got.keys()
    for name in want:
        assert torch.equal(want[name], got[name]), name


# Stops: how the SIGTERM comes, and with how many DataLoader workers. The
# last has rank 1 signal itself during step 5 (6 steps done after it), so
# the ranks agree on step 8: the last batch of epoch 0.
STOPS = [("launcher", 0), ("every-process", 2), ("rank 1, at the end of an epoch", 2)]


def reference_run(tmp: Path, worker: Path, *extra: object) -> Path:
    """The uninterrupted job (``extra``: the training script's options):
    its output folder (traces, final parameters)."""
    args = ["--nproc-per-node", "2", worker, tmp / "out", *extra]
    code, log = launch(tmp, "reference", *args).finish(280)
    assert code == 0, log
    return tmp / "out"


def stop_and_resume(
    reference: Path,
    tmp_path: Path,
    worker: Path,
    how: str,
    workers: int,
    check_stop: Callable[[Path, int, str], None],
    extra: tuple[object, ...] = (),
    signal_at: int = 5,
) -> None:
    """Starts ``worker``'s job, stops it the way ``how`` says (exit 75, every
    rank at one step with its checkpoint), calls ``check_stop(out, step,
    log)`` on what the stop left, relaunches the job to the end, and checks
    that it trained exactly the uninterrupted job's batches and ended with
    its parameters. ``extra``: the training script's options, as the
    reference had them; ``signal_at``: where rank 1 signals itself."""
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", worker, out, "--workers", workers, *extra]
    if how.startswith("rank 1"):
        job = launch(tmp_path, "first", *args, "--step-time", "0.15", "--signal-at", signal_at)
    else:
        job = launch(tmp_path, "first", *args, "--step-time", "0.15")
        wait_for_steps(job, out, 4)  # mid-epoch 0
        deliver(how, job)
    code, log = job.finish()
    assert code == 75, log
    match = re.search(
        r"every rank on this node stopped at step (\d+), each with its checkpoint", log
    )
    assert match, log
    step = int(match.group(1))
    if how.startswith("rank 1") and signal_at == 5:
        assert step == 8, log
    assert "every rank stopped at the agreed step (preempted, exit code 75)" in log
    check_stop(out, step, log)
    code, log = launch(tmp_path, "second", *args).finish()
    assert code == 0, log
    assert_same_training(reference, out)
    assert_same_params(reference, out)


def logged_once_across_a_preemption(server: object, tmp_path: Path, worker: Path, run: str) -> None:
    """A job logging to ``server`` as run ``run``, stopped mid-epoch and
    relaunched: every step's loss (rank 0) is stored once, by the attempt
    that trained it."""
    out = tmp_path / "out"
    args = ["--nproc-per-node", "2", "--server", server.url, "--run-id", run, worker, out]
    job = launch(tmp_path, "first", *args, "--step-time", "0.15")
    wait_for_steps(job, out, 4)
    deliver("launcher", job)
    assert job.finish()[0] == 75
    code, log = launch(tmp_path, "second", *args).finish()
    assert code == 0, log
    steps = []
    for attempt in range(2):
        series = get(
            server, f"/runs/{run}/series", key="loss", rank=0, attempt=attempt, buckets=100000
        )
        steps.append([p["step"] for p in series["points"]])
    assert steps[0] and steps[1], steps
    every = sorted(steps[0] + steps[1])
    assert every == list(range(every[0], every[0] + 24)), steps  # each of the 24 steps once


def hang_and_crash_are_handled(reference: Path, tmp_path: Path, worker: Path, where: str) -> None:
    """A rank that hangs at step 5 is reported with its stack (``where``: the
    function and file it is stuck in) and the job restarted; a rank that
    crashes there is restarted; both jobs end with the uninterrupted
    parameters."""
    common = ["--nproc-per-node", "2", "--max-restarts", "1", "--hang-timeout", "10", worker]
    code, log = launch(tmp_path, "hang", *common, tmp_path / "hang", "--hang-at", "5").finish()
    assert code == 0, log
    assert "relaunch: hang in attempt 0" in log, log
    # faulthandler names the function, py-spy its class too (Module.forward).
    assert re.search(rf"rank 1: in (?:\w+\.)?{where}:\d+", log), log
    assert_same_params(reference, tmp_path / "hang")
    code, log = launch(tmp_path, "crash", *common, tmp_path / "crash", "--crash-at", "5").finish()
    assert code == 0, log
    assert re.search(r"rank 1 .*exit code 1", log), log
    assert_same_params(reference, tmp_path / "crash")
