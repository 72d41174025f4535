"""`relaunch run` as PID 1 of a container (Kubernetes runs the image's
entrypoint so): in a new PID namespace (`unshare --pid --fork
--mount-proc`), it reaps every orphan that exits while the job runs, and
a SIGTERM to it, the way the kubelet stops a pod, stops every rank at an
agreed step and exits 75 within the grace period."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_for

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"


def unshare_or_skip() -> None:
    why = None
    if shutil.which("unshare") is None:
        why = "needs util-linux's unshare"
    elif os.geteuid() != 0:
        why = "needs root to create a PID namespace"
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs as root with util-linux: {why}")
        pytest.skip(why)


def pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def in_namespace(ns: str) -> list[tuple[int, str]]:
    """(host pid, state) of every process in PID namespace `ns`."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != ns:
                continue
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        found.append((int(entry), stat[stat.rfind(")") + 2]))
    return found


def test_as_pid_1_it_reaps_orphans_and_a_sigterm_stops_every_rank_at_one_step(tmp_path):
    unshare_or_skip()
    proc = subprocess.Popen(
        [
            "unshare", "--pid", "--fork", "--mount-proc",
            sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "2",
            "--shutdown-timeout", "20", WORKERS / "pid1_job.py", tmp_path,
        ],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    init = None
    try:
        # unshare forks PID 1 of the namespace: relaunch.
        wait_for(lambda: _children(proc.pid), 30, "PID 1 of the namespace")
        (init,) = _children(proc.pid)
        ns = pid_namespace(init)
        assert ns != pid_namespace(os.getpid())
        wait_for(lambda: (tmp_path / "daemon.exited").exists(), 120, "the daemon to exit")
        # The daemon was reparented to PID 1 and exited: PID 1 reaps it
        # while the job runs (no zombie stays in the namespace).
        wait_for(
            lambda: all(state != "Z" for _, state in in_namespace(ns)),
            10,
            f"no zombie in the namespace: {in_namespace(ns)}",
        )
        time.sleep(0.5)
        os.kill(init, signal.SIGTERM)  # what the kubelet sends PID 1
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            # PID 1 first: its end ends everything in the namespace (and
            # it, not unshare, holds the output pipe open).
            if init is not None:
                try:
                    os.kill(init, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.kill()
            proc.communicate(timeout=30)
    assert proc.returncode == 75, out
    stopped = [int((tmp_path / f"stopped.{r}").read_text()) for r in range(2)]
    assert stopped[0] == stopped[1], stopped  # one agreed step
    assert "every rank stopped at the agreed step (preempted, exit code 75)" in out, out
    assert not in_namespace(ns)  # everything in it is gone


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def doctor_pid1(command: list, tmp_path: Path, **env: str) -> dict:
    """`relaunch doctor`'s PID 1 finding, run by `command` as PID 1 of a new
    PID namespace (the command writes the doctor's JSON to doctor.json)."""
    unshare_or_skip()
    out = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", *command],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, **env},
    )  # fmt: skip
    assert out.returncode in (0, 1), out.stdout + out.stderr
    findings = json.loads((tmp_path / "doctor.json").read_text())
    (pid1,) = [f for f in findings if f["check"] == "pid 1"]
    return pid1


DOCTOR = f"{shlex.quote(sys.executable)} -m relaunch doctor --format json > doctor.json"


def test_doctor_warns_when_a_shell_is_pid_1(tmp_path):
    """`sh -c "relaunch run ...; ..."` as a container's command: the shell
    is PID 1 and does not pass the kubelet's SIGTERM on."""
    pid1 = doctor_pid1(["sh", "-c", f"{DOCTOR}; true"], tmp_path)
    assert pid1["level"] == "warn", pid1
    assert "PID 1 is a shell (sh -c" in pid1["found"], pid1
    assert "exec relaunch run" in pid1["fix"], pid1


def test_doctor_is_content_when_relaunch_run_is_pid_1(tmp_path):
    """`python -m relaunch run` as PID 1 (it execs the native command, which
    keeps the pid): the doctor, run by the job's worker, sees relaunch
    there."""
    script = tmp_path / "doctor_job.py"
    script.write_text(
        f"import subprocess, sys\nsubprocess.run({DOCTOR!r}, shell=True, check=False)\n"
    )
    pid1 = doctor_pid1(
        [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "1", str(script)],
        tmp_path,
    )
    assert pid1["level"] == "ok", pid1
    assert pid1["found"].startswith("relaunch is PID 1"), pid1
    assert "(relaunch run --nproc-per-node 1 " in pid1["found"], pid1
