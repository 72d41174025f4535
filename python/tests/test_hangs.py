"""Hangs: a job that stops making progress without dying. `relaunch run`
finds it from the ranks' progress beats, takes every rank's Python stacks
(py-spy, else the rank's own faulthandler dump, else its stderr), names
the rank that stopped first, writes the report and restarts the job. Real
PyTorch (gloo), a spawn DataLoader in every rank, real signals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import wait_for

HERE = Path(__file__).resolve().parent
WORKERS = HERE / "workers"
RELAUNCH = [sys.executable, "-m", "relaunch", "run"]
VENV_BIN = str(Path(sys.executable).parent)


def run(args: list, env: dict, timeout: float = 240) -> tuple[int, str]:
    """`relaunch run ARGS` to its end; its code and its console (both streams)."""
    proc = subprocess.run(
        [*RELAUNCH, *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return proc.returncode, proc.stdout


def env_with(**changes: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_")}
    env.update(changes)
    return env


def hang_report(logs: Path, attempt: int = 0) -> dict:
    found = list(logs.glob(f"*/attempt_{attempt}/hang.json"))
    assert len(found) == 1, f"no single hang.json for attempt {attempt} under {logs}: {found}"
    return json.loads(found[0].read_text())


def py_spy_or_skip() -> None:
    if shutil.which("py-spy", path=VENV_BIN) is None:
        if os.environ.get("CI"):
            pytest.fail("py-spy is missing from the virtual environment (requirements-dev.txt)")
        pytest.skip("py-spy is not installed in this virtual environment")


@pytest.mark.parametrize("stacks_by", ["py-spy", "faulthandler"])
def test_a_rank_stuck_while_the_others_wait_in_a_collective_is_named_and_the_job_restarts(
    stacks_by, tracking_server, tmp_path
):
    if stacks_by == "py-spy":
        py_spy_or_skip()
        env = env_with(PATH=f"{VENV_BIN}:{os.environ['PATH']}")
    else:
        env = env_with(RELAUNCH_PY_SPY="off")
    logs = tmp_path / "logs"
    code, console = run(
        [
            "--nproc-per-node", "3", "--hang-timeout", "10", "--max-restarts", "1",
            "--log-dir", logs, "--server", tracking_server.url, "--run-id", f"hang-{stacks_by}",
            WORKERS / "hang_collective.py", tmp_path, "--stuck-rank", "1", "--stuck-step", "3",
        ],
        env,
    )  # fmt: skip
    assert code == 0, console
    assert (tmp_path / "done.1").exists(), console  # the restarted attempt ran to the end
    assert not (tmp_path / "done.0").exists()

    report = hang_report(logs)
    assert report["kind"] == "silent"
    # The ranks stopped beating at the same moment (all finished step 2):
    # the stacks say which one the others wait for.
    assert report["first_rank"] == 1, report
    assert report["first_by"] == "stacks", report
    assert report["hang_timeout_s"] == 10
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert sorted(by_rank) == [0, 1, 2]
    for r in by_rank.values():
        assert r["stacks_by"] == stacks_by, r
        assert r["last_step"] == 2, r  # every rank finished step 2, none step 3
        stack = Path(r["stack_file"]).read_text()
        assert "hang_collective.py" in stack, stack
    assert "stuck_loading_a_batch" in by_rank[1]["where"], by_rank[1]
    assert "stuck_loading_a_batch" in Path(by_rank[1]["stack_file"]).read_text()
    groups = {g["ranks"]: g["where"] for g in report["groups"]}
    assert set(groups) == {"0,2", "1"}, groups
    assert "all_reduce" in groups["0,2"], groups
    # The console says it, and the restart follows.
    assert "rank 1 is the one the others wait for" in console, console
    assert "ranks 0,2: in all_reduce" in console, console
    assert "restarting all workers" in console, console

    # The run has a `hang` event with the same report.
    base = getattr(tracking_server, "read_url", tracking_server.url)
    url = f"{base}/api/v1/runs/hang-{stacks_by}/events"
    with urllib.request.urlopen(url, timeout=30) as response:
        events = json.load(response)
    hangs = [e for e in events if e["kind"] == "hang"]
    assert len(hangs) == 1, [e["kind"] for e in events]
    assert hangs[0]["attempt"] == 0
    assert hangs[0]["data"]["first_rank"] == 1
    assert "rank 1 is the one the others wait for" in hangs[0]["text"]


def test_a_job_that_never_beats_is_never_called_hung(tmp_path):
    logs = tmp_path / "logs"
    # It runs for several seconds, far past the 1 s timeout, without a beat.
    code, console = run(
        [
            "--nproc-per-node", "2", "--hang-timeout", "1", "--max-restarts", "0",
            "--log-dir", logs, WORKERS / "hang_collective.py", tmp_path,
            "--stuck-step", "99", "--no-beats",
        ],
        env_with(),
    )  # fmt: skip
    assert code == 0, console
    assert (tmp_path / "done.0").exists()
    assert not list(logs.glob("*/attempt_*/hang.json"))
    assert "hang" not in console, console


EXITS_SLOWLY = """
import os, sys, time
import relaunch
import torch

