"""The processes the scale-out benchmark starts and stops: a throwaway
PostgreSQL cluster, a SeaweedFS S3 service, `relaunch server` replicas, an
MLflow tracking server, and a sampler of their resident memory.

Each runs in a session of its own (`start_new_session`) and is stopped with
SIGTERM to its process group, SIGKILL after 30 s; `Services.close` stops
everything that was started, in reverse order, and removes its directories.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from relaunch import _services
from relaunch._services import free_port_pairs

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


class Postgres(_services.Postgres):
    """The shared throwaway cluster (relaunch._services) with PostgreSQL's
    default durability; `stop` ends it (the benchmark's teardown)."""

    def __init__(self) -> None:
        super().__init__(fsync=True)

    def stop(self) -> None:
        self.close()


class SeaweedS3(_services.Seaweed):
    """The shared SeaweedFS (relaunch._services) with the benchmark's bucket,
    a boto3 client and byte counts under a prefix; `stop` ends it."""

    BUCKET = "relaunch-bench"

    def __init__(self, weed: Path) -> None:
        super().__init__(self.BUCKET)

    def client(self):
        import boto3

        env = self.env
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
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

    def stop(self, timeout: float = 30) -> None:
        self.close()


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
