"""Several `relaunch server` processes on one PostgreSQL database: a job
logging through a list of replicas loses nothing and stores nothing twice
when the replica it uses is SIGKILLed mid-run, and every replica serves the
same data. Needs RELAUNCH_TEST_POSTGRES (scripts/test.sh starts a
throwaway cluster); skipped without it, except under CI."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for
from test_launch_tracking import events, get, series

ADMIN_URL = os.environ.get("RELAUNCH_TEST_POSTGRES")
STEPS = 300

if not ADMIN_URL:
    if os.environ.get("CI"):
        raise RuntimeError("CI runs the replica tests: RELAUNCH_TEST_POSTGRES must be set")
    pytest.skip("RELAUNCH_TEST_POSTGRES is not set (no PostgreSQL)", allow_module_level=True)


def psql(url: str, sql: str) -> None:
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql], check=True)


@pytest.fixture
def database() -> Iterator[str]:
    """A database of its own on the test cluster; its URL."""
    assert ADMIN_URL
    name = f"replicas_{secrets.token_hex(4)}"
    psql(ADMIN_URL, f"CREATE DATABASE {name}")
    parts = urllib.parse.urlsplit(ADMIN_URL)
    yield urllib.parse.urlunsplit(parts._replace(path=f"/{name}"))
    psql(ADMIN_URL, f"DROP DATABASE {name} WITH (FORCE)")


TRAIN = """
    import os, time
    import relaunch
    run = relaunch.init()
    rank = int(os.environ["RANK"])
    for step in range({steps}):
        run.log({{"loss": 1.0 / (step + 1)}}, step=step)
        if step % 50 == 0:
            print(f"rank {{rank}} step {{step}}", flush=True)
        if rank == 0 and step == 100:
            open("halfway", "w").close()
        time.sleep(0.01)
    run.finish(timeout=60)
"""


def test_a_job_logging_through_replicas_survives_one_being_killed(
    tmp_path: Path, database: str
) -> None:
    flags = ("--database", database, "--durability", "process")
    a = TrackingServer(tmp_path / "files-a", *flags)
    b = TrackingServer(tmp_path / "files-b", *flags)
    try:
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(TRAIN.format(steps=STEPS)))
        launch = [sys.executable, "-m", "relaunch", "run", "--nproc-per-node", "2"]
        launch += ["--server", f"{a.url},{b.url}", "--run-id", "replicated"]
        job = subprocess.Popen(
            [*launch, str(script)],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            wait_for(
                lambda: (tmp_path / "halfway").exists() or job.poll() is not None,
                120,
                "the job to be halfway",
            )
            # Mid-run, A is gone without a word; B has the same data so far.
            a.kill()
            _, err = job.communicate(timeout=180)
        finally:
            if job.poll() is None:
                job.send_signal(signal.SIGKILL)
                job.communicate()
        assert job.returncode == 0, err
        run = get(b, "/runs/replicated")
        assert isinstance(run, dict) and run["status"] == "finished", run
        for rank in (0, 1):
            steps = [p["step"] for p in series(b, "replicated", "loss", rank)]
            assert steps == list(range(STEPS)), f"rank {rank}: {len(steps)} steps"
        kinds = [e["kind"] for e in events(b, "replicated")]
        assert kinds.count("start") == 1 and kinds[-1] == "finished", kinds
        lines = get(b, "/runs/replicated/logs", limit=10000)
        assert isinstance(lines, list)
        texts = [line["text"] for line in lines]
        for rank in (0, 1):
            shown = [t for t in texts if t.startswith(f"rank {rank} step ")]
            assert len(shown) == STEPS // 50, shown
        # A second replica started on the same database serves it all too.
        a.start()
        assert get(a, "/runs/replicated") == run
        assert [p["step"] for p in series(a, "replicated", "loss", 1)] == list(range(STEPS))
    finally:
        a.close()
        b.close()
