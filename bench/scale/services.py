"""The processes the scale-out benchmark starts and stops: a throwaway
PostgreSQL cluster, a SeaweedFS S3 service, `relaunch server` replicas, an
MLflow tracking server, and a sampler of their resident memory.

Each runs in a session of its own (`start_new_session`) and is stopped with
SIGTERM to its process group, SIGKILL after 30 s; `Services.close` stops
everything that was started, in reverse order, and removes its directories.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

MIB = 1 << 20


def wait_until(check, deadline: float, what: str, proc: subprocess.Popen | None = None) -> None:
    """Calls `check()` until it returns true; raises once `deadline`
    (monotonic) passes or `proc` exits."""
    while not check():
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not start in time")
        time.sleep(0.1)


def http_answers(url: str, ok_only: bool = True) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200 or not ok_only
    except urllib.error.HTTPError:
        return not ok_only
    except OSError:
        return False


def port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_pairs(n: int) -> list[int]:
    """`n` free ports below 55000 whose port + 10000 is free too (SeaweedFS
    listens there for gRPC), as scripts/s3.sh picks them."""
    import random

    ports: list[int] = []
    while len(ports) < n:
        p = random.randrange(20000, 55000)
        if p not in ports and p + 10000 not in ports and port_free(p) and port_free(p + 10000):
            ports.append(p)
    return ports


class Child:
    """A process in a session of its own, its output in a log file."""

    def __init__(self, name: str, command: list, log: Path, env: dict | None = None) -> None:
        self.name = name
        self.log_path = log
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(
            [str(c) for c in command],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        self.log.close()

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""


class RssSampler(threading.Thread):
    """Samples `VmRSS` of every registered process every `interval` s; keeps
    the maximum per phase and per process name."""

    def __init__(self, interval: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.interval = interval
        self.pids: dict[int, str] = {}
        self.phase = "setup"
        self.max_kib: dict[str, dict[str, int]] = {}
        self.samples = 0
        self.done = threading.Event()
        self.lock = threading.Lock()

    def watch(self, pid: int, name: str) -> None:
        with self.lock:
            self.pids[pid] = name

    def forget(self, pid: int) -> None:
        with self.lock:
            self.pids.pop(pid, None)

    def run(self) -> None:
        while not self.done.wait(self.interval):
            with self.lock:
                pids = dict(self.pids)
                phase = self.max_kib.setdefault(self.phase, {})
            for pid, name in pids.items():
                kib = rss_kib(pid)
                if kib > phase.get(name, 0):
                    phase[name] = kib
            self.samples += 1

    def phase_max_mib(self, phase: str) -> float:
        return max(self.max_kib.get(phase, {}).values(), default=0) / 1024

    def stop(self) -> None:
        self.done.set()
        self.join()


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_rss_kib(pid: int) -> int:
    """RSS of a process and its descendants (MLflow's server is a tree)."""
    total = rss_kib(pid)
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return total
    return total + sum(tree_rss_kib(int(c)) for c in children)


def pg_bindir() -> Path:
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name))
    for d in reversed(dirs):
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    raise RuntimeError("no PostgreSQL server installed (initdb not found): apt install postgresql")


