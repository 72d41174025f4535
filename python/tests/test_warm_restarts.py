"""Warm restarts: `relaunch run` keeps an interpreter that has imported
torch (``relaunch._zygote``), and restarted workers are forked from it.

A warm worker must be a worker like any other to the launcher (its child,
its own session, its output in its logs, killed with the launcher) and to
the script (its argv, its path, ``__main__``, its rank's environment,
DataLoader workers of both start methods), and anything wrong with the
zygote must only make a restart cold, never fail it.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import wait_for

from relaunch import _zygote
from relaunch._subprocess import alive

RELAUNCH = [sys.executable, "-m", "relaunch", "run"]

# A worker that reports what it sees into OUT/seen.ATTEMPT.RANK (whole or
# not at all), runs a collective and DataLoaders of both start methods,
# then does what MODE says.
JOB = r"""
import json, os, pickle, sys, time
preloaded = "torch" in sys.modules  # before this script imports it
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

import relaunch

class Squares(Dataset):
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return torch.tensor([float(i * i)])

def main():
    out, mode = sys.argv[1], sys.argv[2]
    rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
    logs = os.path.dirname(os.path.dirname(os.path.dirname(os.environ["RELAUNCH_BEAT_FILE"])))
    zygote_log = os.path.join(logs, "zygote.log")
    dist.init_process_group("gloo")
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    loaded = []
    for context in ("fork", "spawn"):
        loader = DataLoader(Squares(), batch_size=2, num_workers=1, multiprocessing_context=context,
                            persistent_workers=context == "spawn")
        loaded.append(sorted(float(x) for batch in loader for x in batch.flatten()))
    seen = {
        "warm": os.environ.get("RELAUNCH_WARM_START"), "preloaded": preloaded,
        "argv": sys.argv, "path0": sys.path[0], "name": __name__, "file": __file__,
        "pickled": type(pickle.loads(pickle.dumps(Squares()))).__qualname__,
        "rank_env": os.environ["RANK"], "local_rank": os.environ["LOCAL_RANK"],
        "nice": os.getpriority(os.PRIO_PROCESS, 0), "pid": os.getpid(), "ppid": os.getppid(),
        "sid": os.getsid(0), "sum": total.item(),
        "loaded": loaded, "zygote_vars": [k for k in os.environ if k.startswith("RELAUNCH_ZYGOTE")],
        "stacks": relaunch._stacks._file.name if relaunch._stacks._file else None,
    }
    print(f"rank {rank} attempt {attempt} says hello", flush=True)
    partial = os.path.join(out, f".seen.{attempt}.{rank}")
    with open(partial, "w") as f:
        json.dump(seen, f)
    os.rename(partial, os.path.join(out, f"seen.{attempt}.{rank}"))
    # crash: rank 1 exits 3 in attempt 0 once the zygote is ready; crash-now:
    # without waiting for it; crash-twice: in attempts 0 (once OUT/go exists)
    # and 1 (once a second zygote is ready); crash-sleep: crash, then sleep.
    crash_in = {"crash-twice": ("0", "1"), "crash-unfit": ("0", "1", "2")}.get(mode, ("0",))
    said = " unfit for " if mode == "crash-unfit" else " ready in "
    if attempt in crash_in:
        deadline = time.monotonic() + 120
        while mode != "crash-now" and time.monotonic() < deadline:
            ready = os.path.exists(zygote_log) and open(zygote_log).read().count(said)
            go = mode != "crash-twice" or attempt != "0" or os.path.exists(os.path.join(out, "go"))
            if ready > int(attempt) and go:
                break
            time.sleep(0.05)
        if int(rank) == int(os.environ["WORLD_SIZE"]) - 1:
            sys.exit(3)
        time.sleep(600)
    if mode == "crash-sleep":
        time.sleep(600)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
"""


@pytest.fixture
def job(tmp_path: Path) -> Path:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return script


@pytest.fixture
def launcher(relaunch_run, tmp_path: Path) -> Callable[..., subprocess.Popen]:
    """Starts `relaunch run ARGS` with its logs under the test's folder."""

    def start(*args: object, env: dict[str, str] | None = None) -> subprocess.Popen:
        return relaunch_run("--log-dir", tmp_path / "logs", *args, env=env)

    return start


def seen(out: Path, attempt: int, rank: int) -> dict:
    return json.loads((out / f"seen.{attempt}.{rank}").read_text())


def zygote_log(tmp_path: Path) -> Path:
    [log] = (tmp_path / "logs").glob("*/zygote.log")
    return log