out = sys.argv[1]
run = relaunch.init()
ckpt = relaunch.Checkpointer(os.path.join(out, "ckpt"))
for step in range(5):
    run.log({"x": step}, step=step)
run.flush(timeout=60)
open(os.path.join(out, "flushed"), "w").close()
while not os.path.exists(os.path.join(out, "gone")):
    relaunch.heartbeat()
    time.sleep(0.02)
run.log({"x": 5}, step=5)
with ckpt.save(5) as path:
    torch.save({"w": torch.ones(4)}, path / "model.pt")
# The end: the interpreter's exit waits RELAUNCH_EXIT_TIMEOUT for the
# checkpoint's upload and then for the run's records, to a server that is gone.
"""


def test_a_rank_that_waits_at_exit_for_a_server_that_is_gone_is_not_called_hung(
    tracking_server, tmp_path
):
    """A rank that has finished its work spends up to RELAUNCH_EXIT_TIMEOUT
    shipping its checkpoint and again its records at exit; with the server
    gone it waits out both. Those bounded waits beat, so a --hang-timeout
    shorter than the exit (5 s against 2 x 8 s) calls nothing hung: the job
    ends 0, says what stays unshipped, and keeps it on disk."""
    worker = tmp_path / "exits_slowly.py"
    worker.write_text(EXITS_SLOWLY)
    logs = tmp_path / "logs"
    proc = subprocess.Popen(
        [
            *RELAUNCH, "--nproc-per-node", "1", "--hang-timeout", "5", "--max-restarts", "0",
            "--log-dir", logs, "--server", tracking_server.url, "--run-id", "slow-exit",
            worker, tmp_path,
        ],
        env=env_with(RELAUNCH_EXIT_TIMEOUT="8"), cwd=tmp_path, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        wait_for(lambda: (tmp_path / "flushed").exists() or proc.poll() is not None, 120,
                 "the worker's first records on the server")  # fmt: skip
        tracking_server.kill()
        (tmp_path / "gone").touch()
        console, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, console
    assert not list(logs.glob("*/attempt_*/hang.json")), console
    assert "hang" not in console, console
    assert "checkpoint was not shipped" in console, console
    assert "what was not shipped is kept in" in console, console
    assert (tmp_path / "ckpt" / "step_00000005" / "manifest.json").exists()


def test_a_rank_that_never_gets_going_is_reported_after_the_startup_timeout(tmp_path):
    # Not even `import relaunch`: no beat, no dump signal; py-spy off. The
    # report falls back to the last lines of its stderr.
    worker = tmp_path / "stuck_at_start.py"
    worker.write_text(
        "import sys, time\n"
        "print('mounting the dataset from /mnt/shared', file=sys.stderr, flush=True)\n"
        "time.sleep(3600)\n"
    )
    logs = tmp_path / "logs"
    code, console = run(
        ["--nproc-per-node", "2", "--startup-timeout", "5", "--max-restarts", "0",
         "--log-dir", logs, worker],
        env_with(RELAUNCH_PY_SPY="off"),
        timeout=60,
    )  # fmt: skip
    assert code == 1, console
    report = hang_report(logs)
    assert report["kind"] == "never_beat", report
    assert report["startup_timeout_s"] == 5
    for r in report["ranks"]:
        assert (r["beats"], r["last_beat"], r["stacks_by"]) == (0, None, "stderr tail"), r
        assert "mounting the dataset" in Path(r["stack_file"]).read_text()
    assert "made no progress in the 5s after they started (--startup-timeout)" in console, console


def test_on_two_nodes_every_node_takes_its_stacks_before_anything_is_stopped(tmp_path):
    # Two launchers of a static 2-node job on loopback. Rank 3, on node 1,
    # gets stuck; only node 1 watches closely enough to find it (node 0's
    # timeout is long), so node 0's stacks are there only if node 1 told
    # it, through the store, and waited for it before stopping anything.
    # Then the job restarts and finishes.
    port = _free_port()
    logs = [tmp_path / "logs0", tmp_path / "logs1"]
    env = env_with(RELAUNCH_PY_SPY="off")
    procs = []
    for node in range(2):
        # Node 1's 10 s, like the one-node test's: longer than a worker
        # takes to exit after its last beat (its spawned DataLoader worker's
        # shutdown took 3 s on a quiet machine; 4 s called that a hang).
        timeout = ["120", "10"][node]
        args = [
            *RELAUNCH, "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
            "--master-port", str(port), "--nproc-per-node", "2", "--hang-timeout", timeout,
            "--max-restarts", "1", "--log-dir", logs[node],
            WORKERS / "hang_collective.py", tmp_path, "--stuck-rank", "3",
        ]  # fmt: skip
        procs.append(
            subprocess.Popen(
                [str(a) for a in args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        consoles = [p.communicate(timeout=240)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    assert [p.returncode for p in procs] == [0, 0], consoles
    assert (tmp_path / "done.1").exists()
    reports = [hang_report(logs[node]) for node in range(2)]
    by_rank = {r["rank"]: (n, r) for n, report in enumerate(reports) for r in report["ranks"]}
    assert sorted(by_rank) == [0, 1, 2, 3], reports
    for rank, (node, r) in by_rank.items():
        assert node == rank // 2
        assert r["stacks_by"] == "faulthandler", r
        assert r["last_step"] == 2, r
    assert "stuck_loading_a_batch" in by_rank[3][1]["where"]
    for rank in (0, 1, 2):
        assert "all_reduce" in by_rank[rank][1]["where"], by_rank[rank]
    assert [r["kind"] for r in reports] == ["elsewhere", "silent"], reports
    # Node 1's report, where the hang was found, takes in node 0's ranks
    # too: rank 3 is named, stuck where no other rank is.
    found = reports[1]
    assert sorted(r["rank"] for r in found["other_nodes_ranks"]) == [0, 1], found
    assert found["first_rank"] == 3, found
    groups = {g["ranks"]: g["where"] for g in found["groups"]}
    assert set(groups) == {"0-2", "3"}, groups
    assert "all_reduce" in groups["0-2"] and "stuck_loading_a_batch" in groups["3"], groups
    assert "found the job hung" in consoles[0] or "hang found on another node" in consoles[0]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STRAGGLING = """
    import os, time
    import relaunch
    rank = int(os.environ["RANK"])
    run = relaunch.init()
    # No collective: each rank steps at its own pace; rank 1 at half speed.
    per_step = 0.2 if rank == 1 else 0.1
    for step in range(int(16 / per_step)):
        time.sleep(per_step)
        run.log({"loss": 1.0 / (step + 1)}, step=step)
    run.finish()
