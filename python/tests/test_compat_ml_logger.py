"""``relaunch.compat.ml_logger`` end to end: ml-logger-style scripts (the
plain loop, the store/summary pattern, reading back) through the shim
against the real ``relaunch server``, read back through the server's HTTP
API, never through the shim; a 120 MiB upload; a server that stops; and
the inputs ml-logger let through (``..``, absolute prefixes, pickles)."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import pickle
import random
import re
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import TrackingServer

from relaunch import (
    TrackingConfigError,
    TrackingConnectionError,
    TrackingError,
    TrackingRejectedError,
)
from relaunch.compat.ml_logger import ML_Logger, run_ids

API = "/api/v1"
ALL_POINTS = 100_000  # more buckets than points: series come back whole
MiB = 1 << 20


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No server, run id, rank or ml-logger setting from the outer environment;
    spools under the test's directory."""
    for name in list(os.environ):
        if name.startswith(("RELAUNCH_", "ML_LOGGER_")) or name in ("RANK", "LOCAL_RANK"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("RELAUNCH_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("RELAUNCH_ML_LOGGER_TIMEOUT", "20")


@pytest.fixture
def loggers() -> Iterator[Callable[..., ML_Logger]]:
    """Makes loggers; a run one of them left open (its server stopped) stops
    shipping at teardown, so the interpreter's exit does not wait for it."""
    made: list[ML_Logger] = []

    def make(*args: str, **kwargs: object) -> ML_Logger:
        lg = ML_Logger(*args, **kwargs)
        made.append(lg)
        return lg

    yield make
    for lg in made:
        if lg._run is not None:
            lg._run._native.close()
            lg._run._state = "closed"
            lg._run = None


# --- reading what the server stored (its HTTP API) ----------------------------


def request(
    server: TrackingServer, method: str, path: str, token: str | None = None
) -> tuple[int, bytes]:
    port = getattr(server, "read_port", server.port)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_json(server: TrackingServer, path: str, token: str | None = None) -> object:
    status, body = request(server, "GET", path, token)
    assert status == 200, (path, status, body)
    return json.loads(body)


def run_info(server: TrackingServer, run: str) -> dict:
    return get_json(server, f"{API}/runs/{run}")  # type: ignore[return-value]


def values_by_step(server: TrackingServer, run: str, key: str) -> dict[int, float]:
    """The series as ``{step: value}``, each step stored exactly once."""
    found = get_json(server, f"{API}/runs/{run}/series?key={key}&buckets={ALL_POINTS}")
    one = get_json(server, f"{API}/runs/{run}/series?key={key}&buckets=1")
    assert not found["downsampled"]
    steps = [p["step"] for p in found["points"]]
    # A one-bucket read counts every stored point, duplicates included.
    assert len(steps) == len(set(steps)) == found["total"] == one["total"], (key, steps)
    return {p["step"]: p["value"] for p in found["points"]}


def latest(server: TrackingServer, run: str) -> dict[str, tuple[int, float]]:
    rows = get_json(server, f"{API}/runs/{run}/latest")
    return {r["key"]: (r["step"], r["value"]) for r in rows}  # type: ignore[union-attr]


def files(server: TrackingServer, run: str) -> dict[str, dict]:
    listed = get_json(server, f"{API}/runs/{run}/files")
    names = [f["name"] for f in listed]  # type: ignore[union-attr]
    assert len(names) == len(set(names)), names
    return {f["name"]: f for f in listed}  # type: ignore[union-attr]


def file_sha256(server: TrackingServer, run: str, name: str) -> tuple[int, str]:
    """Size and SHA-256 of a run's file as the server serves it, streamed."""
    conn = http.client.HTTPConnection("127.0.0.1", getattr(server, "read_port", server.port))
    try:
        conn.request("GET", f"{API}/runs/{run}/files/{name}")
        response = conn.getresponse()
        assert response.status == 200, response.read()[:300]
        digest, size = hashlib.sha256(), 0
        while block := response.read(MiB):
            digest.update(block)
            size += len(block)
        return size, digest.hexdigest()
    finally:
        conn.close()


def file_bytes(server: TrackingServer, run: str, name: str, token: str | None = None) -> bytes:
    status, body = request(server, "GET", f"{API}/runs/{run}/files/{name}", token)
    assert status == 200, (name, body[:300])
    return body


def event_kinds(server: TrackingServer, run: str) -> list[str]:
    return [e["kind"] for e in get_json(server, f"{API}/runs/{run}/events")]  # type: ignore[union-attr]


# --- a) the plain loop, in a process of its own; c) reading it back ------------

TRAIN = """
import torch
from relaunch.compat.ml_logger import logger

logger.configure("{USER}/demo/{now:%Y}/run-1")
logger.job_started()
logger.log_params(Args=dict(lr=3e-4, batch_size=64))
logger.upload_file(__file__)
model = torch.nn.Linear(2, 1)
for epoch in range(10):
    logger.log(epoch=epoch, train_loss=0.1 / (epoch + 1), flush=True)
    if logger.every(5, key="ckpt", start_on=1):
        logger.torch_save(model.state_dict(), f"checkpoints/net_{epoch}.pt")
        logger.duplicate(f"checkpoints/net_{epoch}.pt", "checkpoints/net_last.pt")
    with torch.no_grad():
        model.weight += 1
logger.print("training done", color="green")
logger.job_completed()
"""


def test_a_training_loop_lands_once_and_reads_back(tracking_server, tmp_path, loggers):
    import torch

    server = tracking_server
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_ML")}
    # ml-logger's own variables: an http ML_LOGGER_ROOT is the relaunch server.
    env.update(ML_LOGGER_ROOT=server.url, ML_LOGGER_USER="alice")
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    dashboard = re.search(
        rf"Dashboard: {re.escape(server.url)}/runs/alice\.demo\.(\d{{4}})\.run-1\n", done.stdout
    )
    assert dashboard, done.stdout[:500]
    year = dashboard[1]  # {now:%Y}, filled in by configure
    run = f"alice.demo.{year}.run-1"

    info = run_info(server, run)
    assert (info["name"], info["project"], info["status"]) == (
        f"alice/demo/{year}/run-1",
        "alice.demo",
        "finished",
    )
    config = info["config"]
    assert config["Args"] == {"lr": 3e-4, "batch_size": 64}
    assert config["job"]["status"] == "completed"
    assert {"startTime", "completionTime"} <= set(config["job"])

    # Each flushed row is one step: every value, once.
    assert sorted(get_json(server, f"{API}/runs/{run}/keys")) == ["epoch", "train_loss"]
    assert values_by_step(server, run, "epoch") == {i: i for i in range(10)}
    assert values_by_step(server, run, "train_loss") == pytest.approx(
        {i: 0.1 / (i + 1) for i in range(10)}
    )
    kinds = event_kinds(server, run)
    assert kinds.count("job_started") == 1 and kinds[-1] == "finished", kinds

    stored = files(server, run)
    assert set(stored) == {
        "files/train.py",
        "checkpoints/net_0.pt",
        "checkpoints/net_5.pt",
        "checkpoints/net_last.pt",
        "outputs.log",
    }
    assert file_bytes(server, run, "files/train.py") == script.read_bytes()
    net_5 = file_bytes(server, run, "checkpoints/net_5.pt")
    assert file_bytes(server, run, "checkpoints/net_last.pt") == net_5
    assert file_bytes(server, run, "checkpoints/net_0.pt") != net_5
    log = file_bytes(server, run, "outputs.log").decode()
    assert "training done" in log and "train loss" in log and "batch_size" in log

    # c) A logger configured elsewhere reads the run back by its prefix.
    reader = loggers("alice/reader", root=server.url)
    with reader.Prefix(f"/alice/demo/{year}/run-1"):
        status, lr = reader.read_params("job.status", "Args.lr")
        assert (status, lr) == ("completed", 3e-4)
        assert reader.read_params()["Args.batch_size"] == 64
        assert reader.glob("checkpoints/*.pt") == [
            "checkpoints/net_0.pt",
            "checkpoints/net_5.pt",
            "checkpoints/net_last.pt",
        ]
        assert reader.glob("**/*.py") == ["files/train.py"]
        state = reader.torch_load("checkpoints/net_last.pt", map_location="cpu")
        saved = torch.load(io.BytesIO(net_5), weights_only=True)
        assert set(state) == {"weight", "bias"}
        assert all(torch.equal(state[k], saved[k]) for k in state)
        reader.download_file("files/train.py", to=str(tmp_path / "back") + "/")
        assert (tmp_path / "back" / "train.py").read_bytes() == script.read_bytes()
    # Reading opened no run of the reader's own.
    assert request(server, "GET", f"{API}/runs/alice.reader")[0] == 404


# --- b) many values summarized per interval ------------------------------------


def test_the_store_and_summary_pattern_logs_one_row_per_summary(tracking_server, loggers):
    server = tracking_server
    lg = loggers("alice/sweep/lr=0.1", root=server.url)
    rng = random.Random(7)
    expected: dict[int, dict[str, float]] = {}
    losses: list[float] = []
    rewards: list[float] = []
    lg.start("log_timer")
    for step in range(1, 10_001):
        loss, reward = rng.random(), rng.gauss(0, 1)
        lg.store_metrics(loss=loss, reward=reward)
        losses.append(loss)
        rewards.append(reward)
        if step % 1000 == 0:
            lg.log_metrics_summary(
                key_values={"step": step, "dt": lg.split("log_timer")},
                key_stats={"reward": "min_max"},
                silent=True,
            )
            expected[step] = {
                "loss/mean": statistics.fmean(losses),
                "reward/min": min(rewards),
                "reward/max": max(rewards),
                "reward/mean": statistics.fmean(rewards),
            }
            losses.clear()
            rewards.clear()
    lg.job_completed(silent=True)

    # A prefix with '=' is not a plain run id: a readable id plus a hash.
    project, run = run_ids("alice/sweep/lr=0.1")
    assert run.startswith("alice.sweep.lr-0.1-") and project == "alice.sweep"
    assert run_info(server, run)["name"] == "alice/sweep/lr=0.1"
    keys = {"loss/mean", "reward/min", "reward/max", "reward/mean", "step", "dt"}
    assert set(get_json(server, f"{API}/runs/{run}/keys")) == keys
    for key in keys - {"step", "dt"}:
        got = values_by_step(server, run, key)
        assert got == pytest.approx({s: row[key] for s, row in expected.items()}), key
    assert values_by_step(server, run, "step") == {s: s for s in expected}
    assert all(0 < dt < 60 for dt in values_by_step(server, run, "dt").values())


def test_summaries_match_hand_computed_stats_with_ml_loggers_bugs_fixed(tracking_server, loggers):
    server = tracking_server
    lg = loggers("alice/demo/stats", root=server.url)
    lg.store(x=[1.0, 2.0, None], y=4.0, z=float("nan"), w=3, s=[1, 2])
    lg.store(x=4.0, y=[6.0, 6.0], w=5, s=3)
    # Refused before anything is cleared: unknown names, and histograms.
    with pytest.raises(ValueError, match="unknown stats 'median'"):
        lg.log_metrics_summary(key_stats={"x": "median"})
    with pytest.raises(ValueError, match="histograms"):
        lg.log_metrics_summary(default_stats="histogram")
    lg.log_metrics_summary(
        key_values={"step": 7},
        key_stats={"x": "std_dev", "y": "quantile"},
        default_stats="min_max",  # ml-logger ignored it
        s="sum",
        silent=True,
    )
    x = [1.0, 2.0, 4.0]  # None and NaN dropped
    want = {
        "x/stddev": statistics.pstdev(x),  # ml-logger crashed on any 'std'
        "x/mean": statistics.fmean(x),
        "x/mode": 1.0,
        "y/0": 4.0,
        "y/25": 5.0,
        "y/mean": 6.0,  # the median, as ml-logger names it under 'quantile'
        "y/75": 6.0,
        "y/100": 6.0,
        "w/min": 3.0,
        "w/max": 5.0,
        "w/mean": 4.0,
        "s/sum": 6.0,
        "step": 7.0,
    }
    # Metric prefixes and sub-prefixes become key prefixes of the same run.
    with lg.Prefix(metrics="eval"):
        lg.log(step=8, loss=0.5, flush=True, silent=True)
    with lg.Prefix("sub"):
        lg.log_metrics({"acc": 0.9}, flush=True, silent=True)
    lg.log(None_is_nan=None, flush=True, silent=True)
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        lg.job_errored(silent=True)

    run = run_ids("alice/demo/stats")[1]
    got = latest(server, run)
    assert "z/mean" not in got  # every value NaN: no stat, as in ml-logger
    assert {k: v for k, (_, v) in got.items() if k in want} == pytest.approx(want)
    assert {k: s for k, (s, _) in got.items() if k in want} == dict.fromkeys(want, 7)
    assert got["eval/loss"] == (8, 0.5) and got["eval/step"] == (8, 8)
    assert got["sub/acc"] == (9, 0.9)  # no step key: the step after the previous row's
    assert got["None_is_nan"][0] == 10 and got["None_is_nan"][1] == "NaN"
    info = run_info(server, run)
    assert info["status"] == "failed" and info["config"]["job"]["status"] == "errored"
    failed = [e for e in get_json(server, f"{API}/runs/{run}/events") if e["kind"] == "failed"]
    assert len(failed) == 1 and "boom" in failed[0]["text"]


RESUMED = """
import sys
from relaunch.compat.ml_logger import logger

logger.configure("bob/resume/run", silent=True)
logger.print("hello from", sys.argv[1])
logger.log(i=int(sys.argv[2]), step=int(sys.argv[2]), flush=True, silent=True)
logger.log_text(f"note {sys.argv[1]}\\n", "notes/a.txt")
# no job_completed: the exit hooks ship the text and finish the run
"""


def test_a_resumed_run_continues_its_text_and_exit_ships_it(tracking_server, tmp_path):
    script = tmp_path / "resumed.py"
    script.write_text(textwrap.dedent(RESUMED))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_ML")}
    env.update(RELAUNCH_SERVER=tracking_server.url)
    for n, (who, step) in enumerate([("first", "1"), ("second", "2")]):
        done = subprocess.run(
            [sys.executable, str(script), who, step],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert done.returncode == 0 and not done.stderr, (n, done.stderr)
    run = "bob.resume.run"
    log = file_bytes(tracking_server, run, "outputs.log").decode()
    assert log == "hello from first\nhello from second\n"
    assert file_bytes(tracking_server, run, "notes/a.txt") == b"note first\nnote second\n"
    assert values_by_step(tracking_server, run, "i") == {1: 1, 2: 2}
    assert run_info(tracking_server, run)["status"] == "finished"


# --- files: big, pickled, torch ------------------------------------------------


def test_a_120_mib_upload_arrives_whole_and_a_stopped_server_raises(
    tracking_server, loggers, tmp_path
):
    server = tracking_server
    lg = loggers("alice/demo/big", root=server.url)
    big = tmp_path / "big.bin"
    digest = hashlib.sha256()
    with big.open("wb") as f:
        for _ in range(120):  # over ml-logger's ~100 MB request limit
            block = os.urandom(MiB)
            digest.update(block)
            f.write(block)
    assert lg.upload_file(str(big), "data/") == "data/big.bin"
    run = run_ids("alice/demo/big")[1]
    assert file_sha256(server, run, "data/big.bin") == (120 * MiB, digest.hexdigest())
    assert set(files(server, run)) == {"data/big.bin"}

    small = tmp_path / "small.txt"
    small.write_text("hello")
    server.stop()
    began = time.monotonic()
    # The server is down: the file and the params are queued, not dropped
    # and not raised into the loop (test_compat_ml_logger_files.py delivers them).
    assert lg.upload_file(str(small)) == "files/small.txt"
    lg.log_params(Args={"lr": 1})
    lg.timeout = 2
    with pytest.raises(TrackingError), lg.Sync():
        lg.log(x=1, flush=True, silent=True)  # spooled; leaving Sync() waits for the server
    with pytest.raises(TrackingError):
        lg.job_completed(silent=True)  # the server cannot have everything: raises
    assert time.monotonic() - began < 45


def test_pickles_need_consent_and_torch_load_takes_weights_only(
    tracking_server, loggers, monkeypatch
):
    import torch

    lg = loggers("alice/demo/pickles", root=tracking_server.url)
    # A pickle this logger did not write (its bytes put on the server some
    # other way) needs consent; one it wrote does not (the files test).
    lg.upload_buffer(pickle.dumps({"a": 1}), "data/x.pkl")
    with pytest.raises(PermissionError, match="allow_pickle=True"):
        lg.load_pkl("data/x.pkl")
    assert lg.load_pkl("data/x.pkl", allow_pickle=True) == [{"a": 1}]
    lg.save_pkl([2], "data/x.pkl", append=True)
    monkeypatch.setenv("RELAUNCH_ALLOW_PICKLE", "1")
    assert lg.load_pkl("data/x.pkl") == [{"a": 1}, [2]]
    assert lg.load_pkl("data/missing.pkl") is None
    run = run_ids("alice/demo/pickles")[1]
    raw = file_bytes(tracking_server, run, "data/x.pkl")
    assert raw == pickle.dumps({"a": 1}) + pickle.dumps([2])

    lg.torch_save(torch.nn.Linear(2, 2), "whole.pt")  # a whole module: a full pickle
    with pytest.raises(pickle.UnpicklingError):
        lg.torch_load("whole.pt")
    assert isinstance(lg.torch_load("whole.pt", weights_only=False), torch.nn.Linear)
    lg.save_module(torch.nn.Linear(3, 1))
    target = torch.nn.Linear(3, 1)
    lg.load_module(target)
    assert lg.glob("*.pkl") == ["weights.pkl"]
    with pytest.raises(FileNotFoundError, match=r"no file 'nope\.pt'"):
        lg.torch_load("nope.pt")
    lg.job_completed(silent=True)


# --- a server with a token; several servers ------------------------------------

TOKEN = "t0ken"


def test_a_server_with_a_token_takes_params_and_files_with_it_and_refuses_them_without(
    tracking_servers, loggers, tmp_path, monkeypatch
):
    server = tracking_servers("--durability", "process", "--token", TOKEN)
    note = tmp_path / "note.txt"
    note.write_text("hello")

    # No token, or a wrong one: refused before anything is sent, saying what to set.
    bare = loggers("alice/demo/no-token", root=server.url)
    no_token = r"needs a token and none was sent .*set RELAUNCH_SERVER_TOKEN"
    with pytest.raises(TrackingRejectedError, match=no_token):
        bare.log_params(Args={"lr": 1}, silent=True)
    with pytest.raises(TrackingRejectedError, match=no_token):
        bare.upload_file(str(note))
    with pytest.raises(TrackingRejectedError, match=no_token), bare.Prefix("/alice/demo/x"):
        bare.read_params()
    wrong = loggers("alice/demo/wrong-token", root=server.url, access_token="nope")
    with pytest.raises(TrackingRejectedError, match=r"refused the token .*wrong token"):
        wrong.save_json({"a": 1}, "x.json")

    # RELAUNCH_SERVER_TOKEN, as relaunch's client reads it: params, files and metrics land.
    monkeypatch.setenv("RELAUNCH_SERVER_TOKEN", TOKEN)
    lg = loggers("alice/demo/guarded", root=server.url)
    lg.log_params(Args={"lr": 3e-4}, silent=True)
    assert lg.upload_file(str(note), "notes/") == "notes/note.txt"
    assert lg.save_json({"a": 1}, "x.json") == "x.json"
    lg.log(step=3, loss=0.5, flush=True, silent=True)
    lg.job_completed(silent=True)
    run = "alice.demo.guarded"
    assert request(server, "GET", f"{API}/runs/{run}")[0] == 401  # the test's reads need it too
    info = get_json(server, f"{API}/runs/{run}", TOKEN)
    assert info["status"] == "finished" and info["config"]["Args"] == {"lr": 3e-4}
    assert file_bytes(server, run, "notes/note.txt", TOKEN) == b"hello"
    assert json.loads(file_bytes(server, run, "x.json", TOKEN)) == {"a": 1}
    rows = get_json(server, f"{API}/runs/{run}/latest", TOKEN)
    assert {r["key"]: (r["step"], r["value"]) for r in rows}["loss"] == (3, 0.5)
    runs = get_json(server, f"{API}/runs", TOKEN)
    assert [r["id"] for r in runs] == [run]  # the refused loggers left nothing

    # access_token= instead of the variable reads it all back.
    monkeypatch.delenv("RELAUNCH_SERVER_TOKEN")
    reader = loggers("alice/reader", root=server.url, access_token=TOKEN)
    with reader.Prefix("/alice/demo/guarded"):
        assert reader.read_params("Args.lr") == 3e-4
        assert reader.load_json("x.json") == {"a": 1}
        assert reader.glob("notes/*") == ["notes/note.txt"]


def test_several_servers_go_to_the_first_that_answers(
    tracking_servers, loggers, free_port, monkeypatch
):
    server = tracking_servers("--durability", "process", "--token", TOKEN)
    dead = f"http://127.0.0.1:{free_port}"  # nothing listens there
    monkeypatch.setenv("RELAUNCH_SERVER", f" {dead} , {server.url}/")
    monkeypatch.setenv("RELAUNCH_SERVER_TOKEN", TOKEN)
    lg = loggers("alice/demo/replicas")
    lg.log_params(Args={"lr": 1}, silent=True)
    assert lg.root == f"{dead},{server.url}"
    assert lg.get_dash_url() == f"{server.url}/runs/alice.demo.replicas"  # the one in use
    assert lg.upload_buffer(b"hello", "data/hello.txt") == "data/hello.txt"
    lg.log(step=1, x=2.0, flush=True, silent=True)
    lg.job_completed(silent=True)
    run = "alice.demo.replicas"
    info = get_json(server, f"{API}/runs/{run}", TOKEN)
    assert info["status"] == "finished" and info["config"]["Args"] == {"lr": 1}
    assert file_bytes(server, run, "data/hello.txt", TOKEN) == b"hello"

    for bad, why in [
        (f"{server.url},", 'server "" is not a URL'),
        (f"{server.url},{server.url}/", "listed twice"),
        (f"ftp://x,{server.url}", "uses ftp://, not http:// or https://"),
    ]:
        monkeypatch.setenv("RELAUNCH_SERVER", bad)
        with pytest.raises(TrackingConfigError, match=why):
            loggers("a/b").log_params(Args={"lr": 1}, silent=True)


# --- bad input everywhere -------------------------------------------------------


def test_bad_prefixes_names_values_and_servers_are_refused_saying_why(
    tracking_server, loggers, tmp_path, monkeypatch
):
    for bad, why in [
        ("alice/../../etc", "goes above the root with '..'"),
        ("//etc/passwd", "'//'"),
        ("alice/{oops", "cannot be formatted"),
        ("$NOT_SET_ANYWHERE/x", "not set"),
    ]:
        with pytest.raises(TrackingConfigError, match=why):
            loggers().configure(bad, root=tracking_server.url, silent=True)
    lg = loggers("alice/demo/bad", root=tracking_server.url)
    for parts in [("../../../..",), ("//etc",), ("a", "..", "/..")]:
        with pytest.raises(TrackingConfigError), lg.Prefix(*parts):
            pass
    for call in [
        lambda: lg.save_pkl(1, "../escape.pkl"),
        lambda: lg.torch_save({}, "/abs/x.pt"),
        lambda: lg.upload_buffer(b"x", "figures/step:1.png"),
    ]:
        with pytest.raises(TrackingConfigError):
            call()
    with pytest.raises(NotImplementedError, match="S3"):
        lg.save_pkl(1, "s3://bucket/x.pkl")
    assert lg.remove("x.pkl") == []  # nothing there, as in ml-logger
    with pytest.raises(TrackingConfigError, match="not a file of a relaunch run"):
        lg.move("parameters.pkl", "params.pkl")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        lg.upload_file(str(tmp_path / "missing.txt"))
    with pytest.raises(TypeError):
        lg.upload_file(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"names must be str, not int: 0 \(log_key_value takes"):
        lg.log_key_value(0, "some string key")  # ml-logger's README, arguments swapped
    with pytest.raises(FileNotFoundError, match="no run"), lg.Prefix("/alice/nobody/here"):
        lg.read_params()
    # Nothing above reached the server as a run.
    assert request(tracking_server, "GET", f"{API}/runs/alice.demo.bad")[0] == 404

    for root, why in [
        ("localhost:8765", "without its scheme: write http://localhost:8765"),
        ("s3://bucket/runs", "s3:// is not a place relaunch keeps runs"),
        ("file://relative/dir", "must be absolute"),
        ("  ", "root is empty"),
    ]:
        with pytest.raises(TrackingConfigError, match=re.escape(why)):
            loggers().configure("a/b", root=root, silent=True)
    monkeypatch.setenv("ML_LOGGER_ROOT", "gs://bucket")
    with pytest.raises(TrackingConfigError, match="gs:// is not"):
        loggers("a/b").log(x=1, flush=True)
    monkeypatch.delenv("ML_LOGGER_ROOT")
    unwritable = loggers("a/b", root="/proc/no-such-dir/root")  # a local root, used lazily
    with pytest.raises(TrackingConfigError, match=r"cannot create .*give a root you can write to"):
        unwritable.log_params(Args={"lr": 1})
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = loggers("a/b", root=f"http://127.0.0.1:{port}")
    down.timeout = 5
    began = time.monotonic()
    down.log_params(Args={"lr": 1})  # queued, with a warning: a down server never stops training
    with pytest.raises(TrackingConnectionError, match="cannot reach"), down.Sync():
        pass
    assert time.monotonic() - began < 15


# --- the items: what an ml-logger user hits first ------------------------
# Written from ml-logger 0.10.36's README and source: its first example logs a
# string; its local mode (a directory as root, the default) needs no server;
# prefixes are paths from the root; its tests import Color, percent, metrify
# and call remove() first.


def test_strings_colors_and_arrays_log_as_ml_loggers_readme_does(tracking_server, loggers, capsys):
    import numpy as np
    import torch

    from relaunch.compat.ml_logger.helpers.color_helpers import percent
    from relaunch.compat.ml_logger.ml_logger import Color

    server = tracking_server
    lg = loggers("alice/demo/values", root=server.url)
    for i in range(2):  # the README's first example, as written there
        lg.log(metrics={"some_val/smooth": 10, "status": f"step ({i})"}, reward=20, timestep=i)
        lg.flush()
    shown = capsys.readouterr().out
    assert "step (0)" in shown and "step (1)" in shown

    lg.log(
        step=5,
        share=Color(0.85, "yellow", percent),  # a number in colour: the number is the metric
        note=Color("slow", "red"),  # text in colour: text
        arr=np.array([1.0, 2.0, np.nan, 6.0]),  # an array: its mean (NaN left out)
        ints=[1, 2, 3],
        one=np.array([7.5]),  # one element: that number
        zero_d=np.array(4),
        f32=np.float32(0.5),
        i64=np.int64(9),
        flag=np.bool_(True),
        yes=True,
        loss=torch.tensor(0.25, requires_grad=True),
        grads=torch.tensor([[1.0, 3.0], [5.0, 7.0]]),
        when=np.datetime64("2024-01-02"),
        nested={"a": 1.5, "b": "text"},
        missing=None,
        flush=True,
    )
    printed = capsys.readouterr().out
    assert "\033[33m85.00%\033[0m" in printed and "\033[31mslow\033[0m" in printed
    lg.log(step=6, status="quiet", loss=0.125, flush=True, silent=True)
    assert capsys.readouterr().out == ""
    lg.job_completed(silent=True)

    run = "alice.demo.values"
    got = latest(server, run)
    assert values_by_step(server, run, "some_val/smooth") == {0: 10, 1: 10}
    assert values_by_step(server, run, "timestep") == {0: 0, 1: 1}
    numbers = {k: v for k, (_, v) in got.items()}
    assert numbers.pop("missing") == "NaN"  # None, as the server writes NaN
    assert numbers == pytest.approx(
        {
            "some_val/smooth": 10,
            "reward": 20,
            "timestep": 1,
            "step": 6,
            "share": 0.85,
            "arr": 3.0,
            "ints": 2.0,
            "one": 7.5,
            "zero_d": 4,
            "f32": 0.5,
            "i64": 9,
            "flag": 1,
            "yes": 1,
            "loss": 0.125,
            "grads": 4.0,
            "nested/a": 1.5,
        }
    )
    assert got["share"][0] == 5 and got["loss"][0] == 6
    # Text is no metric: it is in the printed table, and in outputs.log without colour.
    assert not {"status", "note", "when", "nested/b"} & set(got)
    log = file_bytes(server, run, "outputs.log").decode()
    assert "\033" not in log
    for text in ("step (0)", "step (1)", "85.00%", "slow", "2024-01-02", "[ 1.  2. nan  6.]"):
        assert text in log, text
    assert "status: quiet | loss: 0.125" in log  # a silent row's text still lands, on one line

    # store_metrics takes a Color's value too; a string there has no mean and says so.
    lg2 = loggers("alice/demo/values-2", root=server.url)
    lg2.store_metrics(x=Color(2.0, "green"))
    lg2.store_metrics(x=4.0)
    with pytest.raises(TypeError, match="'y' is str, not a number"):
        lg2.store_metrics(y="high")
    lg2.log_metrics_summary(key_values={"step": 1}, silent=True)
    lg2.job_completed(silent=True)
    assert latest(server, "alice.demo.values-2")["x/mean"] == (1, 3.0)


LOCAL = """
import json, os, sys
from relaunch.compat.ml_logger import logger

name, *rest = sys.argv[1:]
root = {"root": rest[0]} if rest and rest[0] != "--wait" else {}
logger.configure(f"alice/local/{name}", silent=True, **root)
logger.log_params(Args=dict(lr=0.1, name=name))
logger.log(step=1, loss=0.5, status="ok", flush=True, silent=True)
logger.save_json({"who": name}, "data/who.json")
state = json.load(open(os.path.join(logger.root, ".ml-logger", "server.json")))
print("ROOT", logger.root, flush=True)
print("URL", logger.get_dash_url(), state["pid"], flush=True)
if "--wait" in rest:
    sys.stdin.read()  # until the test closes it
logger.job_completed(silent=True)
"""


def _local_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAUNCH_", "ML_LOGGER_"))}
    env.update(XDG_DATA_HOME=str(tmp_path / "xdg-data"), RELAUNCH_ML_LOGGER_TIMEOUT="20")
    env["RELAUNCH_DIR"] = os.environ["RELAUNCH_DIR"]
    return env


def _said(out: str, what: str) -> list[str]:
    line = next(line for line in out.splitlines() if line.startswith(what + " "))
    return line.split()[1:]


def _alive(pid: int) -> bool:
    from relaunch._subprocess import alive

    return alive(pid)


def _read_back(root: Path, run: str) -> tuple[dict, dict, dict, str]:
    """The run as a ``relaunch server --data-dir ROOT`` started afterwards serves it."""
    from relaunch._subprocess import ServerProcess

    with ServerProcess(root) as reader:
        base = f"http://127.0.0.1:{reader.port}"
        # A TrackingServer-like handle for the helpers above.
        handle = type("Reader", (), {"port": reader.port, "url": base})()
        info = run_info(handle, run)  # type: ignore[arg-type]
        got = latest(handle, run)  # type: ignore[arg-type]
        listed = files(handle, run)  # type: ignore[arg-type]
        log = file_bytes(handle, run, "outputs.log").decode()  # type: ignore[arg-type]
        who = json.loads(file_bytes(handle, run, "data/who.json"))  # type: ignore[arg-type]
    assert who == {"who": run.rsplit(".", 1)[1]}
    return info, got, listed, log


def test_no_root_and_no_server_logs_locally_and_relaunch_server_reads_it_later(tmp_path):
    env = _local_env(tmp_path)
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent(LOCAL))
    done = subprocess.run(
        [sys.executable, str(script), "first"], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    # ml-logger's zero-config local mode: the default root is a data directory.
    root = tmp_path / "xdg-data" / "relaunch" / "ml-logger"
    assert _said(done.stdout, "ROOT") == [str(root)]
    url, pid = _said(done.stdout, "URL")
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/runs/alice\.local\.first", url)
    # The process's exit stopped its server, and left no state behind.
    assert not _alive(int(pid))
    assert not (root / ".ml-logger" / "server.json").exists()

    info, got, listed, log = _read_back(root, "alice.local.first")
    assert info["status"] == "finished" and info["config"]["Args"] == {"lr": 0.1, "name": "first"}
    assert info["config"]["job"]["status"] == "completed"
    assert got["loss"] == (1, 0.5)
    assert set(listed) == {"data/who.json", "outputs.log"}
    assert "status: ok" in log


def test_processes_with_one_local_root_share_one_server_that_the_last_one_stops(tmp_path):
    env = _local_env(tmp_path)
    root = tmp_path / "ml-logger-root"  # a directory as root=, as ml-logger took it
    script = tmp_path / "local.py"
    script.write_text(textwrap.dedent(LOCAL))
    first = subprocess.Popen(
        [sys.executable, str(script), "first", str(root), "--wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert first.stdout is not None and first.stdin is not None
        said = ""
        while "URL" not in said:
            line = first.stdout.readline()
            assert line, first.stderr.read() if first.stderr else ""
            said += line
        url, pid = _said(said, "URL")
        server = url.rsplit("/runs/", 1)[0]

        second = subprocess.run(
            [sys.executable, str(script), "second", str(root)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert second.returncode == 0, second.stderr
        # The second process found the first one's server instead of starting another.
        assert _said(second.stdout, "URL") == [f"{server}/runs/alice.local.second", pid]
        # Its exit left the server to the first process, which still uses it.
        assert _alive(int(pid))
        status, _ = request(
            type("S", (), {"port": int(server.rsplit(":", 1)[1])})(),  # type: ignore[arg-type]
            "GET",
            f"{API}/health",
        )
        assert status == 200
        first.stdin.close()
        assert first.wait(120) == 0, first.stderr.read() if first.stderr else ""
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert not _alive(int(pid))  # the last one out stopped it
    assert not (root / ".ml-logger" / "server.json").exists()
    for who in ("first", "second"):
        info, got, _, _ = _read_back(root, f"alice.local.{who}")
        assert info["status"] == "finished" and got["loss"] == (1, 0.5)


@pytest.fixture
def local_root(tmp_path: Path) -> Iterator[Path]:
    """A local root for loggers in this process; at teardown their runs
    close and the server they started stops (and is checked gone)."""
    from relaunch.compat.ml_logger import _local, _logger

    root = tmp_path / "local-root"
    yield root
    pids = [h.pid for h in _local._held.values()]
    for lg in list(_logger._live):
        if lg._run is not None:
            lg._run._native.close()
            lg._run._state = "closed"
            lg._run = None
    _local.release_all()
    assert not [pid for pid in pids if _alive(pid)]


def test_a_local_root_in_process_starts_its_server_on_first_use_only(
    local_root, loggers, monkeypatch, tmp_path
):
    from relaunch.compat.ml_logger import _local

    lg = loggers("alice/inproc/run", root=str(local_root))
    assert lg.root == str(local_root)
    assert "alice/inproc/run" in repr(lg)
    assert not _local.held() and not local_root.exists()  # nothing started yet

    lg.log_params(Args={"lr": 3})
    assert lg.read_params("Args.lr") == 3
    assert lg.save_json({"a": 1}, "x.json") == "x.json"
    assert lg.load_json("x.json") == {"a": 1}
    assert lg.glob("*.json") == ["x.json"]
    assert _local.held() == [str(local_root)]
    lg.job_completed(silent=True)

    # ML_LOGGER_ROOT as a path is a local root too; a second logger joins the same server.
    monkeypatch.setenv("ML_LOGGER_ROOT", str(local_root))
    other = loggers("alice/inproc/other")
    with other.Prefix("/alice/inproc/run"):
        assert other.read_params("Args.lr") == 3
    assert other.get_dash_url().startswith(_local._held[str(local_root)].url)


def test_prefixes_are_paths_from_the_root_as_on_ml_loggers_server(tracking_server, loggers):
    server = tracking_server
    # A leading '/' means from the root: '/alice/demo/run-a' is 'alice/demo/run-a'.
    lg = loggers(root=server.url)
    lg.configure("/alice/demo/run-a", silent=True)
    assert lg.prefix == "alice/demo/run-a" and lg.abspath("x.pt") == "/alice/demo/run-a/x.pt"
    lg.log_params(Args={"lr": 1}, silent=True)
    b = loggers("alice/demo/{USER}/../run-b", root=server.url)  # '..' resolves as in a path
    assert b.prefix == "alice/demo/run-b"
    b.log_params(Args={"lr": 2}, silent=True)
    b.prefix = "/alice/demo/./run-b"
    assert b.prefix == "alice/demo/run-b"

    with lg.Prefix(".."):
        assert lg.prefix == "alice/demo"
        with lg.Prefix("run-b"):  # a sibling run, read as ml-logger read it
            assert lg.read_params("Args.lr") == 2
    with lg.Prefix("eval", "..", "ckpt"):  # below the run: the same run's files
        assert lg.prefix == "alice/demo/run-a/ckpt"
        assert lg.upload_buffer(b"w", "w.pt") == "ckpt/w.pt"
    with lg.Prefix("eval", "/alice/demo/run-b"):  # os.path.join: a '/' part starts again
        assert lg.read_params("Args.lr") == 2
    with lg.Prefix("../../.."):  # the root itself: no run there
        assert lg.prefix == ""
        with pytest.raises(TrackingConfigError, match="prefix is empty"):
            lg.read_params()
    # Only what would leave the root is refused, saying from where.
    with pytest.raises(TrackingConfigError, match=r"\.\.' from 'alice/demo/run-a' goes above"):
        with lg.Prefix("../../../.."):
            pass
    with pytest.raises(TrackingConfigError, match="goes above the root"):
        lg.configure("/alice/../..", silent=True)
    assert lg.prefix == "alice/demo/run-a"  # unchanged by what was refused
    lg.job_completed(silent=True)
    assert set(files(server, "alice.demo.run-a")) == {"ckpt/w.pt", "outputs.log"}
    assert run_info(server, "alice.demo.run-b")["config"]["Args"] == {"lr": 2}


INSTR = """
import sys
from relaunch.compat.ml_logger import logger
from relaunch.compat.ml_logger.job import RUN, instr

RUN.username, RUN.project = "alice", f"jobs-{sys.argv[1]}"  # two runs within one second

def train(epochs, lr=0.0):
    for epoch in range(epochs):
        logger.log(epoch=epoch, lr=lr, flush=True, silent=True)
    if sys.argv[1] == "fail":
        raise RuntimeError("diverged")
    return epochs

thunk = instr(train, 3, lr=0.5, __diff=False, __silent=True)
print("PREFIX", logger.prefix, flush=True)
assert thunk() == 3
"""


def test_instr_records_the_job_and_the_thunk_its_outcome(tracking_server, tmp_path, monkeypatch):
    server = tracking_server
    script = tmp_path / "train_job.py"
    script.write_text(textwrap.dedent(INSTR))
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAUNCH_ML")}
    env.update(RELAUNCH_SERVER=server.url)
    prefixes = {}
    for outcome in ("ok", "fail"):
        done = subprocess.run(
            [sys.executable, str(script), outcome],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,
        )
        assert done.returncode == (0 if outcome == "ok" else 1), done.stderr
        (prefixes[outcome],) = _said(done.stdout, "PREFIX")
    # RUN.prefix: {username}/{project}/{now:%Y/%m-%d}/{file_stem}/{job_name}, the job
    # name being the import time and the job counter.
    ok = prefixes["ok"]
    assert re.fullmatch(r"alice/jobs-ok/\d{4}/\d\d-\d\d/train_job/\d\d\.\d\d\.\d\d/1", ok), ok
    run = run_ids(ok)[1]
    info = run_info(server, run)
    config = info["config"]
    assert info["status"] == "finished" and config["job"]["status"] == "completed"
    assert {"createTime", "startTime", "completionTime"} <= set(config["job"])
    assert config["job"]["name"] == ok.split("/", 5)[5] and config["job"]["prefix"] == ok
    assert config["fn"]["name"] == "train" and config["fn"]["file"] == str(script)
    assert (config["args"], config["kwargs"]) == ([3], {"lr": 0.5})
    assert set(config["host"]) == {"hostname"}
    assert values_by_step(server, run, "epoch") == {0: 0, 1: 1, 2: 2}
    assert file_bytes(server, run, "files/train_job.py") == script.read_bytes()
    assert "execution is complete" in file_bytes(server, run, "outputs.log").decode()

    failed = run_ids(prefixes["fail"])[1]
    info = run_info(server, failed)
    assert info["status"] == "failed" and info["config"]["job"]["status"] == "errored"
    assert "RuntimeError: diverged" in file_bytes(server, failed, "traceback.err").decode()

    # needs_relaunch reads the job's status with the module's logger (put back afterwards).
    from relaunch.compat.ml_logger import logger
    from relaunch.compat.ml_logger.job import needs_relaunch

    monkeypatch.setattr(logger, "_root", None)
    monkeypatch.setattr(logger, "_url", None)
    monkeypatch.setenv("RELAUNCH_SERVER", server.url)
    assert needs_relaunch(ok, silent=True) is False
    assert needs_relaunch("/" + prefixes["fail"], silent=True) is True  # errored
    assert needs_relaunch("alice/jobs/never", silent=True, not_exist_ok=True) is True


def test_ml_loggers_submodules_import_and_behave_as_documented(tmp_path):
    import numpy as np

    import relaunch.compat.ml_logger as ml_logger
    from relaunch.compat.ml_logger import helpers
    from relaunch.compat.ml_logger import ml_logger as module
    from relaunch.compat.ml_logger.helpers import color_helpers, func_helpers, print_utils
    from relaunch.compat.ml_logger.helpers.color_helpers import Color, percent
    from relaunch.compat.ml_logger.helpers.data_helpers import Stream
    from relaunch.compat.ml_logger.helpers.default_set import DefaultSet
    from relaunch.compat.ml_logger.helpers.file_helpers import CwdContext
    from relaunch.compat.ml_logger.job import RUN, instr, needs_relaunch
    from relaunch.compat.ml_logger.ml_logger import metrify

    assert module.logger is ml_logger.logger and module.ML_Logger is ml_logger.ML_Logger
    assert module.Color is Color and ml_logger.instr is instr and ml_logger.RUN is RUN
    assert callable(needs_relaunch)

    # metrify: arrays to lists, numpy scalars and 0-d arrays to Python numbers.
    assert metrify(np.array(10)) == 10 and type(metrify(np.array(10))) is int
    assert metrify(np.array(10.0)) == 10.0 and metrify(np.float32(0.5)) == 0.5
    assert metrify(np.array([10.0, 2])) == [10.0, 2]
    assert metrify(np.bool_(True)) is True
    assert metrify([1, "a"]) == [1, "a"] and metrify({"a": 1}) == {"a": 1}
    assert metrify(None) is None and metrify(np.datetime64("2024-01-02")) == "2024-01-02"

    # Color: the value, formatted, in colour; percent and friends format numbers.
    c = Color(0.85, "yellow", percent)
    assert (str(c), format(c, "")) == ("85.00%", "\033[33m85.00%\033[0m")
    assert format(Color(3.14159, None), ".2f") == "3.14" and len(Color(3.5)) == 3
    assert color_helpers.ms(0.0123) == "12.3ms" and color_helpers.sec(1.5) == "1.500s"
    assert color_helpers.red(1).color == "red" and color_helpers.grey(1).color == "gray"
    with pytest.raises(ValueError, match="color 'purple' is not one of"):
        Color(1, "purple")

    # func_helpers: params merge and dot-flatten as ml-logger reads them.
    nested = {"a": 1, "child": {"a": 3, "grandchild": {"d": 8}}}
    flat = func_helpers.dot_flatten(nested)
    assert flat == {"a": 1, "child.a": 3, "child.grandchild.d": 8}
    assert func_helpers.dot_unflatten(flat) == nested
    assert func_helpers.dot_keys(nested, strict=False) == [
        "a",
        "child",
        "child.a",
        "child.grandchild",
        "child.grandchild.d",
    ]
    assert func_helpers.assign({"c": 4, "d": {"x": 1}}, {"c": 3, "d": {"y": 2}}) == {
        "c": 3,
        "d": {"x": 1, "y": 2},
    }

    s = DefaultSet("__timestamp")
    assert not s
    s.add("x")
    s.reset()
    assert s == {"__timestamp"}
    stream = Stream(len=2)
    assert stream.mean is None
    for v in (1.0, 2.0, 4.0):
        stream.append(v)
    assert (stream.latest, stream.mean, stream.min, stream.max) == (4.0, 3.0, 2.0, 4.0)
    with CwdContext(tmp_path):
        assert os.getcwd() == str(tmp_path)
    assert os.getcwd() != str(tmp_path)

    table = print_utils.PrintHelper().format_tabular({"some_key": 1.5, "n": 2, "skip": 0}, ["skip"])
    assert table.splitlines()[1] == f"│{'some key':^20}│{'1.500':^20}│"
    assert "skip" not in table and table.startswith("╒") and table.endswith("╛\n")
    rows = print_utils.PrintHelper().format_row_table({"a": [1, 2, 3], "b": [4.0]}, max_rows=2)
    assert rows.splitlines()[2:] == ["  1  |4.000", "  2  |     "]

    # The readers of what ml-logger wrote: appended pickles, JSON lines, a sample.
    path = tmp_path / "data.pkl"
    path.write_bytes(pickle.dumps({"a": 1}) + pickle.dumps([2]))
    assert list(helpers.load_from_pickle(str(path))) == [{"a": 1}, [2]]
    lines = io.BytesIO(b'{"a": 1}\n// a comment\n\n{"a": 2}\n')
    assert list(helpers.load_from_jsonl_file(lines)) == [{"a": 1}, {"a": 2}]
    assert list(helpers.sample(range(10), 20)) == list(range(10))
    assert len(list(helpers.sample(range(100), 5))) == 5
    assert helpers.regularize_for_json({"x": np.arange(2), "f": print, "t": (1, "a")}) == {
        "x": [0, 1],
        "f": repr(print),
        "t": [1, "a"],
    }


def test_remove_and_move_delete_and_rename_the_runs_files(tracking_server, loggers, capsys):
    server = tracking_server
    run = "alice.demo.files"
    lg = loggers("alice/demo/files", root=server.url)
    lg.log_params(Args={"lr": 1}, silent=True)
    lg.log(step=1, loss=0.5, flush=True, silent=True)
    for name in ["a.txt", "b.pkl", "c.pkl", "dir/x.txt", "dir/sub/y.txt", "keep/z.txt"]:
        lg.upload_buffer(name.encode(), name)

    # A file, a glob, a folder (everything below it); names that match nothing are skipped.
    assert lg.remove("a.txt") == ["a.txt"]
    assert sorted(lg.remove("*.pkl")) == ["b.pkl", "c.pkl"]
    assert sorted(lg.remove("dir")) == ["dir/sub/y.txt", "dir/x.txt"]
    assert lg.remove("nothing.txt", "nope/*") == []
    assert set(files(server, run)) == {"keep/z.txt"}

    # move: a file, into a folder, a whole folder; the bytes travel along.
    lg.upload_buffer(b"m", "m.txt")
    assert lg.move("m.txt", "moved/m2.txt") == ["moved/m2.txt"]
    assert lg.move("moved/m2.txt", "keep") == ["keep/m2.txt"]  # an existing folder: into it
    assert sorted(lg.move("keep", "kept")) == ["kept/m2.txt", "kept/z.txt"]
    assert set(files(server, run)) == {"kept/m2.txt", "kept/z.txt"}
    assert file_bytes(server, run, "kept/m2.txt") == b"m"
    with pytest.raises(FileNotFoundError, match="no file or folder 'keep'"):
        lg.move("keep", "x")
    with pytest.raises(TrackingConfigError, match="into itself"):
        lg.move("kept", "kept/inner")
    with pytest.raises(TrackingConfigError, match="not a glob"):
        lg.move("kept/*", "x")
    # Under a Prefix, names are relative to it.
    with lg.Prefix("eval"):
        lg.upload_buffer(b"e", "e.txt")
        assert lg.move("e.txt", "f.txt") == ["f.txt"]
        assert lg.remove("*.txt") == ["f.txt"]

    # outputs.log removed: what is logged next starts a new one (the old text is gone).
    lg.print("before")
    with lg.Sync():
        pass
    assert file_bytes(server, run, "outputs.log").endswith(b"\nbefore\n")  # after the params
    assert lg.remove("outputs.log") == ["outputs.log"]
    lg.print("after")
    with lg.Sync():
        pass
    assert file_bytes(server, run, "outputs.log") == b"after\n"

    # parameters.pkl clears the params (under a Prefix, those under it); the metrics
    # stay on the server but ml-logger's reads start after the remove.
    with lg.Prefix("eval"):
        lg.log_params(Opt={"x": 1}, silent=True)
        assert run_info(server, run)["config"]["eval"] == {"Opt": {"x": 1}}
        assert lg.remove("parameters.pkl") == []
    assert run_info(server, run)["config"] == {"Args": {"lr": 1}}
    capsys.readouterr()
    assert lg.remove("parameters.pkl", "metrics.pkl") == []
    assert run_info(server, run)["config"] == {}
    assert capsys.readouterr().err == ""
    assert latest(server, run)["loss"] == (1, 0.5)
    assert lg.read_metrics("loss", silent=True) is None and lg.load_pkl("metrics.pkl") is None
    lg.log_params(Args={"lr": 2}, silent=True)
    assert run_info(server, run)["config"] == {"Args": {"lr": 2}}

    # Another run's files, by its prefix; then '' removes everything of this one.
    other = loggers("alice/demo/other", root=server.url)
    other.upload_buffer(b"o", "o.txt")
    other.log(step=0, loss=3.0, flush=True, silent=True)
    with other.Sync():
        pass
    with lg.Prefix("/alice/demo/other"):
        assert lg.remove("o.txt") == ["o.txt"]
        assert (
            lg.remove("metrics.pkl") == []
        )  # another logger's run: its metrics are read as they are
        assert lg.read_metrics("loss@mean").tolist() == [3.0]
    assert "is not this logger's, so its metrics stay" in capsys.readouterr().err
    assert files(server, "alice.demo.other") == {}
    assert sorted(lg.remove("")) == ["kept/m2.txt", "kept/z.txt", "outputs.log"]
    assert files(server, run) == {} and run_info(server, run)["config"] == {}
    lg.job_completed(silent=True)


def test_jsonl_rows_and_get_exps_under_a_parent_prefix(tracking_server, loggers):
    import numpy as np

    server = tracking_server
    lg = loggers("alice/exps/run-1", root=server.url)
    lg.log_params(Args={"lr": 0.1}, silent=True)
    lg.job_started(silent=True)
    # A row flushed into a file that is not a pickle: a JSON line there, every value as
    # logged (ml-logger's .jsonl rows), and metrics under the file's stem.
    lg.log(step=1, loss=0.5, status="ok", arr=np.array([1, 2]), file="eval.jsonl", flush=True)
    lg.log("no metrics here", file="notes.txt", flush=True)  # an empty row: '{}', as ml-logger
    two = loggers("alice/exps/run-2", root=server.url)
    two.log_params(Args={"lr": 0.2}, silent=True)
    loggers("alice/other/run-3", root=server.url).log_params(Args={"lr": 0.3}, silent=True)
    with lg.Sync():
        pass
    run = "alice.exps.run-1"
    rows = [json.loads(line) for line in file_bytes(server, run, "eval.jsonl").splitlines()]
    assert rows == [{"step": 1, "loss": 0.5, "status": "ok", "arr": [1, 2]}]
    assert file_bytes(server, run, "notes.txt") == b"{}\n"
    assert latest(server, run)["eval/loss"] == (1, 0.5)
    assert "no metrics here" in file_bytes(server, run, "outputs.log").decode()

    # ml-logger's test: under Prefix(".."), get_exps("**/parameters.pkl") lists the runs below.
    # Each row: a run's params, dot-flattened, and where its parameters.pkl was.
    with lg.Prefix(".."):
        exps = lg.get_exps("**/parameters.pkl")
        assert "job.status" in exps.columns
        assert sorted(zip(exps["Args.lr"], exps["prefix"], strict=True)) == [
            (0.1, "run-1/parameters.pkl"),
            (0.2, "run-2/parameters.pkl"),
        ]
    lg.job_completed(silent=True)


def test_the_summary_and_key_value_caches_of_ml_logger_caches():
    # ml_logger.caches, as ml-logger 0.10.36's summary cache tests use it.
    import numpy as np

    from relaunch.compat.ml_logger.caches.key_value_cache import KeyValueCache
    from relaunch.compat.ml_logger.caches.summary_cache import SummaryCache, flatten

    assert flatten([[0], [1, 2], np.array([10, 1]), [np.array([10]), np.array([1, 2])]]) == [
        0.0, 1.0, 2.0, 10.0, 1.0, 10.0, 1.0, 2.0,
    ]  # fmt: skip
    assert np.isnan(flatten([None, 1])[0])
    cache = SummaryCache(mode="tiled")
    for i in range(4):
        cache.store(loss=float(i), acts=np.array([i, i + 1.0]), seen=None)
    assert "loss" in cache and bool(cache)
    assert cache.get("loss").mean() == 1.5 and isinstance(cache.get("loss").mean(), float)
    stats = cache.summary_stats(loss="min_max", acts="quantile", seen="mean", hist="histogram")
    assert stats == {
        "loss/min": 0.0,
        "loss/max": 3.0,
        "loss/mean": 1.5,
        "acts/0": 0.0,
        "acts/25": 1.0,
        "acts/mean": 2.0,
        "acts/75": 3.0,
        "acts/100": 4.0,
    }  # fmt: skip  (NaN is left out: "seen" has no stats; a histogram gives none)
    assert str(cache).startswith("SummaryCache:  loss: [0.0, 1.0][:4]\n  acts: Shape(2,)[:4]\n")
    assert cache.summarize(loss="mean") == {"loss/mean": 1.5, "acts/mean": 2.0}
    assert not cache  # a tiled cache is emptied by summarize
    rolling = SummaryCache(mode="rolling", window=2)
    for i in range(5):
        rolling.store(x=i)
    assert rolling.summarize() == {"x/mean": 3.5} and rolling.pop("x").tolist() == [3, 4]
    with pytest.raises(ValueError, match="window is for mode='rolling'"):
        SummaryCache(mode="tiled", window=3)
    with pytest.raises(TypeError, match="numbers, not str"):
        flatten(["a"])
    kv = KeyValueCache()
    kv.update({"a": 1}, b=2)
    kv.update(a=3)
    assert kv.pop_all() == {"a": 3, "b": 2} and not kv