def test_restarted_workers_are_forked_warm_and_run_the_script_as_a_cold_start_does(
    launcher, job, tmp_path
):
    proc = launcher("--nproc-per-node", "2", "--max-restarts", "1", job, tmp_path, "crash")
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "2 worker(s) started warm, forked from an interpreter that had imported torch" in err
    cold = {rank: seen(tmp_path, 0, rank) for rank in (0, 1)}
    warm = {rank: seen(tmp_path, 1, rank) for rank in (0, 1)}
    for rank in (0, 1):
        assert cold[rank]["warm"] is None and not cold[rank]["preloaded"]
        assert warm[rank]["warm"] == "1" and warm[rank]["preloaded"]
        # The script sees what a cold start gives it.
        for same in (
            "argv",
            "path0",
            "name",
            "file",
            "pickled",
            "rank_env",
            "local_rank",
            "loaded",
        ):
            assert warm[rank][same] == cold[rank][same], same
        assert warm[rank]["rank_env"] == str(rank)
        assert warm[rank]["sum"] == 1.0
        assert warm[rank]["loaded"] == [[0.0, 1.0, 4.0, 9.0, 16.0, 25.0]] * 2
        assert warm[rank]["zygote_vars"] == []
        # The launcher's own child, in a session of its own, as a cold worker.
        assert warm[rank]["ppid"] == proc.pid
        assert warm[rank]["sid"] == warm[rank]["pid"]
        # Its output went to its rank's log and the console.
        logs = next((tmp_path / "logs").glob(f"*/attempt_1/{rank}/stdout.log"))
        assert f"rank {rank} attempt 1 says hello" in logs.read_text()
        assert f"[default{rank}]:rank {rank} attempt 1 says hello" in out
    log = zygote_log(tmp_path).read_text()
    assert " ready in " in log and "imported torch" in log
    # The zygote is gone with the launcher.
    zygote = int(log.split("relaunch zygote ")[1].split(":")[0])
    wait_for(lambda: not alive(zygote), 10, "the warm interpreter to exit")


def test_a_lone_warm_worker_gets_its_own_files_not_the_first_attempts(launcher, job, tmp_path):
    """With one rank, every variable is the same for all ranks: the zygote
    still starts without the rank's and the attempt's (its beat record, its
    stack dump file), which the warm worker then takes as its own."""
    proc = launcher("--nproc-per-node", "1", "--max-restarts", "1", job, tmp_path, "crash")
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "1 worker(s) started warm" in err
    cold, warm = seen(tmp_path, 0, 0), seen(tmp_path, 1, 0)
    assert warm["warm"] == "1"
    assert cold["stacks"].endswith("/attempt_0/0/stacks.txt")
    assert warm["stacks"].endswith("/attempt_1/0/stacks.txt")


def test_killing_the_launcher_takes_warm_workers_and_the_zygote_with_it(launcher, job, tmp_path):
    proc = launcher("--nproc-per-node", "2", "--max-restarts", "1", job, tmp_path, "crash-sleep")
    # The second attempt's workers are warm and sleep.
    wait_for(
        lambda: all((tmp_path / f"seen.1.{rank}").exists() for rank in (0, 1)),
        240,
        "both warm workers to report",
    )
    pids = [seen(tmp_path, 1, rank)["pid"] for rank in (0, 1)]
    zygote = int(zygote_log(tmp_path).read_text().split("relaunch zygote ")[1].split(":")[0])
    assert all(alive(pid) for pid in [*pids, zygote])
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    wait_for(
        lambda: not any(alive(pid) for pid in [*pids, zygote]), 20, "workers and zygote to die"
    )


def test_a_dead_zygote_makes_one_restart_cold_and_the_next_warm_again(launcher, job, tmp_path):
    """The zygote is killed while the first attempt runs: the first restart
    says it starts cold and why, starts a new zygote, and the restart after
    it is warm."""
    proc = launcher("--nproc-per-node", "2", "--max-restarts", "2", job, tmp_path, "crash-twice")
    wait_for(lambda: (tmp_path / "seen.0.1").exists(), 240, "the first attempt to report")
    wait_for(lambda: list((tmp_path / "logs").glob("*/zygote.log")), 60, "the zygote's log")
    wait_for(
        lambda: " ready in " in zygote_log(tmp_path).read_text(), 120, "the zygote to be ready"
    )
    first = int(zygote_log(tmp_path).read_text().split("relaunch zygote ")[1].split(":")[0])
    os.kill(first, signal.SIGKILL)
    (tmp_path / "go").touch()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert "no warm restart this time: the warm interpreter exited with signal SIGKILL" in err
    assert seen(tmp_path, 1, 0)["warm"] is None
    assert seen(tmp_path, 2, 0)["warm"] == "1" and seen(tmp_path, 2, 1)["warm"] == "1"
    assert zygote_log(tmp_path).read_text().count(" ready in ") == 2