"""


def test_a_rank_persistently_slower_than_the_others_is_reported_once_and_charted(
    tracking_server, tmp_path
):
    import textwrap

    worker = tmp_path / "straggling.py"
    worker.write_text(textwrap.dedent(STRAGGLING))
    code, console = run(
        ["--nproc-per-node", "3", "--server", tracking_server.url, "--run-id", "straggle",
         "--log-dir", tmp_path / "logs", worker],
        env_with(),
    )  # fmt: skip
    assert code == 0, console
    said = [line for line in console.splitlines() if "is a straggler" in line]
    assert len(said) == 1, console
    assert said[0].startswith("relaunch: rank 1 is a straggler: 0.2"), said
    assert "median of ranks 0-2" in said[0], said

    base = getattr(tracking_server, "read_url", tracking_server.url)

    def get(path: str) -> object:
        with urllib.request.urlopen(f"{base}/api/v1{path}", timeout=30) as response:
            return json.load(response)

    events = get("/runs/straggle/events")
    stragglers = [e for e in events if e["kind"] == "straggler"]
    assert [e["data"]["rank"] for e in stragglers] == [1], events
    # Every rank's step time is a system metric, on the launcher's series.
    for rank, expected in [(0, 0.1), (1, 0.2), (2, 0.1)]:
        points = get(f"/runs/straggle/series?key=system/step_time_s/rank_{rank}&buckets=100000")
        values = [p["value"] for p in points["points"]]
        assert values, (rank, points)
        assert abs(values[-1] - expected) < expected * 0.3, (rank, values)


class _SlowRelay:
    """An HTTP relay in front of the tracking server, as a slow proxy with
    a small body limit: a record batch larger than ``limit`` bytes gets 413
    (the client halves its batches), a smaller one is held ``delay``
    seconds before it is forwarded; with ``refuse_batches`` every batch
    gets 503 instead (the server never takes what the rank waits on)."""

    def __init__(self, upstream: str, limit: int, delay: float) -> None:
        import http.client
        import http.server
        import threading
        import time
        import urllib.parse

        self.refuse_batches = False
        relay = self
        target = urllib.parse.urlsplit(upstream)

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.endswith("/batches"):
                    if relay.refuse_batches:
                        return self._answer(503, b"busy")
                    if len(body) > limit:
                        return self._answer(413, b"too large")
                    time.sleep(delay)
                upstream_conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                upstream_conn.request(self.command, self.path, body or None, headers)
                answer = upstream_conn.getresponse()
                data = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                upstream_conn.close()

            def _answer(self, status: int, text: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SHIPS_AT_THE_END = """
