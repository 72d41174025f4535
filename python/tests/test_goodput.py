"""Goodput of a real job: `relaunch run --server` with a rank killed once and
the job restarted from an earlier step, read back with ``relaunch.Api``."""

from __future__ import annotations

import subprocess
import textwrap

import pandas as pd
import pytest

import relaunch

# Attempt 0 logs steps 0..14 on both ranks, then rank 0 is killed (SIGKILL,
# as the OOM killer would) while rank 1 waits; attempt 1 resumes at step 10
# (its checkpoint, say) and runs to step 29. A system metric is sampled
# all along: its step is a time, never a training step.
TRAIN = """
    import os, signal, time
    import relaunch
    run = relaunch.init()
    rank = int(os.environ["RANK"])
    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    steps = range(0, 15) if restart == 0 else range(10, 30)
    for step in steps:
        time.sleep(0.05)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    if restart == 0:
        run.flush(timeout=60)
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        while True:
            time.sleep(1)
    run.finish(timeout=60)
"""


@pytest.fixture
def job(relaunch_run, tmp_path):
    """`relaunch run` of TRAIN on two ranks."""

    def start(server_url: str, run_id: str) -> subprocess.Popen:
        train = tmp_path / "train.py"
        train.write_text(textwrap.dedent(TRAIN))
        return relaunch_run(
            "--server", server_url, "--run-id", run_id, "--nproc-per-node", "2",
            "--max-restarts", "1", "--monitor-interval", "0.1",
            "--system-metrics-interval", "0.2", train, cwd=tmp_path,
        )  # fmt: skip

    return start


def test_a_job_killed_once_and_restarted_loses_its_re_run_steps(tracking_server, job):
    proc = job(tracking_server.url, "gp")
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err

    run = relaunch.Api(getattr(tracking_server, "read_url", tracking_server.url)).run("gp")
    assert (run.status, run.attempts) == ("finished", 2)
    g = run.goodput()
    assert not g["running"]
    first, second = g["attempts"]
    assert (first["ended"], second["ended"]) == ("restart", "finished")
    assert (first["first_step"], first["last_step"], first["redone_from"]) == (0, 14, 10)
    assert (second["first_step"], second["last_step"], second["redone_from"]) == (10, 29, None)
    assert g["steps_re_run"] == first["steps_re_run"] == 5  # steps 10 to 14
    assert 0 < g["goodput"] < 1
    assert g["goodput"] == pytest.approx(g["productive_s"] / g["wall_s"])

    # Every attempt's segments, one after another, make the wall time.
    segments = ("startup_s", "productive_s", "rerun_s", "stop_s", "restart_s")
    total = sum(a[s] for a in g["attempts"] for s in segments)
    assert total == pytest.approx(g["wall_s"], abs=1e-6)
    assert g["wall_s"] == pytest.approx(g["ended"] - g["started"], abs=1e-6)
    assert all(a[s] >= 0 for a in g["attempts"] for s in segments)
    for a in g["attempts"]:
        assert a["end"] - a["start"] == pytest.approx(
            a["startup_s"] + a["productive_s"] + a["rerun_s"] + a["stop_s"], abs=1e-6
        )
    # The wall time runs from the first start event to the finished one.
    events = {(e["kind"], e["attempt"]): e["wall"] for e in run.events()}
    assert g["started"] == events[("start", 0)]
    assert g["ended"] == events[("finished", 1)]
    assert first["end"] == events[("restart", 0)]

    # Productive time is what the history says: attempt 0 from its first
    # point (either rank) to its last before step 10, attempt 1 all of it.
    a0 = run.history("loss", layout="long", attempt=0)
    a1 = run.history("loss", layout="long", attempt=1)
    kept = a0[a0["step"] < 10]
    productive = (kept["wall"].max() - a0["wall"].min()) + (a1["wall"].max() - a1["wall"].min())
    assert g["productive_s"] == pytest.approx(productive, abs=1e-6)
    assert first["first_step_at"] == a0["wall"].min()
    assert first["rerun_s"] == pytest.approx(a0["wall"].max() - kept["wall"].max(), abs=1e-6)

    [stop] = g["interruptions"]
    assert (stop["attempt"], stop["reason"], stop["steps_re_run"]) == (0, "restart", 5)
    assert stop["lost_s"] == pytest.approx(
        first["rerun_s"] + first["stop_s"] + first["restart_s"] + second["startup_s"]
    )
    assert stop["lost_s"] > 0

    table = pd.DataFrame(g["attempts"])
    assert list(table["attempt"]) == [0, 1]
    assert list(table["launch_attempt"]) == [0, 1]


def test_a_run_without_steps_has_no_goodput_rather_than_zero(tracking_server):
    with relaunch.init("p", id="events-only", server=tracking_server.url) as r:
        r.event("note", "no steps")
    g = relaunch.Api(tracking_server.url).run("events-only").goodput()
    assert g["goodput"] is None and g["productive_s"] == 0
    assert [a["first_step"] for a in g["attempts"]] == [None]
    assert g["attempts"][0]["ended"] == "finished"
