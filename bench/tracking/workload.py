"""One side of one tracking measurement; `run.py` spawns it and reads the
JSON line it prints last.

relaunch's side runs with the project's Python (`.venv/bin/python`), the
peers' with the benchmark's own (`bench/tracking/.venv/bin/python`), so this
file imports a tracker only inside the subcommand that uses it.

    PY workload.py log --side relaunch|wandb|mlflow|mlflow-async --calls N ...
    PY workload.py writer --side relaunch|mlflow --rank I ...     (one of 8)
    PY workload.py raw-writer --side relaunch|mlflow --rank I ... (one of 8)
    PY workload.py load --side relaunch|mlflow --points N ...
    PY workload.py read --side relaunch|mlflow|mlflow-history --reads N ...
    PY workload.py mlflow-run --url URL                           (prints a run id)

A writer prints `ready` once it is set up, waits for a line on stdin (the
go), does its work, and prints `time.monotonic()` at the moment its last
write was acknowledged: CLOCK_MONOTONIC is one clock for every process of
the machine, so the parent takes the latest of them as the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import struct
import sys
import time
import urllib.parse

# The 4 scalars of a training step, as a loop logs them.
STEP_KEYS = ("loss", "accuracy", "learning_rate", "grad_norm")


def out(result: dict) -> None:
    print(json.dumps(result), flush=True)


def percentiles(samples: list[int]) -> dict:
    s = sorted(samples)
    n = len(s)
    return {
        "median_us": s[n // 2] / 1e3,
        "p99_us": s[min(n - 1, int(n * 0.99))] / 1e3,
        "p999_us": s[min(n - 1, int(n * 0.999))] / 1e3,
        "max_us": s[-1] / 1e3,
    }


def timer_overhead_ns() -> float:
    """What `perf_counter_ns()` twice around nothing measures (median)."""
    pc = time.perf_counter_ns
    samples = []
    for _ in range(20_000):
        t0 = pc()
        samples.append(pc() - t0)
    samples.sort()
    return samples[len(samples) // 2]


# --- run.log cost ---------------------------------------------------------


def open_logger(a: argparse.Namespace):
    """Returns `(log(values, step), finish())` for the side."""
    if a.side == "relaunch":
        import relaunch

        run = relaunch.init(project="bench", server=a.url, dir=a.dir)
        log = run.log
        return (lambda values, step: log(values)), run.finish
    if a.side == "wandb":
        os.environ["WANDB_MODE"] = "offline"
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        run = wandb.init(project="bench", dir=a.dir, mode="offline")
        log = run.log
        return (lambda values, step: log(values)), run.finish
    if a.side in ("mlflow", "mlflow-async"):
        import mlflow

        mlflow.set_tracking_uri(a.url)
        mlflow.set_experiment("bench-log")
        mlflow.start_run()
        sync = a.side == "mlflow"
        log_metrics = mlflow.log_metrics
        if sync:
            return (lambda values, step: log_metrics(values, step=step)), mlflow.end_run
        return (
            lambda values, step: log_metrics(values, step=step, synchronous=False)
        ), mlflow.end_run
    raise SystemExit(f"unknown side {a.side}")


def cmd_log(a: argparse.Namespace) -> None:
    log, finish = open_logger(a)
    k0, k1, k2, k3 = STEP_KEYS
    for step in range(a.warmup):
        log({k0: 1.0, k1: 0.5, k2: 1e-3, k3: 2.0}, step)
    pc = time.perf_counter_ns
    n = a.calls
    samples = [0] * n
    started = time.perf_counter()
    for i in range(n):
        step = a.warmup + i
        x = 1.0 / (step + 1)
        values = {k0: x, k1: 1.0 - x, k2: 1e-3, k3: 2.0 * x}
        t0 = pc()
        log(values, step)
        samples[i] = pc() - t0
    loop = time.perf_counter() - started
    started = time.perf_counter()
    finish()
    out(
        {
            "side": a.side,
            "calls": n,
            **percentiles(samples),
            "mean_us": sum(samples) / n / 1e3,
            "loop_us_per_call": loop / n * 1e6,
            "finish_s": time.perf_counter() - started,
            "timer_overhead_ns": timer_overhead_ns(),
        }
    )


# --- 8-writer ingest ------------------------------------------------------


def wait_for_go() -> None:
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("no go from the parent")


def cmd_writer(a: argparse.Namespace) -> None:
    """`--steps` log calls of `--keys` values each, then a flush: one writer
    of the 8-process ingest."""
    keys = [f"metric_{k:02d}" for k in range(a.keys)]
    # The dicts a training loop would build, made before the clock starts.
    rows = [{k: float(step * a.keys + j) for j, k in enumerate(keys)} for step in range(a.steps)]
    if a.side == "relaunch":
        import relaunch

        os.environ["RELAUNCH_ATTEMPT_TOKEN"] = a.run
        run = relaunch.init(project="bench", id=a.run, rank=a.rank, server=a.url, dir=a.dir)
        log = run.log
        wait_for_go()
        started = time.monotonic()
        for values in rows:
            log(values)
        logged = time.monotonic()
        run.flush()
        done = time.monotonic()
        out({"started": started, "logged": logged, "done": done, "points": a.steps * a.keys})
        run.finish()
        return
    if a.side == "mlflow":
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        client = MlflowClient(a.url)
        wall = int(time.time() * 1000)
        metrics = [
            Metric(f"rank{a.rank}/{k}", v, wall, step)
            for step, values in enumerate(rows)
            for k, v in values.items()
        ]
        batches = [metrics[i : i + 1000] for i in range(0, len(metrics), 1000)]
        wait_for_go()
        started = time.monotonic()
        for batch in batches:
            client.log_batch(a.run, metrics=batch)
        done = time.monotonic()
        out({"started": started, "logged": done, "done": done, "points": len(metrics)})
        return
    raise SystemExit(f"unknown side {a.side}")


def rlb3_str16(s: str) -> bytes:
    b = s.encode()
    return struct.pack("<H", len(b)) + b


def rlb3_batches(writer: str, token: str, rank: int, steps: int, keys: int, per_batch: int):
    """The wire form of `POST /runs/{id}/batches` (crates/relaunch-api/src/batch.rs)."""
    from relaunch import _native

    names = [rlb3_str16(f"metric_{k:02d}") for k in range(keys)]
    wall = time.time()
    bodies = []
    seq = 0
    for first in range(0, steps, per_batch):
        count = min(per_batch, steps - first)
        parts = [b"RLB3", rlb3_str16(writer), rlb3_str16(token), struct.pack("<I", count)]
        for step in range(first, first + count):
            seq += 1
            parts.append(struct.pack("<QBqdIH", seq, 1, step, wall, rank, keys))
            for j, name in enumerate(names):
                parts.append(name + struct.pack("<d", float(step * keys + j)))
        body = b"".join(parts)
        bodies.append(body + struct.pack("<I", _native.crc32c(body)))
    return bodies


def cmd_raw_writer(a: argparse.Namespace) -> None:
    """The server alone: batches built before the clock starts, POSTed one
    after the other on one keep-alive connection."""
    url = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    if a.side == "relaunch":
        writer, token = f"raw-{a.rank}", a.run
        body = json.dumps({"project": "bench", "id": a.run, "attempt_token": token})
        conn.request("POST", "/api/v1/runs", body, {"Content-Type": "application/json"})
        check(conn.getresponse())
        path = f"/api/v1/runs/{a.run}/batches"
        headers = {"Content-Type": "application/x-relaunch-batch"}
        bodies = rlb3_batches(writer, token, a.rank, a.steps, a.keys, a.per_batch)
        points = a.steps * a.keys
    elif a.side == "mlflow":
        path = "/api/2.0/mlflow/runs/log-batch"
        headers = {"Content-Type": "application/json"}
        wall = int(time.time() * 1000)
        metrics = [
            {
                "key": f"rank{a.rank}/metric_{k:02d}",
                "value": float(step * a.keys + k),
                "timestamp": wall,
                "step": step,
            }
            for step in range(a.steps)
            for k in range(a.keys)
        ]
        bodies = [
            json.dumps({"run_id": a.run, "metrics": metrics[i : i + 1000]}).encode()
            for i in range(0, len(metrics), 1000)
        ]
        points = len(metrics)
    else:
        raise SystemExit(f"unknown side {a.side}")
    wait_for_go()
    started = time.monotonic()
    for body in bodies:
        conn.request("POST", path, body, headers)
        check(conn.getresponse())
    done = time.monotonic()
    out({"started": started, "logged": done, "done": done, "points": points})


def check(response: http.client.HTTPResponse) -> bytes:
    body = response.read()
    if response.status != 200:
        raise SystemExit(f"HTTP {response.status}: {body[:500]!r}")
    return body


# --- the long series ------------------------------------------------------


def cmd_mlflow_run(a: argparse.Namespace) -> None:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(a.url)
    name = a.experiment
    exp = client.get_experiment_by_name(name)
    exp_id = exp.experiment_id if exp else client.create_experiment(name)
    out({"run_id": client.create_run(exp_id).info.run_id})


def cmd_load(a: argparse.Namespace) -> None:
    """`--points` steps of one key, `loss`, logged one call per step."""
    started = time.monotonic()
    if a.side == "relaunch":
        import relaunch

        run = relaunch.init(project="bench", id=a.run, server=a.url, dir=a.dir)
        log = run.log
        for step in range(a.points):
            log({"loss": 1.0 / (step + 1)})
        logged = time.monotonic()
        run.finish(timeout=3600)
    elif a.side == "mlflow":
        # MLflow's fastest path: log_batch of its most metrics per request.
        from mlflow.entities import Metric
        from mlflow.tracking import MlflowClient

        client = MlflowClient(a.url)
        wall = int(time.time() * 1000)
        for first in range(0, a.points, 1000):
            last = min(first + 1000, a.points)
            batch = [Metric("loss", 1.0 / (s + 1), wall, s) for s in range(first, last)]
            client.log_batch(a.run, metrics=batch)
        logged = time.monotonic()
    else:
        raise SystemExit(f"unknown side {a.side}")
    done = time.monotonic()
    out({"points": a.points, "log_s": logged - started, "total_s": done - started})


def timed(read, times: int) -> tuple[list[int], int]:
    """`read()` `times` times: each call's nanoseconds, and what the last returned."""
    samples = []
    returned = 0
    for _ in range(times):
        t0 = time.perf_counter_ns()
        returned = read()
        samples.append(time.perf_counter_ns() - t0)
    return samples, returned


