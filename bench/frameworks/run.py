"""Preempting a framework's job: relaunch's integration against torchrun.

    .venv/bin/python bench/frameworks/run.py [--repeat 3] [--only lightning]

For each framework (Lightning, the Hugging Face Trainer, accelerate) the
same 2-rank job (the test workers in python/tests/workers/: a tiny model,
64 samples, DDP on gloo, 50 ms steps, 30 epochs) runs twice side by side
in one invocation:

- **relaunch**: ``relaunch run --nproc-per-node 2`` with relaunch's
  integration, no periodic checkpoint;
- **torchrun**: ``torchrun --nproc-per-node 2`` with the framework alone
  (``--no-relaunch``) and a checkpoint every 50 steps, as jobs save.

Once rank 0 has trained a random number of steps between 60 and 160 (the
same for both), SIGTERM goes to the launcher (Kubernetes' way). Measured:
the time from the SIGTERM to the launcher's exit, its exit code, and the
steps lost, that is the steps rank 0 trained (its trace) past the newest
checkpoint on disk when the launcher exited (relaunch: the agreed stop
step's checkpoint; torchrun: the newest periodic one). Checked: relaunch
exits 75 with a checkpoint of the step it stopped at. Medians over
``--repeat`` runs; results to stdout (markdown rows) and
bench/out/frameworks.json.

    .venv/bin/python bench/frameworks/run.py --matrix [--only lightning]

The exactness matrix instead: each framework x {dropout 0.1, gradient
accumulation 2, DataLoader workers 2} x {SIGTERM to the launcher, to every
process, to one rank}. Each cell stops the job (2 ranks, 0.15 s steps)
after rank 0's fourth batch, relaunches it to the end, and compares it with
an uninterrupted run of the same configuration: the batches every rank
trained, and rank 0's final parameters bit for bit (the target: every cell
equal). Rows to stdout, bench/out/frameworks-matrix.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import ROOT, write_result

WORKERS = ROOT / "python" / "tests" / "workers"
PY = Path(sys.executable)
RELAUNCH = PY.parent / "relaunch"

FRAMEWORKS = {
    "lightning": WORKERS / "lightning_train.py",
    "transformers": WORKERS / "hf_train.py",
    "accelerate": WORKERS / "accelerate_train.py",
}


def trained_steps(out: Path) -> int:
    """Steps rank 0 trained: its trace has a line per batch, `epoch step ...`."""
    path = out / "trace.0"
    return len(path.read_text().splitlines()) if path.exists() else 0


def newest_checkpoint_step(framework: str, out: Path) -> int:
    """The step of the newest whole checkpoint on disk (0 when none)."""
    if framework == "lightning":
        import torch

        steps = [0]
        for path in (out / "ckpt").glob("*.ckpt"):
            try:
                steps.append(int(torch.load(path, weights_only=False)["global_step"]))
            except Exception:  # a torn file is no checkpoint
                continue
        return max(steps)
    if framework == "transformers":
        found = [int(p.name.split("-")[1]) for p in (out / "hf").glob("checkpoint-*")]
        return max(found, default=0)
    found = [int(p.name[5:]) for p in (out / "ckpt").glob("step_*") if p.name[5:].isdigit()]
    return max(found, default=0)


def one(framework: str, side: str, at: int, tmp: Path) -> dict:
    out = tmp / f"{framework}-{side}"
    worker = FRAMEWORKS[framework]
    common = [str(worker), str(out), "--epochs", "30", "--step-time", "0.05"]
    if side == "relaunch":
        cmd = [str(RELAUNCH), "run", "--nproc-per-node", "2", *common]
    else:
        cmd = [str(PY), "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        cmd += [*common, "--no-relaunch", "--save-every", "50"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    log = open(tmp / f"{framework}-{side}.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    deadline = time.monotonic() + 600
    while trained_steps(out) < at:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit(f"{framework} under {side} ended before step {at}: see {log.name}")
        time.sleep(0.005)
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(300)
    took = time.monotonic() - sent
    log.close()
    trained = trained_steps(out)
    saved = newest_checkpoint_step(framework, out)
    text = (tmp / f"{framework}-{side}.log").read_text()
    if side == "relaunch":
        match = re.search(r"stopped at step (\d+), each with its checkpoint", text)
        if code != 75 or match is None or int(match.group(1)) != saved:
            raise SystemExit(f"relaunch did not stop cleanly ({code}): see {log.name}")
    return {"seconds": took, "exit": code, "trained": trained, "saved": saved,
            "lost": trained - saved}  # fmt: skip


# The matrix's configurations (the workers' options) and stops.
CONFIGS = {
    "dropout 0.1": ["--dropout", "0.1"],
    "accumulation 2": ["--dropout", "0", "--accumulate", "2"],
    "DataLoader workers 2": ["--dropout", "0", "--workers", "2"],
}
STOPS = ["launcher", "every-process", "one-rank"]


def matrix(frameworks: list[str]) -> dict:
    """The exactness matrix (see the module's doc); a cell that fails says
    why instead of stopping the others."""
    sys.path.insert(0, str(ROOT / "python" / "tests"))
    import torch
    from frameworks import deliver, launch, reference_run, trace_lines, wait_for_steps

    cells = {}
    print("| framework | configuration | stop | stopped at | same batches | bitwise |")
    print("|---|---|---|---:|---|---|")
    for framework in frameworks:
        worker = FRAMEWORKS[framework]
        for config, extra in CONFIGS.items():
            with tempfile.TemporaryDirectory(prefix="bench-matrix-") as tmp_dir:
                tmp = Path(tmp_dir)
                (tmp / "ref").mkdir()
                reference = reference_run(tmp / "ref", worker, *extra)
                want = torch.load(reference / "params.pt")
                for how in STOPS:
                    case = tmp / how
                    case.mkdir()
                    out = case / "out"
                    args = ["--nproc-per-node", "2", worker, out, *extra]
                    cell: dict = {}
                    try:
                        job = launch(case, "first", *args, "--step-time", "0.15")
                        wait_for_steps(job, out, 4)
                        deliver(how, job)
                        code, log = job.finish()
                        found = re.search(r"stopped at step (\d+), each with its checkpoint", log)
                        cell["first_exit"] = code
                        cell["stopped_at"] = int(found.group(1)) if found else None
                        code, log = launch(case, "second", *args).finish()
                        cell["second_exit"] = code
                        cell["same_batches"] = all(
                            trace_lines(reference, r) == trace_lines(out, r) for r in range(2)
                        )
                        got = torch.load(out / "params.pt")
                        diff = max((want[k] - got[k]).abs().max().item() for k in want)
                        cell["max_abs_diff"] = diff
                        cell["bitwise"] = all(torch.equal(want[k], got[k]) for k in want)
                    except (AssertionError, OSError, KeyError) as e:
                        cell["error"] = str(e)[-500:]
                    cells[f"{framework} / {config} / {how}"] = cell
                    exact = "yes" if cell.get("bitwise") else f"no ({cell.get('max_abs_diff')})"
                    print(
                        f"| {framework} | {config} | {how} | {cell.get('stopped_at')} | "
                        f"{cell.get('same_batches')} | {exact} |",
                        flush=True,
                    )
    equal = sum(1 for c in cells.values() if c.get("bitwise") and c.get("same_batches"))
    print(f"\n{equal} of {len(cells)} cells bitwise equal to the uninterrupted run")
    return cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", choices=sorted(FRAMEWORKS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--matrix", action="store_true", help="the exactness matrix")
    args = parser.parse_args()
    if args.matrix:
        cells = matrix([args.only] if args.only else list(FRAMEWORKS))
        print(f"wrote {write_result('frameworks-matrix', cells)}")
        return
    rng = random.Random(args.seed)
    results: dict[str, dict] = {}
    print("| framework | SIGTERM to exit: relaunch (exit 75) | torchrun | steps lost: relaunch "
          "| torchrun (checkpoint every 50) |")  # fmt: skip
    print("|---|---:|---:|---:|---:|")
    for framework in [args.only] if args.only else list(FRAMEWORKS):
        runs: dict[str, list[dict]] = {"relaunch": [], "torchrun": []}
        for _ in range(args.repeat):
            at = rng.randint(60, 160)
            for side in ("relaunch", "torchrun"):
                with tempfile.TemporaryDirectory(prefix="bench-frameworks-") as tmp:
                    runs[side].append(one(framework, side, at, Path(tmp)))
        med = {side: {k: statistics.median(r[k] for r in rs) for k in ("seconds", "lost")}
               for side, rs in runs.items()}  # fmt: skip
        results[framework] = {"runs": runs, "median": med}
        print(
            f"| {framework} | {med['relaunch']['seconds']:.2f} s | "
            f"{med['torchrun']['seconds']:.2f} s | {med['relaunch']['lost']:.0f} | "
            f"{med['torchrun']['lost']:.0f} |",
            flush=True,
        )
    path = write_result("frameworks", results)
    print(f"\nwrote {path}")
    print(json.dumps({f: r["median"] for f, r in results.items()}))


if __name__ == "__main__":
    main()
