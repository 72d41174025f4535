"""relaunch.Api: runs read back from a real server, as W&B's and MLflow's
users read theirs: filtered lists, config, summary, and every point of a
history in pandas (or polars), exact, a resumed run's attempts as one."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

import relaunch
from relaunch.errors import TrackingConfigError


def log_run(server, spool, run_id, steps, *, rank=0, config=None, tags=(), project="api", **kw):
    """A run (or a new attempt of it) logging ``loss`` = step / 10 and ``acc``
    every other step, then finished; returns what was logged."""
    logged = {"loss": {}, "acc": {}}
    with relaunch.init(
        project, id=run_id, server=server.url, dir=spool, rank=rank, config=config, tags=tags
    ) as run:
        for step in steps:
            values = {"loss": kw.get("loss", lambda s: s / 10)(step)}
            if step % 2 == 0:
                values["acc"] = kw.get("acc", lambda s: 1 - 1 / (s + 1))(step)
            run.log(values, step=step)
            for key, value in values.items():
                logged[key][step] = value
    return logged


def test_a_history_reads_back_every_point_exactly(tracking_server, tmp_path):
    odd = {0: math.nan, 2: math.inf, 4: -math.inf}
    logged = log_run(
        tracking_server,
        tmp_path / "spool",
        "exact",
        range(1000),
        config={"lr": 0.01, "optim": {"name": "adam"}},
        acc=lambda s: odd.get(s, 1 - 1 / (s + 1)),
    )
    api = relaunch.Api(tracking_server.url)
    run = api.run("exact")
    assert (run.id, run.project, run.status) == ("exact", "api", "finished")
    assert run.config == {"lr": 0.01, "optim": {"name": "adam"}}
    assert run.summary == {"acc": 1 - 1 / 999, "loss": 99.9}

    wide = run.history()
    assert list(wide.columns) == ["rank", "step", "acc", "loss"]
    assert wide["step"].dtype == np.int64 and len(wide) == 1000
    assert (wide["step"].to_numpy() == np.arange(1000)).all()
    assert (wide["rank"] == 0).all()
    assert wide["loss"].tolist() == [logged["loss"][s] for s in range(1000)]
    acc = wide.set_index("step")["acc"]
    assert math.isnan(acc[0]) and acc[2] == math.inf and acc[4] == -math.inf
    assert math.isnan(acc[1])  # no point at odd steps
    assert acc[998] == logged["acc"][998]

    long = run.history("acc", layout="long", min_step=10, max_step=20)
    assert list(long.columns) == ["rank", "step", "key", "value", "wall", "attempt"]
    assert long["step"].tolist() == list(range(10, 21, 2))
    assert long["value"].tolist() == [logged["acc"][s] for s in range(10, 21, 2)]
    assert (long["key"] == "acc").all() and (long["attempt"] == 0).all()
    assert long["wall"].between(run.created_at - 60, run.updated_at + 60).all()

    # The frame is the caller's to change (its arrays may be views of the
    # answer's read-only bytes).
    wide.loc[0, "loss"] = -1.0
    wide["loss"] *= 2
    assert wide["loss"].iloc[:2].tolist() == [-2.0, 2 * logged["loss"][1]]
    one = run.history("loss")  # one key: the frame's columns are views of the answer
    assert one["loss"].iloc[0] == 0.0
    one.loc[0, "loss"] = 5.0
    one["step"] += 1
    assert (one["loss"].iloc[0], one["step"].iloc[-1]) == (5.0, 1000)

    import polars

    frame = run.history(["loss"], format="polars")
    assert isinstance(frame, polars.DataFrame)
    assert frame["loss"].to_list() == [logged["loss"][s] for s in range(1000)]


def test_a_resumed_run_reads_as_one_history_and_each_attempt_alone(tracking_server, tmp_path):
    spool = tmp_path / "spool"
    log_run(tracking_server, spool, "resumed", range(0, 10))
    # The second attempt resumed from its step-5 checkpoint: steps 5.. again.
    log_run(tracking_server, spool, "resumed", range(5, 15), loss=lambda s: 100 + s)
    run = relaunch.Api(tracking_server.url).run("resumed")
    assert run.attempts == 2
    history = run.history("loss", layout="long")
    assert history["step"].tolist() == list(range(15))
    assert history["value"].tolist() == [s / 10 for s in range(5)] + [100 + s for s in range(5, 15)]
    assert history["attempt"].tolist() == [0] * 5 + [1] * 10
    first = run.history("loss", attempt=0)
    assert first["loss"].tolist() == [s / 10 for s in range(10)]


def test_ranks_are_rows_of_their_own(tracking_server, tmp_path, monkeypatch):
    monkeypatch.setenv("RELAUNCH_ATTEMPT_TOKEN", "one-attempt")
    for rank in (0, 1):
        log_run(
            tracking_server,
            tmp_path / f"spool{rank}",
            "ranks",
            range(4),
            rank=rank,
            loss=lambda s, r=rank: s + 100 * r,
        )
    run = relaunch.Api(tracking_server.url).run("ranks")
    both = run.history("loss")
    assert both[["rank", "step", "loss"]].values.tolist() == [
        [0, 0, 0.0], [0, 1, 1.0], [0, 2, 2.0], [0, 3, 3.0],
        [1, 0, 100.0], [1, 1, 101.0], [1, 2, 102.0], [1, 3, 103.0],
    ]  # fmt: skip
    assert run.history("loss", rank=1)["loss"].tolist() == [100.0, 101.0, 102.0, 103.0]
    assert run.history("loss", rank=5).empty
    assert run.summary["loss"] == 3.0  # the lowest rank's, as the dashboard shows


def test_runs_are_filtered_on_status_tags_config_and_summary(tracking_server, tmp_path):
    spool = tmp_path / "spool"
    for i, lr in enumerate((0.1, 0.01, 0.01)):
        log_run(
            tracking_server,
            spool,
            f"sweep-{i}",
            range(i + 2),
            project="sweep",
            config={"lr": lr, "model": {"depth": 10 + i}},
            tags=["long"] if i else [],
        )
    log_run(tracking_server, spool, "elsewhere", range(2), project="other", config={"lr": 0.01})
    api = relaunch.Api(tracking_server.url)
    ids = lambda runs: sorted(r.id for r in runs)  # noqa: E731
    assert ids(api.runs("sweep")) == ["sweep-0", "sweep-1", "sweep-2"]
    assert ids(api.runs("sweep", {"config.lr": 0.01})) == ["sweep-1", "sweep-2"]
    assert ids(api.runs(filters={"config.lr": 0.01})) == ["elsewhere", "sweep-1", "sweep-2"]
    assert ids(api.runs("sweep", {"config.model.depth": {"$gte": 11}})) == ["sweep-1", "sweep-2"]
    assert ids(api.runs("sweep", {"tags": "long", "status": "finished"})) == ["sweep-1", "sweep-2"]
    assert ids(api.runs("sweep", {"status": "running"})) == []
    # Newest loss: 0.1, 0.2, 0.3.
    assert ids(api.runs("sweep", {"summary.loss": {"$gt": 0.15}})) == ["sweep-1", "sweep-2"]
    assert ids(api.runs("sweep", {"summary.loss": 0.1})) == ["sweep-0"]
    assert ids(api.runs("sweep", {"summary.nothing": {"$lt": 1}})) == []
    assert len(api.runs("sweep", limit=2)) == 2
    assert len(api.runs("sweep", {"config.lr": {"$lt": 1}}, limit=1)) == 1


def test_the_summaries_of_a_listing_are_read_together_and_match_each_runs_own(
    tracking_server, tmp_path, monkeypatch
):
    spool = tmp_path / "spool"
    for i in range(12):
        log_run(
            tracking_server, spool, f"many-{i}", range(i + 1), project="many",
            loss=lambda s, i=i: i * 100 + s, rank=i % 2,
        )  # fmt: skip
    log_run(tracking_server, spool, "elsewhere", range(3), project="other")
    api = relaunch.Api(tracking_server.url)
    calls = []
    real_get = relaunch.api.Api._get

    def counted(self, what, path, query=()):
        calls.append(path)
        return real_get(self, what, path, query)

    monkeypatch.setattr(relaunch.api.Api, "_get", counted)
    runs = api.runs("many")
    summaries = {r.id: r.summary for r in runs}
    # One listing, then the metric names and their newest values: not a
    # request per run.
    assert calls == ["/runs", "/keys", "/latest"], calls
    for i in range(12):
        assert summaries[f"many-{i}"]["loss"] == i * 100 + i
    # The same as each run's own summary.
    for run in runs:
        assert api.run(run.id).summary == summaries[run.id]


def test_listings_are_read_a_page_at_a_time_with_the_filters_on_the_server(
    tracking_server, tmp_path, monkeypatch
):
    spool = tmp_path / "spool"
    for i in range(8):
        log_run(
            tracking_server, spool, f"paged-{i}", range(2), project="paged",
            config={"lr": i / 10, "opt": "adam" if i % 2 else "sgd"}, loss=lambda s, i=i: i + s,
        )  # fmt: skip
    # Pages of 3 runs stand for the 10,000 a request reads: before, a
    # listing stopped at the server's first page, silently.
    monkeypatch.setattr(relaunch.api, "_PAGE", 3)
    calls = []
    real_get = relaunch.api.Api._get

    def counted(self, what, path, query=()):
        calls.append((path, dict(query).get("offset"), list(query)))
        return real_get(self, what, path, query)

    monkeypatch.setattr(relaunch.api.Api, "_get", counted)
    api = relaunch.Api(tracking_server.url)
    runs = api.runs("paged")
    assert sorted(r.id for r in runs) == [f"paged-{i}" for i in range(8)]
    assert [(p, o) for p, o, _ in calls] == [("/runs", "0"), ("/runs", "3"), ("/runs", "6")]
    # Summaries page the same way; the newest loss of paged-i is i + 1.
    assert {r.id: r.summary["loss"] for r in runs} == {f"paged-{i}": i + 1.0 for i in range(8)}

    # Comparisons go to the server: no summaries are read to filter.
    calls.clear()
    got = api.runs("paged", {"summary.loss": {"$gte": 3, "$lt": 6}, "config.opt": {"$ne": "sgd"}})
    assert [r.id for r in got] == ["paged-3"]
    assert {p for p, _, _ in calls} == {"/runs"}
    sent = calls[0][2]
    assert ("metric", "loss>=3.0") in sent and ("metric", "loss<6.0") in sent
    assert ("param", 'opt!="sgd"') in sent
    # What the server cannot apply ($in) is applied here, on every page.
    got = api.runs("paged", {"config.lr": {"$in": [0.1, 0.6]}, "summary.loss": {"$gt": 1}})
    assert sorted(r.id for r in got) == ["paged-1", "paged-6"]
    assert len(api.runs("paged", limit=4)) == 4


def test_events_files_and_downloads_of_a_run(tracking_server, tmp_path):
    log_run(tracking_server, tmp_path / "spool", "things", range(3))
    data = tmp_path / "weights.bin"
    data.write_bytes(bytes(range(256)) * 1000)
    relaunch.upload_file(data, "things", "ckpt/weights.bin", server=tracking_server.url)
    run = relaunch.Api(tracking_server.url).run("things")
    assert [f["name"] for f in run.files()] == ["ckpt/weights.bin"]
    got = run.download("ckpt/weights.bin", tmp_path / "copy.bin")
    assert got.read_bytes() == data.read_bytes()
    events = run.events()
    assert [e["kind"] for e in events] == ["start", "finished"]
    assert events[0]["data"]["rank"] == 0 and events[0]["attempt"] == 0
    assert run.logs() == []  # a run not started by `relaunch run` has no console


def test_bad_input_says_what_was_wrong(tracking_server, tmp_path, monkeypatch):
    monkeypatch.delenv("RELAUNCH_SERVER", raising=False)
    with pytest.raises(TrackingConfigError, match="pass Api\\(server="):
        relaunch.Api()
    with pytest.raises(ValueError, match="timeout=0"):
        relaunch.Api(tracking_server.url, timeout=0)
    log_run(tracking_server, tmp_path / "spool", "bad", range(2))
    api = relaunch.Api(tracking_server.url)
    with pytest.raises(LookupError, match="nope"):
        api.run("nope")
    run = api.run("bad")
    with pytest.raises(LookupError, match='no metric "missing"'):
        run.history("missing")
    with pytest.raises(ValueError, match="rank=-1"):
        run.history(rank=-1)
    with pytest.raises(ValueError, match="layout='tall'"):
        run.history(layout="tall")
    with pytest.raises(TypeError, match="a key is a str"):
        run.history([1])
    with pytest.raises(ValueError, match="unknown filter 'lr'"):
        api.runs(filters={"lr": 0.1})
    with pytest.raises(ValueError, match="a status is one of"):
        api.runs(filters={"status": "done"})
    with pytest.raises(TrackingConfigError):
        relaunch.Api("ftp://nowhere")
    # A server that is not there: a connection error naming it, in bounded time.
    with pytest.raises(relaunch.TrackingConnectionError, match="relaunch server"):
        relaunch.Api("http://127.0.0.1:9", timeout=5).run("x")


def test_an_empty_history_is_an_empty_frame(tracking_server, tmp_path):
    log_run(tracking_server, tmp_path / "spool", "short", range(3))
    run = relaunch.Api(tracking_server.url).run("short")
    assert run.history(min_step=100).empty
    assert isinstance(run.history(min_step=100, layout="long"), pd.DataFrame)


def export(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "relaunch", "export", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_relaunch_export_writes_every_point_of_several_runs_as_csv(tracking_server, tmp_path):
    spool = tmp_path / "spool"
    odd = {0: math.nan, 2: math.inf, 4: -math.inf}
    log_run(tracking_server, spool, "ex-1", range(6), acc=lambda s: odd.get(s, s / 7))
    log_run(tracking_server, spool, "ex-2", range(3))
    out = export("ex-1", "ex-2", "--server", tracking_server.url)
    assert out.returncode == 0, out.stderr
    table = pd.read_csv(io.StringIO(out.stdout))  # pandas 3 reads floats round-trip
    assert list(table.columns) == ["run", "rank", "step", "key", "value", "wall", "attempt"]
    api = relaunch.Api(tracking_server.url)
    for run_id in ("ex-1", "ex-2"):
        mine = table[table["run"] == run_id].reset_index(drop=True)
        long = api.run(run_id).history(layout="long")
        assert mine["step"].tolist() == long["step"].tolist()
        assert mine["key"].tolist() == long["key"].astype(str).tolist()
        assert np.array_equal(mine["value"], long["value"], equal_nan=True)
        assert mine["wall"].tolist() == long["wall"].tolist()
    acc = table[(table["run"] == "ex-1") & (table["key"] == "acc")].set_index("step")["value"]
    assert math.isnan(acc[0]) and acc[2] == math.inf and acc[4] == -math.inf
    only = pd.read_csv(
        io.StringIO(
            export(
                "ex-1", "--key", "loss", "--min-step", "2", "--server", tracking_server.url
            ).stdout
        )
    )
    assert only["step"].tolist() == [2, 3, 4, 5] and set(only["key"]) == {"loss"}

    bad = export("ex-1", "--min-step", "5", "--max-step", "1", "--server", tracking_server.url)
    assert bad.returncode != 0 and "swap them" in bad.stderr
    bad = export("nope", "--server", tracking_server.url)
    assert bad.returncode != 0 and "nope" in bad.stderr, bad.stderr
    bad = export("ex-1", "--key", "missing", "--server", tracking_server.url)
    assert bad.returncode != 0 and 'no metric "missing"' in bad.stderr, bad.stderr


def test_relaunch_export_writes_parquet_that_reads_back_exactly(tracking_server, tmp_path):
    import polars

    spool = tmp_path / "spool"
    odd = {0: math.nan, 2: math.inf, 4: -math.inf}
    log_run(tracking_server, spool, "pq-1", range(6), acc=lambda s: odd.get(s, s / 7))
    log_run(tracking_server, spool, "pq-2", range(3), rank=3)
    target = tmp_path / "out" / "runs.parquet"
    target.parent.mkdir()
    out = export(
        "pq-1", "pq-2", "--format", "parquet", "-o", target, "--server", tracking_server.url
    )
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in target.parent.iterdir()) == ["runs.parquet"]
    table = polars.read_parquet(target)
    assert table.columns == ["run", "rank", "step", "key", "value", "wall", "attempt"]
    assert table.schema["step"] == polars.Int64 and table.schema["rank"] == polars.UInt32
    assert table.schema["value"] == polars.Float64 and table.schema["run"] == polars.String
    csv = pd.read_csv(io.StringIO(export("pq-1", "pq-2", "--server", tracking_server.url).stdout))
    assert table["run"].to_list() == csv["run"].tolist()
    assert table["step"].to_list() == csv["step"].tolist()
    assert table["key"].to_list() == csv["key"].tolist()
    assert table["rank"].to_list() == csv["rank"].tolist() and 3 in table["rank"].to_list()
    assert np.array_equal(table["value"].to_numpy(), csv["value"].to_numpy(), equal_nan=True)
    assert table["wall"].to_list() == csv["wall"].tolist()
    assert table["attempt"].to_list() == csv["attempt"].tolist()
    # A failed export leaves no file, whole or partial.
    missing = tmp_path / "out" / "missing.parquet"
    bad = export("nope", "--format", "parquet", "-o", missing, "--server", tracking_server.url)
    assert bad.returncode != 0 and "nope" in bad.stderr
    assert sorted(p.name for p in target.parent.iterdir()) == ["runs.parquet"]
