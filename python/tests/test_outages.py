"""PostgreSQL and S3 stopped and started again under a logging, uploading
job, with two replicas in front of them: requests fail with 503 and say
why, the client keeps spooling, and once the services are back every step
and every file arrives, once. The services are the test's own (stopping
the shared ones would break the other tests)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import TrackingServer, wait_for
from test_launch_tracking import get, series

import relaunch
from relaunch import _services as services

REASON = services.unavailable_reason()
if REASON is not None:
    if os.environ.get("CI"):
        raise RuntimeError(f"CI runs the outage tests, but {REASON}")
    pytest.skip(REASON, allow_module_level=True)


JOB = """
    import os, sys, time
    from pathlib import Path
    import relaunch
    out = Path(sys.argv[1])
    run = relaunch.init(id="outage", server=sys.argv[2], dir=out / "spool")
    step = 0
    while not (out / "stop").exists():
        run.log({"loss": 1.0 / (step + 1)}, step=step)
        if step % 200 == 0:
            data = os.urandom(300_000) + step.to_bytes(8, "little")
            (out / f"f{step}.bin").write_bytes(data)
            run.save_file(out / f"f{step}.bin", f"files/f{step}.bin")
        (out / "step.tmp").write_text(str(step))
        os.replace(out / "step.tmp", out / "step")
        step += 1
        time.sleep(0.01)
    run.finish(timeout=120)
"""


def status_of(server: TrackingServer, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"{server.url}/api/v1{path}", timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_postgres_and_s3_restarted_under_load_lose_nothing(tmp_path: Path) -> None:
    pg = services.Postgres(fsync=False)
    s3: services.Seaweed | None = None
    servers: list[TrackingServer] = []
    try:
        s3 = services.Seaweed("relaunch-outage")
        flags = ("--database", pg.url(), "--blobs", f"s3://{s3.bucket}/outage")
        flags += ("--s3-endpoint", s3.endpoint, "--durability", "process")
        env = {**os.environ, **s3.env}
        for name in ("a", "b"):
            servers.append(TrackingServer(tmp_path / f"data-{name}", *flags, env=env))
        a, b = servers
        out = tmp_path / "job"
        out.mkdir()
        script = textwrap.dedent(JOB)
        job = subprocess.Popen(
            [sys.executable, "-c", script, str(out), f"{a.url},{b.url}"],
            stderr=subprocess.PIPE,
            text=True,
        )
        step = lambda: int((out / "step").read_text()) if (out / "step").exists() else -1  # noqa: E731
        try:
            wait_for(lambda: step() >= 200 or job.poll() is not None, 120, "step 200")
            pg.stop()
            # Both replicas answer 503, saying what is missing; the job goes on.
            for server in (a, b):
                code, body = status_of(server, "/runs/outage")
                assert code == 503, (code, body)
                assert "PostgreSQL" in json.loads(body)["error"], body
            during = step()
            time.sleep(3)
            assert step() > during, "the job is not blocked by the outage"
            pg.start()
            wait_for(lambda: step() >= 600 or job.poll() is not None, 120, "step 600")
            s3.stop()
            time.sleep(3)
            s3.start()
            wait_for(lambda: step() >= 1000 or job.poll() is not None, 120, "step 1000")
            (out / "stop").touch()
            _, err = job.communicate(timeout=300)
        finally:
            if job.poll() is None:
                job.kill()
                job.communicate()
        assert job.returncode == 0, err
        run = get(b, "/runs/outage")
        assert isinstance(run, dict) and run["status"] == "finished", run
        steps = step() + 1
        assert [p["step"] for p in series(a, "outage", "loss")] == list(range(steps))
        files = get(b, "/runs/outage/files")
        assert isinstance(files, list)
        names = sorted(f["name"] for f in files)
        assert names == sorted(f"files/f{s}.bin" for s in range(0, steps, 200)), names
        for name in names:
            base = name.removeprefix("files/")
            got = relaunch.download("outage", name, tmp_path / f"got-{base}", server=b.url)
            sent = (out / base).read_bytes()
            received = got.path.read_bytes()
            assert (len(received), hashlib.sha256(received).hexdigest()) == (
                len(sent),
                hashlib.sha256(sent).hexdigest(),
            ), name
    finally:
        for server in servers:
            server.close()
        if s3 is not None:
            s3.close()
        pg.close()