def cmd_read(a: argparse.Namespace) -> None:
    """`--reads` reads of the series `loss`; each timed from request to
    parsed JSON (or to the list of Metric objects MLflow's client returns,
    or, for the `-frame` sides, to a pandas DataFrame of every point)."""
    url = urllib.parse.urlsplit(a.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    if a.side == "relaunch":
        path = f"/api/v1/runs/{a.run}/series?key=loss&buckets={a.buckets}"

        def read() -> int:
            conn.request("GET", path)
            series = json.loads(check(conn.getresponse()))
            assert series["total"] == a.points, (series["total"], a.points)
            return len(series["points"])
    elif a.side == "mlflow":
        # The endpoint MLflow's UI draws charts from: at most max_results
        # points of a series, sampled on the server.
        query = urllib.parse.urlencode(
            {"run_ids": a.run, "metric_key": "loss", "max_results": a.buckets}
        )
        path = f"/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval?{query}"

        def read() -> int:
            conn.request("GET", path)
            return len(json.loads(check(conn.getresponse()))["metrics"])
    elif a.side == "mlflow-history":
        from mlflow.tracking import MlflowClient

        client = MlflowClient(a.url)

        def read() -> int:
            n = len(client.get_metric_history(a.run, "loss"))
            assert n == a.points, (n, a.points)
            return n
    elif a.side == "relaunch-frame":
        import relaunch

        run = relaunch.Api(a.url, timeout=600).run(a.run)

        def read() -> int:
            frame = run.history("loss")
            assert len(frame) == a.points, (len(frame), a.points)
            return len(frame)
    elif a.side == "mlflow-frame":
        # What an MLflow user does to get a DataFrame: every point of the
        # metric through the client, into pandas.
        import pandas
        from mlflow.tracking import MlflowClient

        client = MlflowClient(a.url)

        def read() -> int:
            history = client.get_metric_history(a.run, "loss")
            frame = pandas.DataFrame(
                {
                    "step": [m.step for m in history],
                    "loss": [m.value for m in history],
                    "timestamp": [m.timestamp for m in history],
                }
            )
            assert len(frame) == a.points, (len(frame), a.points)
            return len(frame)
    else:
        raise SystemExit(f"unknown side {a.side}")
    samples, returned = timed(read, a.reads)
    out(
        {
            "first_ms": samples[0] / 1e6,
            "median_ms": sorted(samples)[len(samples) // 2] / 1e6,
            "samples_ms": [s / 1e6 for s in samples],
            "returned": returned,
        }
    )


# --- many runs' summaries -------------------------------------------------


def cmd_load_runs(a: argparse.Namespace) -> None:
    """`--runs` finished runs in project (experiment) `--run`, each with a
    config of 3 values and `--keys` metrics over 10 steps."""
    started = time.monotonic()
    keys = [f"metric_{k}" for k in range(a.keys)]
    if a.side == "relaunch":
        import relaunch

        for i in range(a.runs):
            config = {"lr": 10 ** -(i % 5), "seed": i, "depth": 4 + i % 3}
            run = relaunch.init(project=a.run, id=f"{a.run}-{i}", server=a.url, dir=a.dir,
                                config=config)  # fmt: skip
            for step in range(10):
                run.log({k: i + step / 10 + j for j, k in enumerate(keys)}, step=step)
            run.finish(timeout=600)
    elif a.side == "mlflow":
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        client = MlflowClient(a.url)
        exp = client.get_experiment_by_name(a.run)
        exp_id = exp.experiment_id if exp else client.create_experiment(a.run)
        wall = int(time.time() * 1000)
        for i in range(a.runs):
            run_id = client.create_run(exp_id).info.run_id
            params = [Param("lr", str(10 ** -(i % 5))), Param("seed", str(i)),
                      Param("depth", str(4 + i % 3))]  # fmt: skip
            metrics = [Metric(k, i + step / 10 + j, wall, step)
                       for step in range(10) for j, k in enumerate(keys)]  # fmt: skip
            client.log_batch(run_id, metrics=metrics, params=params)
            client.set_terminated(run_id)
    else:
        raise SystemExit(f"unknown side {a.side}")
    out({"runs": a.runs, "total_s": time.monotonic() - started})


def cmd_summaries(a: argparse.Namespace) -> None:
    """Every run of project `--run` with its config and newest metric values,
    as each library's users read them: `relaunch.Api().runs()` and each
    run's `.summary`; MLflow's `search_runs` (a DataFrame with `metrics.*`
    and `params.*` columns)."""
    if a.side == "relaunch":
        import relaunch

        api = relaunch.Api(a.url, timeout=600)

        def read() -> int:
            rows = [(r.id, r.config, r.summary) for r in api.runs(a.run)]
            assert all(len(s) == a.keys for _, _, s in rows), rows[:1]
            return len(rows)
    elif a.side == "mlflow":
        import mlflow

        mlflow.set_tracking_uri(a.url)
        exp_id = mlflow.get_experiment_by_name(a.run).experiment_id

        def read() -> int:
            frame = mlflow.search_runs(experiment_ids=[exp_id], max_results=100_000)
            return len(frame)
    else:
        raise SystemExit(f"unknown side {a.side}")
    samples, returned = timed(read, a.reads)
    assert returned == a.runs, (returned, a.runs)
    out({"median_ms": sorted(samples)[len(samples) // 2] / 1e6,
         "samples_ms": [x / 1e6 for x in samples], "returned": returned})  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--side", default="relaunch")
    common.add_argument("--url", help="the tracking server")
    common.add_argument("--dir", help="the client's local directory")
    common.add_argument("--run", help="the run id")
    s = sub.add_parser("log", parents=[common])
    s.add_argument("--calls", type=int, default=10_000)
    s.add_argument("--warmup", type=int, default=1_000)
    for name in ("writer", "raw-writer"):
        s = sub.add_parser(name, parents=[common])
        s.add_argument("--rank", type=int, default=0)
        s.add_argument("--steps", type=int, default=10_000)
        s.add_argument("--keys", type=int, default=10)
        s.add_argument("--per-batch", type=int, default=5_000, help="records per raw batch")
    s = sub.add_parser("load", parents=[common])
    s.add_argument("--points", type=int, default=1_000_000)
    s = sub.add_parser("read", parents=[common])
    s.add_argument("--points", type=int, default=1_000_000)
    s.add_argument("--buckets", type=int, default=1000)
    s.add_argument("--reads", type=int, default=10)
    s = sub.add_parser("load-runs", parents=[common])
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--keys", type=int, default=5)
    s = sub.add_parser("summaries", parents=[common])
    s.add_argument("--runs", type=int, default=1000)
    s.add_argument("--keys", type=int, default=5)
    s.add_argument("--reads", type=int, default=5)
    s = sub.add_parser("mlflow-run", parents=[common])
    s.add_argument("--experiment", default="bench")
    a = p.parse_args()
    {
        "log": cmd_log,
        "writer": cmd_writer,
        "raw-writer": cmd_raw_writer,
        "load": cmd_load,
        "read": cmd_read,
        "mlflow-run": cmd_mlflow_run,
        "load-runs": cmd_load_runs,
        "summaries": cmd_summaries,
    }[a.cmd](a)


if __name__ == "__main__":
    main()
