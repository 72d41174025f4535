"""`relaunch run` as users run it: real PyTorch (gloo, CPU), real signals,
real process trees. Compared with torchrun where torchrun is the reference."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import wait_for

from relaunch._subprocess import alive, children

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
TRAIN = HERE.parents[1] / "examples" / "train.py"
RELAUNCH = [sys.executable, "-m", "relaunch", "run"]


@pytest.fixture
def launcher() -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts `relaunch run ARGS`; kills whatever is left at the end."""
    started: list[subprocess.Popen] = []

    def start(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(
            [*RELAUNCH, *map(str, args)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=cwd,
        )
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()  # its workers die with it (parent-death signal)
        proc.communicate(timeout=30)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- environment ---------------------------------------------------------------


def test_worker_environment_equals_torchruns(launcher, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(sorted(os.environ)))
    torchrun = subprocess.run(
        [
            *(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"),
            *(str(WORKERS / "dump_env.py"), str(base), str(tmp_path / "torchrun")),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert torchrun.returncode == 0, torchrun.stderr
    code, _, err = finish(
        launcher("--nproc-per-node", "2", WORKERS / "dump_env.py", base, tmp_path / "relaunch")
    )
    assert code == 0, err
    varying = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}
    for rank in range(2):
        theirs = json.loads((tmp_path / f"torchrun.{rank}").read_text())
        ours = json.loads((tmp_path / f"relaunch.{rank}").read_text())
        assert set(theirs) <= set(ours), f"missing: {set(theirs) - set(ours)}"
        extra = set(ours) - set(theirs)
        assert extra == {
            "RELAUNCH_RUN_ID",
            "RELAUNCH_ATTEMPT",
            "RELAUNCH_STORE",
            "RELAUNCH_LOG_DIR",
            "RELAUNCH_BEAT_FILE",
            # the checkpoints' memory tier (on by default: /dev/shm)
            "RELAUNCH_SNAPSHOT_DIR",
            "RELAUNCH_SNAPSHOT_MEMORY",
            # torch's NCCL flight recorder, for hang reports (the size under
            # the name this torch reads without a deprecation warning)
            "TORCH_FR_BUFFER_SIZE",
            "TORCH_NCCL_DUMP_ON_TIMEOUT",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
            "TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
        }
        for key in set(theirs) - varying:
            assert ours[key] == theirs[key], f"rank {rank} {key}: {ours[key]!r} vs {theirs[key]!r}"
        assert ours["RELAUNCH_RUN_ID"] == ours["TORCHELASTIC_RUN_ID"]
        assert ours["RELAUNCH_STORE"] == f"localhost:{ours['MASTER_PORT']}"
        assert ours["TORCHELASTIC_ERROR_FILE"].endswith(f"attempt_0/{rank}/error.json")
        assert ours["RELAUNCH_BEAT_FILE"] == os.path.join(ours["RELAUNCH_LOG_DIR"], "beat")


def test_a_plain_gloo_job_prints_nothing_torchrun_would_not(launcher, tmp_path):
    """Regression: relaunch set TORCH_NCCL_TRACE_BUFFER_SIZE, which torch
    2.15 calls deprecated on every rank at init_process_group, gloo on CPU
    included. The console of a plain job is the script's lines and
    relaunch's own, nothing from torch about relaunch's settings."""
    code, out, err = finish(
        launcher("--nproc-per-node", "2", HERE.parents[1] / "examples" / "allreduce.py", "--worker")
    )
    assert code == 0, err
    assert out.count("all_reduce(rank + 1) = 3") == 2, out
    worker_lines = [line for line in err.splitlines() if line.startswith("[default")]
    assert worker_lines == [], err


def test_everything_after_the_script_reaches_the_script(launcher, tmp_path):
    """Regression: a script argument right after the script that matched a
    relaunch flag was taken (`train.py --log_dir ./tb` wrote relaunch's
    logs into ./tb and gave the script only what followed)."""
    script = tmp_path / "argv.py"
    script.write_text("import json, sys\nprint('ARGV', json.dumps(sys.argv[1:]))\n")
    script_args = [
        *("--log_dir", str(tmp_path / "tb"), "--log", "debug", "--server", "http://x:1"),
        *("--nproc-per-node", "9", "-m", "-r", "3", "-t", "3", "--max-restarts=4"),
        *("--role", "r", "--project", "p", "--help", "-h", "--", "--print-config", "--lr", "0.1"),
    ]
    code, out, err = finish(launcher(script, *script_args, cwd=tmp_path))
    assert code == 0, err
    lines = [line for line in out.splitlines() if "ARGV" in line]
    assert lines == [f"[default0]:ARGV {json.dumps(script_args)}"], out
    assert not (tmp_path / "tb").exists()


def test_every_torchrun_flag_is_accepted(tmp_path):
    """Every option of the installed torch's `torchrun --help` (read from
    it, so a flag added upstream fails here until relaunch takes it), in
    every spelling it lists, is accepted by `relaunch run` (nothing is
    started: --print-config); a flag relaunch does not act on says so in
    one line."""
    help_text = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},
    ).stdout
    options = help_text.split("\noptions:\n", 1)[1]
    spellings: dict[str, list[str]] = {}  # spelling -> choices ([] when free)
    for line in options.splitlines():
        if not line.startswith("  -"):
            continue
        spec = line.strip().split("  ", 1)[0]
        for item in spec.split(", "):
            name, _, metavar = item.partition(" ")
            choices = metavar[1:-1].split(",") if metavar.startswith("{") else []
            spellings[name] = choices
    assert "--nproc-per-node" in spellings and "--nproc_per_node" in spellings, help_text
    assert len(spellings) > 50, spellings
    # A value for each option that takes one; an option missing here is new.
    values = {
        "--nnodes": ["1"],
        "--nproc-per-node": ["2"],
        "--rdzv-backend": ["c10d"],
        "--rdzv-endpoint": ["localhost:29400", "--rdzv-backend", "c10d"],
        "--rdzv-id": ["job"],
        "--rdzv-conf": ["join_timeout=60"],
        "--standalone": [],
        "--max-restarts": ["1"],
        "--monitor-interval": ["1"],
        "--start-method": ["spawn"],
        "--event-log-handler": ["console"],
        "--role": ["trainer"],
        "-m": [],
        "--module": [],
        "--no-python": [],
        "--run-path": [],
        "--log-dir": [str(tmp_path / "logs")],
        "-r": ["3"],
        "--redirects": ["0:1"],
        "-t": ["3"],
        "--tee": ["3"],
        "--log-line-prefix-template": ["${rank}:"],
        "--local-ranks-filter": ["0"],
        "--duplicate-stdout-filters": ["loss,step"],
        "--duplicate-stderr-filters": ["error"],
        "--node-rank": ["0"],
        "--master-addr": ["127.0.0.1"],
        "--master-port": ["29555"],
        "--local-addr": ["127.0.0.1"],
        "--logs-specs": ["mine"],
        "--numa-binding": ["node"],
        "--signals-to-handle": ["SIGTERM,SIGUSR1"],
        "--shutdown-timeout": ["10"],
        "--virtual-local-rank": [],
        "--print-completion": ["bash"],
        "-h": [],
        "--help": [],
    }
    unknown = []
    for name, choices in sorted(spellings.items()):
        canonical = name.replace("_", "-") if name.startswith("--") else name
        if canonical not in values:
            unknown.append(name)
            continue
        given = values[canonical]
        for choice in choices or [None]:
            args = [name, *([choice] if choice is not None else given)]
            if choice is not None:
                args += given[1:]
            if canonical not in ("--print-completion", "-h", "--help"):
                args += ["--print-config", "train.py"]
            if canonical == "-m" or canonical == "--module":
                args[-1] = "train"
            proc = subprocess.run(
                [*RELAUNCH, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
            )
            assert proc.returncode == 0, (args, proc.stderr)
            if canonical in ("--event-log-handler", "--logs-specs", "--numa-binding"):
                notes = [line for line in proc.stderr.splitlines() if canonical in line]
                assert len(notes) == 1 and notes[0].startswith("relaunch: warning: "), proc.stderr
    assert not unknown, f"torchrun options relaunch run does not know yet: {unknown}"
    etcd = subprocess.run(
        [*RELAUNCH, "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "localhost:2379", *PRINT],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert etcd.returncode == 0, etcd.stderr
    assert "relaunch needs no etcd server" in etcd.stderr
    assert re.search(r"rendezvous\s+c10d", etcd.stdout), etcd.stdout


PRINT = ("--print-config", "train.py")


def test_duplicate_filters_and_virtual_local_rank_do_what_torchruns_do(launcher, tmp_path):
    script = tmp_path / "say.py"
    script.write_text(
        "import os, sys\n"
        "r = os.environ['RANK']\n"
        "print(f'loss {r}', flush=True); print(f'other {r}', flush=True)\n"
        "print(f'warn, {r}', file=sys.stderr, flush=True)\n"
        'print(f\'LOCAL {os.environ["LOCAL_RANK"]} GPU {os.environ["CUDA_VISIBLE_DEVICES"]}\')\n'
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "5,7"}
    code, out, err = finish(
        launcher(
            *("--nproc-per-node", "2", "--log-dir", tmp_path / "logs"),
            *("--duplicate-stdout-filters", "loss", "--duplicate-stderr-filters", "warn,,"),
            "--virtual-local-rank",
            script,
            env=env,
        )
    )
    assert code == 0, err
    attempt = next((tmp_path / "logs").glob("*/attempt_0"))
    stdout = sorted((attempt / "filtered_stdout.log").read_text().splitlines())
    assert stdout == ["[default0]:loss 0", "[default1]:loss 1"]
    stderr = sorted((attempt / "filtered_stderr.log").read_text().splitlines())
    assert stderr == ["[default0]:warn, 0", "[default1]:warn, 1"]
    assert "[default0]:LOCAL 0 GPU 5" in out and "[default1]:LOCAL 0 GPU 7" in out, out


def test_the_log_directory_is_private(launcher, tmp_path):
    """Regression: the log folder was created with mode 0755 (in /tmp by
    default), so other users of a shared node could read workers' logs."""
    script = tmp_path / "fail.py"
    script.write_text("raise SystemExit(3)\n")
    code, _, err = finish(launcher(script))
    assert code == 1
    match = re.search(r"logs in (\S+)", err)
    assert match, err
    root = Path(match.group(1))
    try:
        assert root.stat().st_mode & 0o777 == 0o700
    finally:
        import shutil

        shutil.rmtree(root, ignore_errors=True)


def test_two_jobs_on_one_machine_get_different_ports(launcher, tmp_path):
    base = tmp_path / "base.json"
    base.write_text(json.dumps(sorted(os.environ)))
    jobs = [launcher(WORKERS / "dump_env.py", base, tmp_path / f"job{i}") for i in range(2)]
    assert [finish(j)[0] for j in jobs] == [0, 0]
    ports = {json.loads((tmp_path / f"job{i}.0").read_text())["MASTER_PORT"] for i in range(2)}
    assert len(ports) == 2


# -- training: multi-node, restarts, preemption ------------------------------------


def test_ddp_as_two_nodes_of_two_processes(launcher, tmp_path):
    port = free_port()
    nodes = [
        launcher(
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--nproc-per-node",
            "2",
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            port,
            "--run-id",
            "two-by-two",
            TRAIN,
            "--ckpt-dir",
            tmp_path / "ckpt",
            "--steps",
            "30",
            "--out",
            tmp_path / "out",
        )
        for rank in range(2)
    ]
    results = [finish(n) for n in nodes]
    for code, _, err in results:
        assert code == 0, err
    assert "[default1]:rank 3/4 attempt 0: starting at step 0" in results[1][1]
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(4)]
    assert [r["step"] for r in reports] == [29] * 4


def test_a_killed_worker_restarts_all_and_the_job_finishes(launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = launcher(
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        TRAIN,
        "--ckpt-dir",
        ckpt,
        "--steps",
        "60",
        "--step-time",
        "0.05",
        "--out",
        tmp_path / "out",
    )
    wait_for(lambda: (ckpt / "step_9.pt").exists(), 120, "the first checkpoint")
    # The launcher's children: its workers, and the warm interpreter.
    workers = [
        pid
        for pid in children(job.pid)
        if b"relaunch._zygote" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(workers) == 2
    os.kill(workers[1], signal.SIGKILL)
    code, out, err = finish(job)
    assert code == 0, err
    assert "root cause" in err and "signal SIGKILL (9)" in err
    assert "restarting all workers" in err
    assert re.search(r"\[default0\]:rank 0/2 attempt 1: starting at step [1-9]\d", out), out
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert [(r["attempt"], r["step"]) for r in reports] == [(1, 59), (1, 59)]


def test_sigterm_stops_every_rank_at_the_same_step(launcher, tmp_path):
    ckpt = tmp_path / "ckpt"
    job = launcher(
        "--nproc-per-node",
        "3",
        TRAIN,
        "--ckpt-dir",
        ckpt,
        "--steps",
        "100000",
        "--step-time",
        "0.02",
        "--out",
        tmp_path / "out",
    )
    wait_for(lambda: (ckpt / "step_19.pt").exists(), 120, "training to be under way")
    job.send_signal(signal.SIGTERM)
    code, _, err = finish(job, timeout=60)
    assert code == 75, err
    assert "preempted" in err
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(3)]
    steps = {r["step"] for r in reports}
    assert len(steps) == 1 and all(r["preempted"] for r in reports), reports
    assert (ckpt / f"step_{steps.pop()}.pt").exists()


def test_sigterm_to_a_script_without_preemption_support_is_reported(launcher, tmp_path):
    job = launcher("--nproc-per-node", "2", WORKERS / "sleeper.py", tmp_path)
    wait_for(lambda: len(list(tmp_path.glob("pid.*"))) == 2, 60, "the workers")
    job.send_signal(signal.SIGTERM)
    code, _, err = finish(job, timeout=60)
    assert code == 128 + signal.SIGTERM, err
    assert "not every worker exited cleanly" in err


def test_sigkill_to_the_launcher_leaves_no_worker(launcher, tmp_path):
    job = launcher("--nproc-per-node", "3", WORKERS / "sleeper.py", tmp_path)
    wait_for(lambda: len(list(tmp_path.glob("pid.*"))) == 3, 60, "the workers")
    pids = [int(p.read_text()) for p in tmp_path.glob("pid.*")]
    assert all(alive(p) for p in pids)
    job.kill()
    job.wait()
    wait_for(lambda: not any(alive(p) for p in pids), 3.0, "the workers to die with the launcher")


def stat_state(pid: int) -> str:
    """The one-letter state in ``/proc/PID/stat`` (``T`` stopped)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def test_a_second_signal_kills_at_once(launcher, tmp_path):
    job = launcher("--shutdown-timeout", "60", WORKERS / "sleeper.py", tmp_path)
    wait_for(lambda: (tmp_path / "pid.0").exists(), 60, "the worker")
    pid = int((tmp_path / "pid.0").read_text())
    # The worker ignores nothing, but make it ignore SIGTERM's default by
    # stopping it: only SIGKILL ends a stopped process.
    os.kill(pid, signal.SIGSTOP)
    # Stopped for real before SIGTERM comes: a SIGTERM that reaches it first
    # (the stop is taken when it next runs) would kill it.
    wait_for(lambda: stat_state(pid) == "T", 30, "the worker to stop")
    job.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    assert alive(pid)
    started = time.monotonic()
    job.send_signal(signal.SIGTERM)
    code, _, err = finish(job, timeout=30)
    assert time.monotonic() - started < 10
    assert code == 128 + signal.SIGTERM, err
    assert not alive(pid)


# -- failures and their report ---------------------------------------------------


def test_a_recorded_failure_is_reported_with_its_traceback(launcher, tmp_path):
    code, _, err = finish(
        launcher("--nproc-per-node", "2", "--log-dir", tmp_path, WORKERS / "recorded_failure.py")
    )
    assert code == 1
    assert "root cause" in err
    assert "rank 1 (local rank 1" in err
    assert "error: ValueError: corrupt batch at step 7 on rank 1" in err
    assert "in load_batch" in err  # the traceback, from the error file
    assert re.search(r"traceback \(from .*/attempt_0/1/error\.json\)", err), err
    assert "giving up after 0 restart(s)" in err


def test_restarts_are_counted_and_exhausted(launcher, tmp_path):
    code, _, err = finish(
        launcher("--nproc-per-node", "2", "--max-restarts", "2", WORKERS / "recorded_failure.py")
    )
    assert code == 1
    assert err.count("root cause") == 3
    assert "attempt 3 of 3" in err
    assert "restarting all workers in 1s (restart 1 of 2)" in err
    assert "restarting all workers in 2s (restart 2 of 2)" in err


# -- logs and console --------------------------------------------------------------


def test_log_files_per_attempt_and_rank(launcher, tmp_path):
    code, _, _ = finish(
        launcher(
            "--nproc-per-node",
            "2",
            "--log-dir",
            tmp_path,
            "--run-id",
            "logs",
            WORKERS / "chatter.py",
            "10",
        )
    )
    assert code == 0
    [run_dir] = tmp_path.glob("logs_*")
    for rank in range(2):
        stdout = (run_dir / "attempt_0" / str(rank) / "stdout.log").read_text().splitlines()
        stderr = (run_dir / "attempt_0" / str(rank) / "stderr.log").read_text().splitlines()
        assert [line.split()[3] for line in stdout] == ["0", "2", "4", "6", "8"]
        assert [line.split()[3] for line in stderr] == ["1", "3", "5", "7", "9"]
        assert stdout[0].startswith(f"rank {rank} line 0 ")  # no prefix in files


def test_console_lines_are_prefixed_and_never_torn(launcher):
    code, out, err = finish(launcher("--nproc-per-node", "4", WORKERS / "chatter.py", "4000"))
    assert code == 0
    pattern = re.compile(r"^\[default(\d)\]:rank (\d) line (\d+) x{150}$")
    worker_lines = [line for line in (out + err).splitlines() if not line.startswith("relaunch:")]
    assert len(worker_lines) == 4 * 4000
    for line in worker_lines:
        m = pattern.match(line)
        assert m and m.group(1) == m.group(2), f"torn or unprefixed: {line[:80]!r}"


def test_redirects_and_rank_filter_keep_lines_off_the_console(launcher, tmp_path):
    _, out, err = finish(
        launcher(
            "--nproc-per-node",
            "2",
            "--local-ranks-filter",
            "1",
            "--log-dir",
            tmp_path,
            WORKERS / "chatter.py",
            "4",
        )
    )
    assert "[default1]:rank 1 line 0" in out and "[default0]:" not in out + err
    _, out, err = finish(
        launcher("--nproc-per-node", "2", "-r", "0:2", WORKERS / "chatter.py", "4")
    )
    assert "[default0]:rank 0 line 0" in out  # stdout of rank 0 still shown
    assert "[default0]:rank 0 line 1" not in err  # its stderr went to the file only
    assert "[default1]:rank 1 line 1" in err


def test_progress_bars_keep_only_their_final_state(launcher, tmp_path):
    code, out, err = finish(
        launcher("--log-dir", tmp_path, "--run-id", "bars", WORKERS / "progress.py", "500")
    )
    assert code == 0
    assert "\r" not in out + err
    assert "[default0]:100%|" + "#" * 30 + "| 500/500" in err
    assert err.count("[default0]:") == 1  # one line for 500 redraws
    [log] = tmp_path.glob("bars_*/attempt_0/0/stderr.log")
    assert log.read_text() == "100%|" + "#" * 30 + "| 500/500\n"


def test_progress_bars_on_a_terminal_stay_readable(tmp_path):
    import pty

    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [*RELAUNCH, "--nproc-per-node", "2", WORKERS / "progress.py", "300"],
        stdout=follower,
        stderr=follower,
        stdin=subprocess.DEVNULL,
    )
    os.close(follower)
    chunks = []
    try:
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:  # the terminal closed
                break
            if not data:
                break
            chunks.append(data)
    finally:
        proc.wait(timeout=60)
        os.close(leader)
    assert proc.returncode == 0
    screen = b"".join(chunks).decode(errors="replace")
    for rank in range(2):
        assert f"[default{rank}]:100%|" in screen
        assert f"[default{rank}]:done" in screen


# -- bad input ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nproc-per-node", "many", "t.py"], "is not a worker count"),
        (["--nnodes", "3:1", "t.py"], "MIN <= MAX"),
        (["--no-python", "-m", "t"], "contradict each other"),
        (["--nnodes", "2", "--node-rank", "5", "--master-addr", "h", "t.py"], "out of range"),
        (["--redirects", "7", "t.py"], "is not a stream code"),
        (["--signals-to-handle", "SIGBOGUS", "t.py"], "is not a signal name"),
        (["--log-dir", "/dev/null", "t.py"], "is not a directory"),
        (["--numa-binding", "cores", "t.py"], "invalid value 'cores' for '--numa-binding"),
        (["--rdzv-backend", "zookeeper", "t.py"], "invalid value 'zookeeper'"),
        (["--hang-timeout=-5", "t.py"], "--hang-timeout -5 is not a number of seconds >= 0"),
        (["--hang-timeout", "soon", "t.py"], "invalid value 'soon' for '--hang-timeout"),
        (["--startup-timeout", "inf", "t.py"], "--startup-timeout inf is not a number of seconds"),
        ([], "TRAINING_SCRIPT"),
    ],
)
def test_bad_flags_fail_before_anything_starts(args, message, tmp_path):
    proc = subprocess.run(
        [*RELAUNCH, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "relaunch: run" not in proc.stderr  # nothing was started


def test_a_missing_program_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [*RELAUNCH, "--no-python", str(tmp_path / "no-such-program")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert "cannot start worker 0" in proc.stderr and "no-such-program" in proc.stderr


def test_a_signal_to_one_node_stops_every_node_at_one_step(launcher, tmp_path):
    port = free_port()
    ckpt = tmp_path / "ckpt"
    nodes = [
        launcher(
            "--nnodes", "2", "--node-rank", rank, "--master-addr", "127.0.0.1",
            "--master-port", port, "--run-id", "cross-node",
            TRAIN, "--ckpt-dir", ckpt, "--steps", "100000", "--step-time", "0.02",
            "--out", tmp_path / "out",
        )
        for rank in range(2)
    ]  # fmt: skip
    wait_for(lambda: (ckpt / "step_19.pt").exists(), 120, "training to be under way")
    nodes[1].send_signal(signal.SIGTERM)  # only node 1 is preempted
    results = [finish(n, timeout=60) for n in nodes]
    assert [code for code, _, _ in results] == [75, 75], [err for _, _, err in results]
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert reports[0]["step"] == reports[1]["step"] and reports[0]["preempted"], reports


def test_preemption_outside_the_launcher_stops_at_the_next_step(tmp_path):
    code = (
        "import os, signal\n"
        "from relaunch import preemption\n"
        "assert not preemption.requested() and not preemption.reached(0)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "assert preemption.requested()\n"
        "print(preemption.reached(1), preemption.reached(2), preemption.stop_step())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAUNCH_", "TORCHELASTIC_"))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "1"]


# -- elastic rendezvous ---------------------------------------------------------


def elastic(launcher, port: int, run_id: str, *train_args, extra=(), conf="last_call_timeout=1"):
    return launcher(
        "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
        "--rdzv-conf", conf, "--monitor-interval", "0.2",
        "--shutdown-timeout", "5", *extra, TRAIN, *train_args,
    )  # fmt: skip


def in_first_round(log_dir: Path) -> None:
    """Waits until the node logging to ``log_dir`` started its workers in
    attempt 0, so the test's fault hits a world both nodes are in. The host
    waits ``last_call_timeout`` for the second node; on a loaded machine a
    node that starts later is admitted at a restart instead (before: that
    restart used up ``--max-restarts 1`` and the fault's restart failed)."""
    wait_for(lambda: any(log_dir.glob("*/attempt_0/0")), 120, "the second node to join attempt 0")


def test_elastic_nodes_join_and_train_together(launcher, tmp_path):
    port = free_port()
    args = ("--ckpt-dir", tmp_path / "ckpt", "--steps", "30", "--out", tmp_path / "out")
    nodes = [elastic(launcher, port, "elastic-join", *args) for _ in range(2)]
    results = [finish(n) for n in nodes]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(4)]
    assert [r["step"] for r in reports] == [29] * 4  # a world of 4: both nodes took part
    # Regression: nodes that meet at localhost are one host, so a hostname
    # that resolves to loopback is no problem; relaunch told them to "pass
    # --local-addr" (a flag that has no effect).
    for _, _, err in results:
        assert "warning: hostname" not in err and "--local-addr" not in err, err


def test_a_late_node_is_admitted_at_the_next_round(launcher, tmp_path):
    port = free_port()
    ckpt = tmp_path / "ckpt"
    args = ("--ckpt-dir", ckpt, "--steps", "120", "--step-time", "0.05", "--out", tmp_path / "out")
    first = elastic(launcher, port, "elastic-late", *args)
    wait_for(lambda: (ckpt / "step_19.pt").exists(), 120, "the first node to train alone")
    second = elastic(launcher, port, "elastic-late", *args)
    results = [finish(n) for n in (first, second)]
    assert [code for code, _, _ in results] == [0, 0], [err for _, _, err in results]
    assert "a node is waiting to join" in results[0][2]
    assert re.search(r"rank 0/2 attempt 0: starting at step 0", results[0][1])
    # After admission: a world of 4 resumed from a checkpoint, not from 0.
    assert re.search(r"rank 3/4 attempt 0: starting at step [1-9]\d", results[0][1] + results[1][1])
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(4)]
    assert [r["step"] for r in reports] == [119] * 4


def two_nodes_training(launcher, tmp_path, run_id: str, conf: str):
    """Two elastic nodes (``--max-restarts 1``) of ``examples/train.py``,
    both in attempt 0 and past step 19: (host, other)."""
    port = free_port()
    ckpt = tmp_path / "ckpt"
    args = ("--ckpt-dir", ckpt, "--steps", "120", "--step-time", "0.05", "--out", tmp_path / "out")
    extra = ("--max-restarts", "1")
    host = elastic(launcher, port, run_id, *args, extra=extra, conf=conf)
    wait_for(lambda: listening(port), 60, "the first node to host the store")
    logs = ("--log-dir", tmp_path / "logs")
    other = elastic(launcher, port, run_id, *args, extra=(*extra, *logs), conf=conf)
    in_first_round(tmp_path / "logs")
    wait_for(lambda: (ckpt / "step_19.pt").exists(), 120, "both nodes to train")
    return host, other


def test_survivors_go_on_when_a_node_dies(launcher, tmp_path):
    host, other = two_nodes_training(launcher, tmp_path, "elastic-lost", "last_call_timeout=5")
    other.kill()  # the node dies: its launcher by SIGKILL, its workers with it
    code, out, err = finish(host)
    assert code == 0, err
    assert "attempt 1: node 0 of 1" in err
    assert re.search(r"rank 0/2 attempt 1: starting at step [1-9]\d", out), out
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert [(r["attempt"], r["step"]) for r in reports] == [(1, 119), (1, 119)]


def test_a_hung_node_is_left_out_after_its_heartbeats_stop(launcher, tmp_path):
    conf = "last_call_timeout=5,keep_alive_timeout=3"
    host, other = two_nodes_training(launcher, tmp_path, "elastic-hung", conf)
    frozen = [other.pid, *children(other.pid)]
    for pid in frozen:  # the node hangs: nothing of it runs, nothing closes
        os.kill(pid, signal.SIGSTOP)
    try:
        code, _, err = finish(host)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
    assert code == 0, err
    assert "node 1 sent no heartbeat for 3s" in err
    assert "attempt 1: node 0 of 1" in err
    reports = [json.loads((tmp_path / f"out.{r}").read_text()) for r in range(2)]
    assert [(r["attempt"], r["step"]) for r in reports] == [(1, 119), (1, 119)]


VOTING = """
import os, sys, time
import torch
import relaunch
from relaunch import preemption

out = sys.argv[1]
rank, attempt = int(os.environ["RANK"]), int(os.environ["RELAUNCH_ATTEMPT"])
# A timeout far past the launcher's grace period: a rank left waiting for a
# lost node's vote would wait it out.
ckpt = relaunch.Checkpointer(os.path.join(out, "ckpt"), save_every=1, timeout=600)
latest = ckpt.latest()
start = 0 if latest is None else latest.step + 1
for step in range(start, start + 100000):
    with ckpt.save(step) as path:
        if path is not None:
            torch.save({"step": step}, path / f"rank{rank}.pt")
    with open(os.path.join(out, f"step.{rank}"), "w") as f:
        f.write(f"{attempt} {step}")
    if attempt > 0 and step >= start + 3:
        break
    if preemption.reached(step):
        sys.exit(0)
    time.sleep(0.05)
"""


def test_a_lost_nodes_peers_end_at_once_instead_of_waiting_out_their_grace(launcher, tmp_path):
    """Two elastic nodes, each rank saving a checkpoint every step; node 1
    freezes (SIGSTOP: its sockets stay open). Node 0's rank is left waiting
    for node 1's vote. Once node 1's heartbeats stop, node 0's launcher says
    in the store that the attempt failed, then sends SIGTERM: the rank gives
    up its vote and ends at once, and the restart goes on without node 1.
    Before, nothing told the rank why the SIGTERM came: it took it for a stop
    request, went on waiting for the vote, and was SIGKILLed only at the end
    of the 60 s grace period."""
    worker = tmp_path / "voting.py"
    worker.write_text(VOTING)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()

    def node(*extra: object) -> subprocess.Popen:
        return launcher(
            "--nnodes", "1:2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "lost-voter",
            "--rdzv-conf", "last_call_timeout=5,keep_alive_timeout=3",
            "--monitor-interval", "0.2", "--shutdown-timeout", "60", "--max-restarts", "1",
            *extra, worker, out,
        )  # fmt: skip

    def step(rank: int) -> tuple[int, int]:
        text = (out / f"step.{rank}").read_text() if (out / f"step.{rank}").exists() else ""
        return tuple(map(int, text.split())) if text else (-1, -1)  # type: ignore[return-value]

    host = node()
    wait_for(lambda: listening(port), 60, "the first node to host the store")
    other = node("--log-dir", tmp_path / "logs")
    in_first_round(tmp_path / "logs")
    wait_for(lambda: min(step(0)[1], step(1)[1]) >= 3, 120, "both nodes to save checkpoints")
    frozen = [other.pid, *children(other.pid)]
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:
        code, _, err = finish(host, timeout=120)
    finally:
        for pid in frozen:
            os.kill(pid, signal.SIGKILL)
        other.wait()
    assert code == 0, err
    assert "node 1 sent no heartbeat for 3s" in err
    assert "sending SIGKILL" not in err, err
    # Ended by the SIGTERM that followed the failure, or by its vote giving
    # up on seeing it: either way, not by the launcher's SIGKILL.
    assert "ending this rank now for the restart" in err or "stopped waiting for" in err, err
    assert "attempt 1: node 0 of 1" in err
    assert step(0)[0] == 1, step(0)


SLOW_TO_EXIT = """
import os, sys, time
from datetime import timedelta
from relaunch import preemption
import torch
import torch.distributed as dist

out = sys.argv[1]
dist.init_process_group("gloo", timeout=timedelta(seconds=60))
rank = dist.get_rank()
t = torch.ones(4)
step = 0
while True:
    dist.all_reduce(t)
    with open(os.path.join(out, f"step.{rank}"), "w") as f:
        f.write(str(step))
    time.sleep(0.05)
    if preemption.reached(step):
        break
    step += 1
with open(os.path.join(out, f"stopped.{rank}"), "w") as f:
    f.write(str(step))
time.sleep(6)  # a slow, clean exit: a last upload, a big checkpoint's fsync
dist.destroy_process_group()
"""


def test_a_node_that_stops_slowly_is_not_taken_for_a_lost_one(launcher, tmp_path):
    """SIGTERM to one node of an elastic job: the ranks of both nodes stop
    at one step, then take 6 s to exit, twice keep_alive_timeout. The
    stopping node's launcher goes on sending its heartbeats through its
    grace period and exit barrier, so the other node waits for its own rank
    instead of restarting without the stopping node: both exit 75 (before:
    "node 0 sent no heartbeat for 3s", a restart, and exit 1 once the
    stopping node took the store away)."""
    worker = tmp_path / "slow_to_exit.py"
    worker.write_text(SLOW_TO_EXIT)
    out = tmp_path / "out"
    out.mkdir()
    port = free_port()

    def node() -> subprocess.Popen:
        return launcher(
            "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "slow-stop",
            "--rdzv-conf", "last_call_timeout=1,keep_alive_timeout=3",
            "--monitor-interval", "0.2", "--shutdown-timeout", "30", "--max-restarts", "1",
            worker, out,
        )  # fmt: skip

    host = node()
    wait_for(lambda: listening(port), 60, "the first node to host the store")
    other = node()

    def step(rank: int) -> int:
        text = (out / f"step.{rank}").read_text() if (out / f"step.{rank}").exists() else ""
        return int(text) if text else -1

    wait_for(lambda: min(step(0), step(1)) >= 5, 120, "both nodes to train")
    host.send_signal(signal.SIGTERM)
    results = [finish(n, timeout=120) for n in (host, other)]
    errs = [err for _, _, err in results]
    assert [code for code, _, _ in results] == [75, 75], errs
    assert not any("sent no heartbeat" in e for e in errs), errs
    assert (out / "stopped.0").read_text() == (out / "stopped.1").read_text()


STOPS_OR_FAILS_ONCE = """
import os, sys, time
from pathlib import Path
from relaunch import preemption
out = Path(sys.argv[1])
mode = sys.argv[2]
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
if mode == "fail-once" and attempt == 0 and os.environ["RANK"] == "1":
    sys.exit(3)
for step in range(100000 if mode == "stop" else 3):
    (out / f"step.{os.environ['RANK']}").write_text(str(step))
    time.sleep(0.05)
    if preemption.reached(step):
        break
"""


def test_reports_name_files_that_outlive_the_job_and_preempted_logs_go_with_the_run(
    launcher, tmp_path
):
    """Issue 34: without --log-dir, a success removed the log folder that
    the failure report of an earlier attempt named, and the folders of
    preempted launches stayed in the temporary directory for good. Now the
    success keeps a folder its reports name (and says so), and removes what
    the run's earlier preempted launches left."""
    script = tmp_path / "job.py"
    script.write_text(STOPS_OR_FAILS_ONCE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp)}
    common = ["--nproc-per-node", "2", "--run-id", "keep", "--max-restarts", "1", script, tmp_path]
    job = launcher(*common, "stop", env=env)
    # Both ranks past their import of relaunch.preemption, which installs
    # the handlers: a rank still importing would die of the SIGTERM.
    wait_for(
        lambda: all((tmp_path / f"step.{rank}").exists() for rank in (0, 1)),
        120,
        "both ranks to be under way",
    )
    job.send_signal(signal.SIGTERM)
    code, _, err = finish(job, timeout=120)
    assert code == 75, err
    (preempted,) = temp.glob("relaunch_keep_*")
    assert (preempted / "preempted").is_file(), sorted(preempted.iterdir())

    code, _, err = finish(launcher(*common, "fail-once", env=env), timeout=120)
    assert code == 0, err
    assert "exit code 3" in err, err
    named = re.findall(r"(/\S+/attempt_0/1/std(?:out|err)\.log)", err)
    assert named, err
    assert all(Path(p).is_file() for p in named), named
    assert "name files in" in err and "kept" in err, err
    assert not preempted.exists(), "the preempted launch's folder is removed"
    assert len(list(temp.glob("relaunch_keep_*"))) == 1
