"""What the framework integration tests share: a job under ``relaunch run``
whose output goes to files, the stop signal delivered the ways schedulers
deliver it, and the traces the training scripts write (every batch each rank
trained: ``epoch step sample...``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from conftest import wait_for
from test_preemption_loops import descendants

WORKERS = Path(__file__).resolve().parent / "workers"


@dataclass
class Job:
    proc: subprocess.Popen
    out: Path  # the launcher's stdout
    err: Path  # its stderr

    def finish(self, timeout: float = 300) -> tuple[int, str]:
        """Waits for the launcher; its exit code and everything it printed."""
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return self.proc.returncode, self.out.read_text() + self.err.read_text()

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


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