class Postgres:
    """A throwaway cluster, made as scripts/postgres.sh makes one (initdb in
    a temporary directory, as the `postgres` user when run as root,
    password authentication over TCP on a free port of 127.0.0.1), but with
    PostgreSQL's default durability (`fsync=on`, `synchronous_commit=on`)
    unless `fsync` is false."""

    def __init__(self, fsync: bool = True) -> None:
        self.bin = pg_bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="relaunch-bench-pg-"))
        os.chmod(self.dir, 0o755)
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.getuid() == 0 else []
        self.password = secrets.token_hex(12)
        self.port = free_port_pairs(1)[0]
        (self.dir / "pwfile").write_text(self.password + "\n")
        if self.run_as:
            shutil.chown(self.dir, "postgres")
            shutil.chown(self.dir / "pwfile", "postgres")
        subprocess.run(
            [*self.run_as, self.bin / "initdb", "-D", self.dir / "data", "-U", "postgres",
             f"--pwfile={self.dir / 'pwfile'}", "--auth-local=trust",
             "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale"],
            check=True, capture_output=True,
        )  # fmt: skip
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
        options += " -c max_connections=400"
        if not fsync:
            options += " -c fsync=off -c synchronous_commit=off"
        subprocess.run(
            [*self.run_as, self.bin / "pg_ctl", "-D", self.dir / "data", "-l",
             self.dir / "server.log", "-w", "-t", "60", "-o", options, "start"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.started = True
        self.version = subprocess.run(
            [self.bin / "postgres", "--version"], capture_output=True, text=True
        ).stdout.split()[2]

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database; returns its URL."""
        import psycopg2

        conn = psycopg2.connect(self.url())
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'DROP DATABASE IF EXISTS "{name}"')
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)

    def postmaster_pid(self) -> int:
        return int((self.dir / "data" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        if self.started:
            subprocess.run(
                [*self.run_as, self.bin / "pg_ctl", "-D", self.dir / "data", "-m", "fast", "stop"],
                capture_output=True,
            )
            self.started = False
        shutil.rmtree(self.dir, ignore_errors=True)


class SeaweedS3:
    """`weed server -s3` in a temporary directory, as scripts/s3.sh starts it
    (free ports, one identity that may do everything), and a bucket."""

    BUCKET = "relaunch-bench"

    def __init__(self, weed: Path) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="relaunch-bench-s3-"))
        self.key = "bench" + secrets.token_hex(6)
        self.secret = secrets.token_hex(20)
        identities = {
            "identities": [
                {
                    "name": "bench",
                    "credentials": [{"accessKey": self.key, "secretKey": self.secret}],
                    "actions": ["Admin", "Read", "List", "Write", "Tagging"],
                }
            ]
        }
        (self.dir / "s3.json").write_text(json.dumps(identities))
        master, volume, filer, s3 = free_port_pairs(4)
        (self.dir / "data").mkdir()
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.child = Child(
            "weed",
            [weed, "server", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
             "-s3", f"-s3.port={s3}", f"-s3.config={self.dir / 's3.json'}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
             "-master.volumeSizeLimitMB=1024", "-volume.max=0", "-master.telemetry=false"],
            self.dir / "weed.log",
        )  # fmt: skip
        deadline = time.monotonic() + 90
        wait_until(lambda: http_answers(self.endpoint + "/", ok_only=False), deadline,
                   "SeaweedFS S3", self.child.proc)  # fmt: skip
        while True:
            try:
                self.client().create_bucket(Bucket=self.BUCKET)
                break
            except Exception as e:  # SeaweedFS answers before its filer is ready
                if time.monotonic() > deadline:
                    raise RuntimeError(f"SeaweedFS: no bucket: {e}\n{self.child.tail()}") from e
                time.sleep(0.5)
        self.version = subprocess.run(
            [weed, "version"], capture_output=True, text=True
        ).stdout.split()[2:3]

    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.key,
            "AWS_SECRET_ACCESS_KEY": self.secret,
            "AWS_REGION": "us-east-1",
        }

    def client(self):
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name="us-east-1",
        )

    def prefix_bytes(self, prefix: str) -> tuple[int, int]:
        """Objects under `prefix` and their bytes."""
        count = size = 0
        pages = self.client().get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.BUCKET, Prefix=prefix):
            for obj in page.get("Contents", []):
                count += 1
                size += obj["Size"]
        return count, size

    def stop(self) -> None:
        # weed takes ~30 s to shut down on SIGTERM; nothing in it needs keeping.
        self.child.stop(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


class RelaunchServer:
    """`relaunch server` as users start it (the `relaunch` script of the
    Python package), on a free port; the URL from its status line."""

    def __init__(self, relaunch: Path, data_dir: Path, args: list, env: dict | None = None):
        data_dir.mkdir(parents=True, exist_ok=True)
        command = [relaunch, "server", "--data-dir", data_dir, "--host", "127.0.0.1",
                   "--port", "0", "--log", "warn", *args]  # fmt: skip
        log = data_dir.parent / f"{data_dir.name}.log"
        self.child = Child("relaunch server", command, log, env)
        self.url = ""

        def started() -> bool:
            for line in self.child.tail(100_000).splitlines():
                if line.startswith("relaunch server: "):
                    self.url = line.split()[2]
                    return True
            return False

        try:
            wait_until(started, time.monotonic() + 60, "relaunch server", self.child.proc)
        except RuntimeError as e:
            self.child.stop()
            raise RuntimeError(f"{e}:\n{self.child.tail()}") from None

    @property
    def pid(self) -> int:
        return self.child.pid

    def stop(self) -> None:
        self.child.stop()


class MlflowServer:
    """`mlflow server --backend-store-uri postgresql+psycopg2://...` as it ships (its
    default uvicorn server), with its GenAI job runners off
    (`MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false`), as bench/tracking runs it."""

    def __init__(self, mlflow: Path, database_url: str, work: Path) -> None:
        work.mkdir(parents=True, exist_ok=True)
        port = free_port_pairs(1)[0]
        self.url = f"http://127.0.0.1:{port}"
        # SQLAlchemy 2.1 takes plain postgresql:// to mean psycopg 3; the
        # driver installed here is psycopg2 (psycopg2-binary).
        uri = database_url.replace("postgres://", "postgresql+psycopg2://", 1)
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.child = Child(
            "mlflow server",
            [mlflow, "server", "--backend-store-uri", uri,
             "--default-artifact-root", (work / "artifacts").as_uri(),
             "--host", "127.0.0.1", "--port", str(port)],
            work / "mlflow-server.log", env,
        )  # fmt: skip
        try:
            wait_until(lambda: http_answers(self.url + "/health"), time.monotonic() + 300,
                       "mlflow server", self.child.proc)  # fmt: skip
        except RuntimeError as e:
            self.child.stop()
            raise RuntimeError(f"{e}:\n{self.child.tail()}") from None

    def stop(self) -> None:
        self.child.stop()
