"""relaunch.start_processes: torch's (and llutil's) start_processes API on
the launcher's own process handling. Scripts run in a child interpreter, as
a user's main module would, so the spawn method re-imports them and the
console they print to is the test's to read."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import wait_for

import relaunch
from relaunch._subprocess import alive
from relaunch.processes import Std

SCRIPT = """
import json, os, sys, time
import relaunch
from relaunch.processes import Std

def work(x, fail=False, sleep=0.0):
    print(f"out {os.environ['RANK']} {x}", flush=True)
    print(f"err {os.environ['RANK']}", file=sys.stderr, flush=True)
    time.sleep(sleep)
    if fail:
        raise ValueError(f"rank {os.environ['RANK']} fails on purpose")
    return {"rank": int(os.environ["RANK"]), "twice": x * 2, "pid": os.getpid()}

if __name__ == "__main__":
    method, log_dir = sys.argv[1], sys.argv[2]
    ARGS
"""


def run(tmp_path: Path, body: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(SCRIPT).replace(
            "ARGS", textwrap.dedent(body).strip().replace("\n", "\n    ")
        )
    )
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("method", ["spawn", "fork", "forkserver"])
def test_functions_return_values_with_their_environment_logs_and_prefixes(tmp_path, method):
    body = """
    ctx = relaunch.start_processes(
        "work", work, args={0: (1,), 1: (2,)}, envs={0: {"RANK": "0"}, 1: {"RANK": "1"}},
        log_dir=log_dir, start_method=method, redirects={1: Std.ERR})
    pids = ctx.pids()
    result = ctx.wait()
    print("RESULT", json.dumps({
        "values": result.return_values, "failures": len(result.failures), "pids": pids,
        "stdouts": result.stdouts, "stderrs": result.stderrs}))
    """
    out = run(tmp_path, body, method, str(tmp_path / "logs"))
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
    got = json.loads(line[len("RESULT ") :])
    assert got["failures"] == 0
    values = {int(k): v for k, v in got["values"].items()}
    assert [values[r]["twice"] for r in (0, 1)] == [2, 4]
    assert [values[r]["pid"] for r in (0, 1)] == [got["pids"][str(r)] for r in (0, 1)]
    assert os.getpid() not in [values[r]["pid"] for r in (0, 1)]
    # Prefixed on the console, whole lines; rank 1's stderr redirected to its file only.
    assert "[work0]:out 0 1" in out.stdout and "[work1]:out 1 2" in out.stdout, out.stdout
    assert "[work0]:err 0" in out.stderr and "[work1]:err 1" not in out.stderr, out.stderr
    for rank in (0, 1):
        assert Path(got["stdouts"][str(rank)]).read_text() == f"out {rank} {rank + 1}\n"
        assert Path(got["stderrs"][str(rank)]).read_text() == f"err {rank}\n"
    assert oct(Path(got["stdouts"]["0"]).parents[1].stat().st_mode & 0o777) == oct(0o700)


def test_a_failure_ends_the_others_and_reports_its_traceback(tmp_path):
    body = """
    ctx = relaunch.start_processes(
        "work", work, args={0: (1, False, 60.0), 1: (2, True)},
        envs={0: {"RANK": "0"}, 1: {"RANK": "1"}}, log_dir=log_dir, start_method=method)
    result = ctx.wait()
    f = result.failures[1]
    print("RESULT", json.dumps({"ranks": sorted(result.failures), "exit": f.exitcode,
                                "message": f.message, "traceback": f.traceback,
                                "values": sorted(result.return_values)}))
    """
    out = run(tmp_path, body, "spawn", str(tmp_path / "logs"))
    assert out.returncode == 0, out.stderr
    got = json.loads(next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert got["ranks"] == [1] and got["exit"] == 1, got
    assert got["message"] == "ValueError: rank 1 fails on purpose", got
    assert "in work" in got["traceback"], got
    assert got["values"] == [], got  # rank 0 was stopped: no result, no failure


def test_programs_redirects_a_timeout_and_close_with_a_grace_period(tmp_path):
    stubborn = tmp_path / "stubborn.sh"
    stubborn.write_text(
        "#!/bin/sh\ntrap 'echo got TERM' TERM\necho started\nwhile :; do sleep 0.1; done\n"
    )
    stubborn.chmod(0o755)
    ctx = relaunch.start_processes(
        "prog", str(stubborn), args={0: (), 1: ()}, envs={0: {}, 1: {}},
        log_dir=tmp_path / "logs", redirects=Std.ALL,
    )  # fmt: skip
    logs = [tmp_path / "logs" / p for p in os.listdir(tmp_path / "logs")]
    stdout = [logs[0] / str(r) / "stdout.log" for r in (0, 1)]
    wait_for(lambda: all(p.exists() and "started" in p.read_text() for p in stdout), 30, "start")
    assert ctx.wait(timeout=0) is None  # still running
    pids = ctx.pids()
    ctx.close(death_sig=signal.SIGTERM, timeout=1)  # they ignore it: SIGKILL after 1 s
    assert not any(alive(pid) for pid in pids.values())
    for path in stdout:
        assert path.read_text() == "started\ngot TERM\n"
    result = ctx.wait()
    assert {r: f.signal_name() for r, f in result.failures.items()} == {0: "SIGKILL", 1: "SIGKILL"}


def test_processes_die_with_the_interpreter_that_started_them(tmp_path):
    """The parent-death signal: SIGKILL to the Python process that started
    them leaves none behind, whatever the start method."""
    body = """
    ctxs = [relaunch.start_processes(
        "w" + m, work, args={0: (1, False, 600.0)}, envs={0: {"RANK": "0"}},
        log_dir=log_dir, start_method=m) for m in ("spawn", "fork")]
    print("PIDS", json.dumps([p for c in ctxs for p in c.pids().values()]), flush=True)
    time.sleep(600)
    """
    script = tmp_path / "main.py"
    script.write_text(
        textwrap.dedent(SCRIPT).replace(
            "ARGS", textwrap.dedent(body).strip().replace("\n", "\n    ")
        )
    )
    proc = subprocess.Popen(
        [sys.executable, str(script), "spawn", str(tmp_path / "logs")],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        line = ""
        while not line.startswith("PIDS "):
            line = proc.stdout.readline()
            assert line, "the script ended before starting its processes"
        pids = json.loads(line[5:])
        assert len(pids) == 2 and all(alive(p) for p in pids)
        proc.kill()
        proc.wait(30)
        wait_for(lambda: not any(alive(p) for p in pids), 30, "the processes to die")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_bad_arguments_say_what_is_wrong(tmp_path):
    def start(**kw):
        base = {"name": "x", "entrypoint": "/bin/true", "args": {0: ()}, "envs": {0: {}}}
        return relaunch.start_processes(**{**base, "log_dir": tmp_path, **kw})

    with pytest.raises(ValueError, match="start_method='threads': choose one of spawn, fork"):
        start(start_method="threads")
    with pytest.raises(ValueError, match=r"envs must have the keys 0\.\.1"):
        start(args={0: (), 1: ()}, envs={0: {}})
    with pytest.raises(ValueError, match="args is empty"):
        start(args={}, envs={})
    with pytest.raises(ValueError, match="redirects=7"):
        start(redirects=7)
    with pytest.raises(relaunch.ProcessStartError, match="no-such-program"):
        start(entrypoint=str(tmp_path / "no-such-program"))