import sys
import relaunch
from pathlib import Path
run = relaunch.init()
for step in range(1500):
    run.log({f"metric_{i}": step * 0.5 + i for i in range(60)}, step=step)
Path(sys.argv[1], "logged").touch()
run.finish()  # no timeout: waits as long as the server takes
Path(sys.argv[1], "finished").touch()
"""


def test_a_rank_shipping_to_a_slow_server_in_finish_beats_and_one_that_ships_nothing_is_hung(
    tracking_server, tmp_path
):
    """Issue 34: a rank waiting in run.finish() sent no beats, so one
    shipping its last records to a slow server was reported hung and
    restarted. Its wait beats whenever the server acknowledges records; a
    wait that gets nothing acknowledged does not, and is a hang."""
    worker = tmp_path / "ships_at_the_end.py"
    worker.write_text(SHIPS_AT_THE_END)
    relay = _SlowRelay(tracking_server.url, limit=48 * 1024, delay=0.4)
    try:
        common = ["--nproc-per-node", "1", "--hang-timeout", "3", "--max-restarts", "0",
                  "--server", relay.url, "--system-metrics-interval", "0"]  # fmt: skip
        slow = tmp_path / "slow"
        slow.mkdir()
        started = time.monotonic()
        code, console = run(
            [*common, "--log-dir", slow / "logs", "--run-id", "slow-finish", worker, slow],
            env_with(),
        )
        took = time.monotonic() - started
        assert code == 0, console
        assert (slow / "finished").exists(), console
        assert "hang" not in console, console
        # The wait was longer than the hang timeout, or the test shows nothing.
        assert took > 3 * 2, f"the job took {took:.1f} s: the relay did not slow it\n{console}"

        relay.refuse_batches = True
        stuck = tmp_path / "stuck"
        stuck.mkdir()
        code, console = run(
            [*common, "--log-dir", stuck / "logs", "--run-id", "stuck-finish", worker, stuck],
            env_with(),
        )
        assert (stuck / "logged").exists(), console
        assert not (stuck / "finished").exists(), console
        assert code != 0, console
        assert "hang in attempt 0" in console, console
    finally:
        relay.close()


SLOW_EXIT = """
import atexit, time
import relaunch
atexit.register(time.sleep, 6)  # an interpreter that takes long to finish
for step in range(5):
    relaunch.heartbeat(step)
    time.sleep(0.1)
"""


def test_a_rank_whose_interpreter_takes_long_to_finish_is_not_called_hung(tmp_path):
    """Issue 34 (seen in CI: a warm-restarted accelerate job whose ranks had
    finished training was reported hung at its last step, with no stacks:
    the dump signal killed interpreters that were finalizing). A rank's exit
    beats from a native thread for up to a minute."""
    script = tmp_path / "slow_exit.py"
    script.write_text(SLOW_EXIT)
    code, console = run(
        ["--nproc-per-node", "2", "--max-restarts", "0", "--hang-timeout", "3", script],
        env_with(),
    )
    assert code == 0, console
    assert "hang" not in console, console