def test_a_zygote_unfit_three_times_leaves_restarts_cold(launcher, job, tmp_path):
    """An installed module that starts a Python thread at import makes the
    zygote unfit (a fork would not carry the thread): each restart says so
    and starts cold, and after three tries the launcher stops trying."""
    site = tmp_path / "user" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    site = site / "site-packages"
    site.mkdir(parents=True)
    (site / "threader.py").write_text(
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='poller', daemon=True).start()\n"
    )
    script = tmp_path / "unfit.py"
    script.write_text(
        job.read_text().replace("import relaunch\n", "import relaunch\nimport threader\n")
    )
    env = {"PYTHONUSERBASE": str(tmp_path / "user"), "PYTHONPATH": str(site)}
    proc = launcher(
        *("--nproc-per-node", "2", "--max-restarts", "3", script, tmp_path, "crash-unfit"), env=env
    )
    _, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err
    said = r"no warm restart this time: importing torch\b.*\bthreader started Python threads "
    said += r"\(poller\)"
    assert len(re.findall(said, err)) == 3, err
    assert err.count("starting a new warm interpreter") == 2, err
    assert "the warm interpreter failed 3 times" in err
    assert "started warm" not in err
    assert all(seen(tmp_path, attempt, 0)["warm"] is None for attempt in range(4))
    assert zygote_log(tmp_path).read_text().count("unfit for warm restarts") == 3


def test_off_means_every_worker_starts_cold(launcher, job, tmp_path):
    config = subprocess.run(
        [*RELAUNCH, "--print-config", "--max-restarts", "1", "--warm-restarts", "off", job],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "warm_restarts" in config and "off" in config.split("warm_restarts")[1].splitlines()[0]
    unused = subprocess.run(
        [*RELAUNCH, "--print-config", job], capture_output=True, text=True, check=True
    ).stdout
    assert "on (unused: --max-restarts 0 never restarts)" in unused
    proc = launcher(
        *("--nproc-per-node", "2", "--max-restarts", "1", "--warm-restarts", "off"),
        *(job, tmp_path, "crash-now"),
    )
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert "started warm" not in err
    assert not list((tmp_path / "logs").glob("*/zygote.log"))
    assert seen(tmp_path, 1, 0)["warm"] is None and seen(tmp_path, 1, 1)["warm"] is None


def test_top_level_imports_are_what_the_script_imports_first():
    source = """
from __future__ import annotations
import os, numpy as np
import torch.nn
from transformers import AutoModel
from . import sibling
try:
    import apex
except ImportError:
    apex = None
if __name__ == "__main__":
    import lightning
def f():
    import pandas
import os
"""
    assert _zygote.top_level_imports(source) == [
        "__future__",
        "os",
        "numpy",
        "torch.nn",
        "transformers",
        "apex",
    ]


def test_the_jobs_own_modules_are_left_to_the_worker(tmp_path, monkeypatch):
    """Installed code is preloaded (a virtual environment inside the job's
    folder too); the job's own modules are imported by the worker, with its
    rank's environment."""
    (tmp_path / "mymodel.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    installed = _zygote._installed_dirs()
    assert not _zygote._is_third_party("mymodel", installed)
    assert _zygote._is_third_party("json", installed)
    assert _zygote._is_third_party("torch.nn", installed)
    assert not _zygote._is_third_party("no_such_module_anywhere", installed)


def test_a_bad_request_is_answered_and_the_zygote_serves_on(tmp_path):
    """The zygote answers a malformed request with an error instead of
    dying, and exits when the launcher's end closes."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    script = tmp_path / "s.py"
    script.write_text("import json\n")
    zygote = subprocess.Popen(
        [sys.executable, "-u", "-m", "relaunch._zygote"],
        env={
            **os.environ,
            "RELAUNCH_ZYGOTE_FD": str(theirs.fileno()),
            "RELAUNCH_ZYGOTE_SCRIPT": str(script),
            "RELAUNCH_WARM_IMPORTS": "email.mime.text, ",
        },
        pass_fds=[theirs.fileno()],
        stderr=subprocess.PIPE,
        text=True,
    )
    theirs.close()
    try:
        ours.settimeout(120)
        ready = json.loads(ours.recv(1 << 20))
        # torch, what DDP imports when built, what the user named.
        assert ready["ready"]["imported"][:3] == ["torch", "torch._dynamo", "email.mime.text"]
        for bad in (b"not json", b'{"env": {}}', b'{"env": {}, "launcher": 1}'):
            ours.send(bad)
            answer = json.loads(ours.recv(1 << 20))
            assert answer["error"].startswith("bad request"), answer
        ours.close()
        assert zygote.wait(timeout=30) == 0
        assert "ready in" in zygote.stderr.read()
    finally:
        if zygote.poll() is None:
            zygote.kill()
            zygote.wait()
