"""`relaunch run --server`: the job as a run of a real `relaunch server`.

Real launcher, real workers using `relaunch.init()` from the environment the
launcher gives them, real signals; everything read back through the
server's HTTP API as a user (or the dashboard) would.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for

RELAUNCH = [sys.executable, "-m", "relaunch"]


def get(server: TrackingServer, path: str, **query: object) -> object:
    # A replicated server is read through another replica than the one written to.
    url = f"{getattr(server, 'read_url', server.url)}/api/v1{path}"
    if query:
        url += "?" + urllib.parse.urlencode(query)
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


@pytest.fixture
def launch(relaunch_run, tmp_path: Path) -> Callable[..., subprocess.Popen]:
    """Starts `relaunch run ARGS` in tmp_path."""

    def start(*args: object, env: dict | None = None) -> subprocess.Popen:
        return relaunch_run(*args, env=env, cwd=tmp_path)

    return start


def script(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def series(server: TrackingServer, run: str, key: str, rank: int = 0) -> list[dict]:
    data = get(server, f"/runs/{run}/series", key=key, rank=rank, buckets=100000)
    assert isinstance(data, dict)
    return data["points"]


def events(server: TrackingServer, run: str) -> list[dict]:
    data = get(server, f"/runs/{run}/events")
    assert isinstance(data, list)
    return data


FAILS_ONCE = """
    import os, sys, time
    import relaunch
    run = relaunch.init(config={"lr": 0.01})
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # Rank 1 fails only once rank 0 has printed its steps (the failure stops
    # rank 0; under load it could otherwise be stopped before step 0).
    printed = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank0-printed")
    for step in range(20):
        run.log({"loss": 1.0 / (step + 1) + restart}, step=step)
        print(f"rank {rank} attempt {restart} step {step}", flush=True)
    if rank == 0 and restart == 0:
        open(printed, "w").close()
    if rank == 1 and restart == 0:
        while not os.path.exists(printed):
            time.sleep(0.05)
        raise RuntimeError("boom on rank 1")
    run.finish()
"""


def test_a_job_logs_its_status_restarts_root_cause_lines_and_system_metrics(
    tracking_server, launch, tmp_path
):
    server = tracking_server
    train = script(tmp_path, "train.py", FAILS_ONCE)
    proc = launch(
        "--server", server.url, "--project", "demo", "--run-id", "job-a",
        "--nproc-per-node", "2", "--max-restarts", "1",
        "--system-metrics-interval", "0.2", train,
    )  # fmt: skip
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err

    run = get(server, "/runs/job-a")
    assert isinstance(run, dict)
    assert (run["project"], run["status"], run["attempts"]) == ("demo", "finished", 2), run
    assert run["config"] == {"lr": 0.01}  # from the ranks' init(config=...)

    kinds = [(e["kind"], e["attempt"]) for e in events(server, "job-a")]
    assert kinds == [
        ("start", 0),
        ("worker_failed", 0),
        ("restart", 0),
        ("start", 1),
        ("finished", 1),
    ], kinds
    failed = next(e for e in events(server, "job-a") if e["kind"] == "worker_failed")
    assert "RuntimeError: boom on rank 1" in failed["text"]
    assert failed["data"]["rank"] == 1 and failed["data"]["exit"] == "exit code 1"

    # Each rank's values, the resumed attempt's shown for every step.
    for rank in (0, 1):
        points = series(server, "job-a", "loss", rank)
        assert [p["step"] for p in points] == list(range(20))
        assert all(p["attempt"] == 1 for p in points)
        assert [p["value"] for p in points] == [1.0 / (s + 1) + 1 for s in range(20)]
    attempt0 = get(server, "/runs/job-a/series", key="loss", rank=1, attempt=0, buckets=1000)
    assert isinstance(attempt0, dict)
    assert [p["value"] for p in attempt0["points"]] == [1.0 / (s + 1) for s in range(20)]

    # Console lines: every rank's, both attempts, stderr marked.
    lines = get(server, "/runs/job-a/logs", limit=10000)
    assert isinstance(lines, list)
    stdout = {(ln["rank"], ln["text"]) for ln in lines if ln["stream"] == "stdout"}
    for attempt in (0, 1):
        for rank in (0, 1):
            for step in range(20):
                assert (rank, f"rank {rank} attempt {attempt} step {step}") in stdout
    stderr = [ln["text"] for ln in lines if ln["stream"] == "stderr" and ln["rank"] == 1]
    assert "RuntimeError: boom on rank 1" in stderr

    # The node's system metrics, as rank 0 (its node rank).
    memory = series(server, "job-a", "system/memory_percent")
    assert memory and all(0 < p["value"] <= 100 for p in memory)
    keys = get(server, "/runs/job-a/keys")
    assert isinstance(keys, list) and "system/cpu_percent" in keys


PREEMPTIBLE = """
    import os, time
    import relaunch
    from relaunch import preemption
    run = relaunch.init()
    start = int(open("ckpt").read()) if os.path.exists("ckpt") else 0
    for step in range(start, 200):
        run.log({"x": step}, step=step)
        if step == start + 5:
            open("running", "w").close()
        time.sleep(0.02)
        if preemption.reached(step):
            open("ckpt", "w").write(str(step + 1))
            preemption.saved("ckpt")
            break
    run.finish()
