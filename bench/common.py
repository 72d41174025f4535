"""What the benchmarks share: results under bench/out, child processes that
answer one JSON line, ports, fsync, the synthetic model state the file
and checkpoint benchmarks save, and result rows comparing two sample
series (`compare`). Each `bench/*/run.py` puts `bench/` on
`sys.path` and imports this module."""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out"


def write_result(name: str, result: Any) -> Path:
    """Writes `bench/out/NAME.json`; returns its path."""
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(result, indent=2))
    return path


def run_json(cmd: list, timeout: float = 3600, env: dict[str, str] | None = None) -> dict:
    """Runs `cmd`, which prints its result as the last line of stdout, in JSON."""
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def gpt_state_dict(total: int, d: int, generator: Any) -> tuple[dict, int]:
    """A transformer-like state_dict of about `total` bytes of float32: blocks of
    a GPT-like layer of width `d` (attention and MLP weights, biases, layer
    norms; 12 MiB a block at d=512). Returns it and its number of blocks."""
    import torch

    shapes = {
        "attn.qkv.weight": (3 * d, d),
        "attn.qkv.bias": (3 * d,),
        "attn.proj.weight": (d, d),
        "attn.proj.bias": (d,),
        "ln1.weight": (d,),
        "ln1.bias": (d,),
        "mlp.fc.weight": (4 * d, d),
        "mlp.fc.bias": (4 * d,),
        "mlp.proj.weight": (d, 4 * d),
        "mlp.proj.bias": (d,),
        "ln2.weight": (d,),
        "ln2.bias": (d,),
    }
    per_block = sum(4 * torch.Size(s).numel() for s in shapes.values())
    blocks = max(1, round(total / per_block))
    state = {
        f"blocks.{i}.{k}": torch.randn(s, generator=generator)
        for i in range(blocks)
        for k, s in shapes.items()
    }
    return state, blocks


def compare(
    name: str,
    ours: list[float],
    theirs: list[float],
    peer: str,
    target: float | None,
    *,
    ours_over_theirs: bool = False,
    **extra: Any,
) -> dict:
    """A result row from two sample series: their medians, the ratio (the
    peer's median over ours, so above 1 is relaunch's advantage, or ours
    over the peer's with `ours_over_theirs`, where the target is a
    ceiling), whether it meets `target`, and the samples."""
    a, b = statistics.median(ours), statistics.median(theirs)
    ratio = a / b if ours_over_theirs else b / a
    met = None if target is None else (ratio <= target if ours_over_theirs else ratio >= target)
    return dict(
        name=name,
        relaunch=a,
        peer=b,
        peer_name=peer,
        ratio=ratio,
        target=target,
        met=met,
        samples={"relaunch": ours, peer: theirs},
        **extra,
    )


def race(procs: list, what: str) -> dict:
    """Starts writer processes together and times them: each prints
    `ready`, waits for `go` on stdin, works, and prints one JSON line with
    `points`, `logged` and `done` (time.monotonic() when its last call
    returned and when all it sent was acknowledged). Kills what is left on
    the way out. Returns points, seconds (go to the last `done`),
    points_per_s and logged_s (go to the last `logged`)."""
    import time

    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{what}: a writer did not start")
        go = time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        for p in procs:
            line = p.stdout.readline()
            if p.wait(3600) != 0 or not line:
                raise RuntimeError(f"{what}: a writer failed")
            results.append(json.loads(line))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    points = sum(r["points"] for r in results)
    seconds = max(r["done"] for r in results) - go
    return {
        "points": points,
        "seconds": seconds,
        "points_per_s": points / seconds,
        # Until every writer's last log() call returned (relaunch: before its flush).
        "logged_s": max(r["logged"] for r in results) - go,
    }
