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
    with pytest.raises(TrackingError):
        lg.upload_file(str(small))
    with pytest.raises(TrackingConnectionError, match="cannot reach"):
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
    assert lg.save_pkl({"a": 1}, "data/x.pkl") == "data/x.pkl"
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
        ("/tmp/ml-logger-demo", "absolute"),
        ("alice/../../etc", "'..'"),
        ("//etc/passwd", "'//'"),
        ("alice/{oops", "cannot be formatted"),
        ("$NOT_SET_ANYWHERE/x", "not set"),
    ]:
        with pytest.raises(TrackingConfigError, match=why):
            loggers().configure(bad, root=tracking_server.url, silent=True)
    lg = loggers("alice/demo/bad", root=tracking_server.url)
    for parts in [("..",), ("//etc",), ("a", "/b")]:
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
    with pytest.raises(NotImplementedError, match="never deletes"):
        lg.remove("x.pkl")
    with pytest.raises(FileNotFoundError, match="is not a file"):
        lg.upload_file(str(tmp_path / "missing.txt"))
    with pytest.raises(TypeError):
        lg.upload_file(123)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'loss' is str"):
        lg.log(loss="high")
    with pytest.raises(TypeError, match="not one number"):
        lg.log(loss=[1.0, 2.0])
    with pytest.raises(FileNotFoundError, match="no run"), lg.Prefix("/alice/nobody/here"):
        lg.read_params()
    # Nothing above reached the server as a run.
    assert request(tracking_server, "GET", f"{API}/runs/alice.demo.bad")[0] == 404

    with pytest.raises(TrackingConfigError, match="local mode"):
        loggers().configure("a/b", root="/tmp/local", silent=True)
    monkeypatch.setenv("ML_LOGGER_ROOT", "/tmp/ml-logger-data")
    with pytest.raises(TrackingConfigError, match="ML_LOGGER_ROOT='/tmp/ml-logger-data'"):
        loggers("a/b").log(x=1, flush=True)
    monkeypatch.delenv("ML_LOGGER_ROOT")
    with pytest.raises(TrackingConfigError, match="no relaunch server"):
        loggers("a/b").configure("a/c", silent=True)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = loggers("a/b", root=f"http://127.0.0.1:{port}")
    down.timeout = 5
    began = time.monotonic()
    with pytest.raises(TrackingConnectionError, match="cannot reach"):
        down.log_params(Args={"lr": 1})
    assert time.monotonic() - began < 5