"""


def test_a_preempted_job_relaunched_with_its_run_id_continues_the_same_run(
    tracking_server, launch, tmp_path
):
    server = tracking_server
    train = script(tmp_path, "train.py", PREEMPTIBLE)
    args = ("--server", server.url, "--run-id", "job-b", "--nproc-per-node", "1", train)
    first = launch(*args)
    wait_for(lambda: (tmp_path / "running").exists(), 60, "the job to run")
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=60)
    assert first.returncode == 75, err
    run = get(server, "/runs/job-b")
    assert isinstance(run, dict) and run["status"] == "preempted", run
    stopped_at = int((tmp_path / "ckpt").read_text())
    assert 0 < stopped_at < 200

    second = launch(*args)
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    run = get(server, "/runs/job-b")
    assert isinstance(run, dict)
    assert (run["status"], run["attempts"]) == ("finished", 2), run
    points = series(server, "job-b", "x")
    assert [p["step"] for p in points] == list(range(200))  # every step once
    assert {p["attempt"] for p in points if p["step"] < stopped_at} == {0}
    assert {p["attempt"] for p in points if p["step"] >= stopped_at} == {1}
    kinds = [e["kind"] for e in events(server, "job-b")]
    assert kinds == ["start", "preempted", "start", "finished"], kinds


def test_with_the_server_down_the_job_runs_and_sync_ships_it_later(
    tracking_servers, launch, tmp_path
):
    # No finish(): the interpreter's exit waits RELAUNCH_EXIT_TIMEOUT and
    # leaves the rest in the spool; an outage never fails the training.
    body = FAILS_ONCE.replace("rank == 1 and", "False and").replace("run.finish()", "")
    train = script(tmp_path, "train.py", body)
    server = tracking_servers()
    assert server.stop() == 0  # its port now answers nothing
    proc = launch(
        "--server", server.url, "--run-id", "job-c", "--nproc-per-node", "2",
        "--system-metrics-interval", "0", train,
        env={"RELAUNCH_EXIT_TIMEOUT": "1"},
    )  # fmt: skip
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err  # training never waited on the server
    assert "relaunch sync" in err and "kept in" in err, err
    # The default spool directory is the user's state directory, not the
    # working directory (the conftest gives each test its own).
    spools = tmp_path / "xdg-state" / "relaunch" / "runs"
    assert (spools / "job-c").is_dir()
    assert not (tmp_path / "relaunch-runs").exists()

    server.start()
    # Without DIR, `relaunch sync` ships the default directory.
    sync = subprocess.run(
        [*RELAUNCH, "sync", "--server", server.url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sync.returncode == 0, sync.stdout + sync.stderr
    assert str(spools) in sync.stdout, sync.stdout
    run = get(server, "/runs/job-c")
    assert isinstance(run, dict) and run["status"] == "finished", run
    for rank in (0, 1):
        assert [p["step"] for p in series(server, "job-c", "loss", rank)] == list(range(20))
    lines = get(server, "/runs/job-c/logs", limit=10000)
    assert isinstance(lines, list)
    assert len([ln for ln in lines if ln["stream"] == "stdout"]) == 40


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes", "2", "--master-addr", "127.0.0.1"], "needs --run-id"),
        (["--server", "ftp://x"], "--server"),
        (["--project", "../up"], "--project"),
        (["--system-metrics-interval=-1"], "--system-metrics-interval"),
    ],
)
def test_bad_tracking_flags_fail_before_anything_starts(args, message, tmp_path):
    if "--server" not in args:
        args = ["--server", "http://127.0.0.1:9", *args]
    proc = subprocess.run(
        [*RELAUNCH, "run", *args, "train.py"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "relaunch: run" not in proc.stderr
