"""The tracking benchmark: relaunch's tracking client and server against
wandb (offline) and an MLflow tracking server, same workloads, same run,
reported as ratios.

    bash bench/tracking/setup.sh        # the peers, in bench/tracking/.venv
    .venv/bin/python bench/tracking/run.py [--repeat 3] [--quick]

Three figures, each measured on both sides alternately `--repeat` times
(the median is reported):
- `run.log` with 4 scalars: per-call time (median and p99 of every call)
  against wandb's `run.log` (WANDB_MODE=offline) and MLflow's
  `mlflow.log_metrics` (synchronous, and with `synchronous=False`) to an
  `mlflow server` with a SQLite backend;
- ingest from 8 writer processes into one run: points/s from the go until
  every writer's last write was acknowledged, against the MLflow server
  receiving `log_batch` (1,000 metrics a request, its maximum); once through
  each side's Python client, once with batches built beforehand and POSTed
  over HTTP (the server alone);
- reading a 10-million-point series downsampled to 1,000 buckets, and a
  series of MLflow's size on both sides (MLflow's chart endpoint
  `get-history-bulk-interval`, and its client's `get_metric_history`);
  and every point of each into a pandas DataFrame (`relaunch.Api`'s
  `history` against `get_metric_history` into pandas).
relaunch's side runs with this Python (the project's `.venv`), the peers'
with `bench/tracking/.venv`. Every process and server shares the machine's
CPUs. Results go to stdout as a markdown table and to bench/out/tracking.json.
The ratio is relaunch's advantage: above 1 means relaunch did better.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from common import free_port, race, write_result  # noqa: E402
from common import run_json as common_run_json  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKLOAD = HERE / "workload.py"
OURS_PY = Path(sys.executable)
PEER_VENV = Path(os.environ.get("BENCH_VENV", HERE / ".venv"))
PEER_PY = PEER_VENV / "bin" / "python"
WRITERS = 8
# relaunch's side runs from a copy of the installed package taken when the
# benchmark starts (`snapshot_relaunch`), so that a reinstall into .venv
# during a run cannot mix two builds.
OURS_ENV: dict[str, str] = dict(os.environ)


def fmt(value: float, unit: str) -> str:
    digits = {"us": 2, "ms": 1, "s": 2}.get(unit, 0)
    return f"{value:,.{digits}f} {unit}"


def snapshot_relaunch(work: Path) -> None:
    import relaunch

    dest = work / "relaunch-package"
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(relaunch.__file__).parent, dest / "relaunch", ignore=ignore)
    OURS_ENV["PYTHONPATH"] = str(dest)


def env_for(command: list) -> dict | None:
    return OURS_ENV if Path(command[0]) == OURS_PY else None


def run_json(cmd: list, timeout: float = 3600) -> dict:
    return common_run_json(cmd, timeout, env=env_for(cmd))


def wait_http(url: str, deadline: float, what: str) -> None:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not answer {url}")
        time.sleep(0.1)


class Server:
    """A server process, stopped with SIGTERM (then SIGKILL)."""

    proc: subprocess.Popen
    url: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        log = getattr(self, "log", None)
        if log is not None:
            log.close()


class RelaunchServer(Server):
    def __init__(self, data_dir: Path, durability: str = "fsync"):
        command = [OURS_PY, "-m", "relaunch", "server", "--data-dir", data_dir,
                   "--host", "127.0.0.1", "--port", "0", "--durability", durability,
                   "--log", "warn"]  # fmt: skip
        self.proc = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, start_new_session=True, env=OURS_ENV
        )
        # The status line is on stderr; `--log warn` keeps the rest of it quiet.
        line = self.proc.stderr.readline()
        if not line.startswith("relaunch server: "):
            self.stop()
            raise RuntimeError(f"relaunch server did not start: {line!r}")
        self.url = line.split()[2]
        # Drained, so that a burst of warnings never blocks the server on a full pipe.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()


class MlflowServer(Server):
    def __init__(self, data_dir: Path, http: str):
        data_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log = open(data_dir / "server.log", "w")
        command = [PEER_VENV / "bin" / "mlflow", "server",
                   "--backend-store-uri", f"sqlite:///{data_dir / 'mlflow.db'}",
                   "--default-artifact-root", (data_dir / "artifacts").as_uri(),
                   "--host", "127.0.0.1", "--port", str(port)]  # fmt: skip
        if http == "gunicorn":
            # Its default, uvicorn, answers a request on a kept-alive connection
            # (what MLflow's client uses) ~40 ms later than on a fresh one here;
            # gunicorn's sync workers take a fresh connection for each request.
            command += ["--gunicorn-opts", "--log-level warning"]
        # MLflow 3 also starts job runners for its GenAI features, 8
        # processes that take CPU from everything else while they start;
        # metrics tracking does not use them.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.proc = subprocess.Popen(
            command, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True, env=env
        )
        wait_http(self.url + "/health", time.monotonic() + 180, "mlflow server")


def versions() -> dict:
    code = (
        "import importlib.metadata as m, json;"
        "print(json.dumps({p: m.version(p) for p in ('wandb', 'mlflow')}))"
    )
    peers = subprocess.run([PEER_PY, "-c", code], capture_output=True, text=True, check=True)
    import relaunch

    git = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    return {"relaunch": f"{relaunch.__version__} ({commit})", **json.loads(peers.stdout)}


@dataclass
class Row:
    name: str
    unit: str
    better: str  # "higher" or "lower"
    ours: float
    peer: str
    theirs: float | None = None
    target: str = ""
    met: bool | None = None
    samples: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        if self.theirs is None:
            return None
        return self.ours / self.theirs if self.better == "higher" else self.theirs / self.ours


def cmd(py: Path, sub: str, **opts: object) -> list:
    """`PY workload.py SUB --opt value ...`; options that are None are left out."""
    args: list = [py, WORKLOAD, sub]
    for name, value in opts.items():
        if value is not None:
            args += [f"--{name.replace('_', '-')}", str(value)]
    return args


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path):
        self.a = a
        self.work = work
        self.rows: list[Row] = []
        self.extra: dict = {}

    def add(self, row: Row) -> None:
        self.rows.append(row)
        theirs = "-" if row.theirs is None else fmt(row.theirs, row.unit)
        ratio = "" if row.ratio is None else f"  ratio {row.ratio:,.1f}x"
        met = "" if row.met is None else f"  target {row.target}: {'met' if row.met else 'NOT met'}"
        print(f"{row.name}: relaunch {fmt(row.ours, row.unit)}, {row.peer} {theirs}{ratio}{met}")
        sys.stdout.flush()

    def tmp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))

    # --- run.log ---------------------------------------------------------

    def log_cost(self, ours_url: str, mlflow_url: str) -> None:
        a = self.a
        sides = {
            "relaunch": (OURS_PY, ours_url, a.log_calls),
            "wandb": (PEER_PY, None, a.peer_log_calls),
            "mlflow": (PEER_PY, mlflow_url, a.mlflow_log_calls),
            "mlflow-async": (PEER_PY, mlflow_url, a.mlflow_async_calls),
        }
        results: dict[str, list[dict]] = {side: [] for side in sides}
        for _ in range(a.repeat):
            for side, (py, url, calls) in sides.items():
                command = cmd(py, "log", side=side, calls=calls, url=url, dir=self.tmp(side))
                results[side].append(run_json(command))
        self.extra["log"] = results

        def med(side: str, key: str) -> float:
            return statistics.median(r[key] for r in results[side])

        peers = {
            "wandb": "wandb offline",
            "mlflow": "mlflow log_metrics",
            "mlflow-async": "mlflow log_metrics(synchronous=False)",
        }
        for key, what in (("median_us", "median"), ("p99_us", "p99")):
            for side, label in peers.items():
                ours = med("relaunch", key)
                row = Row(f"run.log, 4 scalars: {what} per call", "us", "lower", ours, label)
                row.theirs = med(side, key)
                if key == "median_us":
                    row.target, row.met = "<= 5 us", ours <= 5.0
                row.samples = {s: [r[key] for r in results[s]] for s in ("relaunch", side)}
                self.add(row)

    # --- 8-writer ingest ---------------------------------------------------

    def writers(self, py: Path, sub: str, side: str, url: str, run: str, steps: int) -> dict:
        """Starts 8 writers, waits until all are ready, lets them go at once;
        points/s from the go to the last acknowledgement."""
        procs = []
        for rank in range(WRITERS):
            command = cmd(
                py, sub, side=side, url=url, run=run, rank=rank, steps=steps,
                keys=self.a.keys, dir=self.tmp(f"writer{rank}"),
            )  # fmt: skip
            pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
            procs.append(subprocess.Popen(command, env=env_for(command), **pipes))
        return race(procs, f"{sub} {side}")

    def ingest(self, ours_url: str, mlflow_url: str) -> None:
        a = self.a
        kinds = {"": "writer", "-raw": "raw-writer"}
        results: dict[str, list[dict]] = {
            side + suffix: [] for side in ("relaunch", "mlflow") for suffix in kinds
        }
        for i in range(a.repeat):
            for suffix, sub in kinds.items():
                run = f"ingest{suffix}-{i}-{os.getpid()}"
                results["relaunch" + suffix].append(
                    self.writers(OURS_PY, sub, "relaunch", ours_url, run, a.steps)
                )
                run = run_json(cmd(PEER_PY, "mlflow-run", url=mlflow_url))["run_id"]
                results["mlflow" + suffix].append(
                    self.writers(PEER_PY, sub, "mlflow", mlflow_url, run, a.mlflow_steps)
                )
        self.extra["ingest"] = results

        for suffix, what in (("", "Python clients"), ("-raw", "pre-built batches over HTTP")):
            samples = {
                s: [r["points_per_s"] for r in results[s + suffix]] for s in ("relaunch", "mlflow")
            }
            ours = statistics.median(samples["relaunch"])
            row = Row(f"ingest, {WRITERS} writer processes, {what}", "points/s", "higher", ours,
                      "mlflow log_batch", statistics.median(samples["mlflow"]))  # fmt: skip
            row.samples = samples
            if suffix == "":
                row.target, row.met = ">= 1,000,000 points/s", ours >= 1e6
            self.add(row)

    # --- series reads -------------------------------------------------------

    def reads(self, mlflow_url: str) -> None:
        a = self.a
        server = RelaunchServer(self.tmp("series-data"), durability="process")
        big, small = f"series-{a.points}", f"series-{a.mlflow_points}"
        try:
            loads = {}
            for run, points in ((big, a.points), (small, a.mlflow_points)):
                loads[run] = run_json(
                    cmd(
                        OURS_PY,
                        "load",
                        url=server.url,
                        run=run,
                        points=points,
                        dir=self.tmp("load"),
                    )
                )
                print(f"  loaded {points:,} points into relaunch in {loads[run]['total_s']:.1f} s")
            mlflow_run = run_json(cmd(PEER_PY, "mlflow-run", url=mlflow_url, experiment="series"))[
                "run_id"
            ]
            loads["mlflow"] = run_json(
                cmd(PEER_PY, "load", side="mlflow", url=mlflow_url, run=mlflow_run,
                    points=a.mlflow_points)
            )  # fmt: skip
            seconds = loads["mlflow"]["total_s"]
            print(f"  loaded {a.mlflow_points:,} points into mlflow in {seconds:.1f} s")
            self.extra["loads"] = loads
            sides = {
                "relaunch-big": (OURS_PY, "relaunch", server.url, big, a.points, 10),
                "relaunch-small": (OURS_PY, "relaunch", server.url, small, a.mlflow_points, 10),
                "mlflow": (PEER_PY, "mlflow", mlflow_url, mlflow_run, a.mlflow_points, 10),
                "mlflow-history": (
                    PEER_PY, "mlflow-history", mlflow_url, mlflow_run, a.mlflow_points, 1
                ),
                "relaunch-frame-big": (OURS_PY, "relaunch-frame", server.url, big, a.points, 3),
                "relaunch-frame-small": (
                    OURS_PY, "relaunch-frame", server.url, small, a.mlflow_points, 3
                ),
                "mlflow-frame": (
                    PEER_PY, "mlflow-frame", mlflow_url, mlflow_run, a.mlflow_points, 1
                ),
            }  # fmt: skip
            results: dict[str, list[dict]] = {side: [] for side in sides}
            for _ in range(a.repeat):
                for side, (py, kind, url, run, points, reads) in sides.items():
                    command = cmd(
                        py, "read", side=kind, url=url, run=run, points=points, reads=reads
                    )
                    results[side].append(run_json(command))
        finally:
            server.stop()
        self.extra["reads"] = results

        def row(name: str, ours: str, peer: str, theirs: str, **kw: object) -> Row:
            samples = {s: [r["median_ms"] for r in results[s]] for s in (ours, theirs)}
            o, t = (statistics.median(samples[s]) for s in (ours, theirs))
            return Row(name, "ms", "lower", o, peer, t, samples=samples, **kw)

        m = f"{a.mlflow_points / 1e6:g}M"
        big_ms = statistics.median(r["median_ms"] for r in results["relaunch-big"])
        self.add(row(f"read a {a.points / 1e6:g}M-point series, 1,000 buckets", "relaunch-big",
                     f"mlflow get-history-bulk-interval, {m} points", "mlflow",
                     target="< 50 ms", met=big_ms < 50))  # fmt: skip
        self.add(row(f"read a {m}-point series, 1,000 buckets (same series on both)",
                     "relaunch-small", "mlflow get-history-bulk-interval", "mlflow"))  # fmt: skip
        self.add(row(f"read a {m}-point series: relaunch 1,000 buckets, mlflow every point",
                     "relaunch-small", "mlflow get_metric_history", "mlflow-history"))  # fmt: skip
        frame_ms = statistics.median(r["median_ms"] for r in results["relaunch-frame-big"])
        self.add(row(f"every point of a {a.points / 1e6:g}M-point series into a pandas "
                     "DataFrame (relaunch.Api history)", "relaunch-frame-big",
                     f"mlflow get_metric_history into pandas, {m} points", "mlflow-frame",
                     target="< 1,000 ms", met=frame_ms < 1000))  # fmt: skip
        self.add(row(f"every point of a {m}-point series into a pandas DataFrame (same "
                     "series on both)", "relaunch-frame-small",
                     "mlflow get_metric_history into pandas", "mlflow-frame"))  # fmt: skip
        rates = {
            s: loads[r]["points"] / loads[r]["total_s"]
            for s, r in (("relaunch", big), ("mlflow", "mlflow"))
        }
        name = f"load the series: 1 writer process ({a.points / 1e6:g}M vs {m} points)"
        self.add(Row(name, "points/s", "higher", rates["relaunch"], "mlflow log_batch",
                     rates["mlflow"]))  # fmt: skip

    # --- many runs' summaries ---------------------------------------------

    def summaries(self, mlflow_url: str) -> None:
        a = self.a
        server = RelaunchServer(self.tmp("summaries-data"), durability="process")
        try:
            for py, side, url in (
                (OURS_PY, "relaunch", server.url),
                (PEER_PY, "mlflow", mlflow_url),
            ):
                loaded = run_json(cmd(py, "load-runs", side=side, url=url, run="sweep",
                                      runs=a.runs, dir=self.tmp("runs")))  # fmt: skip
                print(f"  loaded {a.runs:,} runs into {side} in {loaded['total_s']:.1f} s")
            results: dict[str, list[dict]] = {"relaunch": [], "mlflow": []}
            for _ in range(a.repeat):
                for py, side, url in ((OURS_PY, "relaunch", server.url),
                                      (PEER_PY, "mlflow", mlflow_url)):  # fmt: skip
                    results[side].append(run_json(cmd(py, "summaries", side=side, url=url,
                                                      run="sweep", runs=a.runs)))  # fmt: skip
        finally:
            server.stop()
        self.extra["summaries"] = results
        samples = {s: [r["median_ms"] for r in results[s]] for s in results}
        ours, theirs = (statistics.median(samples[s]) for s in ("relaunch", "mlflow"))
        self.add(Row(f"{a.runs:,} runs' configs and summaries (Api.runs + .summary)", "ms",
                     "lower", ours, "mlflow search_runs into a DataFrame", theirs,
                     samples=samples, target="< 1,000 ms", met=ours < 1000))  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repeat of small sizes")
    p.add_argument("--only", default="log,ingest,read,summaries", help="figures to measure")
    p.add_argument("--runs", type=int, default=1000, help="runs whose summaries are read")
    p.add_argument("--log-calls", type=int, default=200_000, help="relaunch run.log calls")
    p.add_argument("--peer-log-calls", type=int, default=20_000, help="wandb run.log calls")
    p.add_argument("--mlflow-log-calls", type=int, default=200, help="mlflow, synchronous")
    # Its background sender falls behind the calls: end_run waits minutes for 20,000.
    p.add_argument("--mlflow-async-calls", type=int, default=2_000, help="mlflow, asynchronous")
    p.add_argument("--keys", type=int, default=10, help="values per step, ingest")
    p.add_argument("--steps", type=int, default=50_000, help="steps per relaunch writer")
    p.add_argument("--mlflow-steps", type=int, default=1_000, help="steps per mlflow writer")
    p.add_argument("--points", type=int, default=10_000_000, help="the long series")
    p.add_argument("--mlflow-points", type=int, default=200_000, help="MLflow's series")
    p.add_argument(
        "--mlflow-http",
        choices=["gunicorn", "uvicorn"],
        default="uvicorn",
        help="the MLflow server's HTTP server: uvicorn (its default) or gunicorn",
    )
    a = p.parse_args()
    if a.quick:
        a.repeat = 1
        a.log_calls, a.peer_log_calls, a.mlflow_log_calls = 20_000, 2_000, 100
        a.mlflow_async_calls = 1_000
        a.steps, a.mlflow_steps = 5_000, 250
        a.points, a.mlflow_points = 1_000_000, 100_000
        a.runs = 200
    if not PEER_PY.exists():
        raise SystemExit(f"{PEER_PY} is missing: run `bash bench/tracking/setup.sh` first")
    only = set(a.only.split(","))

    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="relaunch-bench-tracking-"))
    bench = Bench(a, work)
    ours = mlflow = None
    try:
        snapshot_relaunch(work)
        ours = RelaunchServer(work / "relaunch-data")
        mlflow = MlflowServer(work / "mlflow-data", a.mlflow_http)
        vers = versions()
        print(
            f"# tracking benchmark, {os.cpu_count()} CPUs, median of {a.repeat}, {vers}", flush=True
        )
        if "log" in only:
            bench.log_cost(ours.url, mlflow.url)
        if "ingest" in only:
            bench.ingest(ours.url, mlflow.url)
        if "read" in only:
            bench.reads(mlflow.url)
        if "summaries" in only:
            bench.summaries(mlflow.url)
    finally:
        for server in (ours, mlflow):
            if server is not None:
                server.stop()
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "started": started,
        "cpus": os.cpu_count(),
        "versions": vers,
        "args": vars(a),
        "rows": [{**r.__dict__, "ratio": r.ratio} for r in bench.rows],
        "raw": bench.extra,
    }
    write_result("tracking", result)
    print("\n| figure | relaunch | peer | peer's figure | ratio | target | met? |")
    print("|---|---|---|---|---|---|---|")
    for r in bench.rows:
        theirs = "-" if r.theirs is None else fmt(r.theirs, r.unit)
        ratio = "-" if r.ratio is None else f"{r.ratio:,.1f}x"
        met = "" if r.met is None else ("yes" if r.met else "**no**")
        print(
            f"| {r.name} | {fmt(r.ours, r.unit)} | {r.peer} | {theirs} | {ratio} "
            f"| {r.target} | {met} |"
        )


if __name__ == "__main__":
    main()
