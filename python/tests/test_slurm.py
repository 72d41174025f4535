"""`relaunch run` under a real SLURM (22.05: slurmctld, slurmd, munge), on a
one-machine cluster that scripts/slurm.sh starts once per test run
(``SLURM_CONF``, ``RELAUNCH_TEST_SLURM``) with two partitions: a job in
``high`` preempts one in ``low`` and SLURM requeues it.

Each test submits jobs with ``sbatch`` that run ``relaunch run`` with no
node, master or run-id flags (they come from the allocation), and cancels
them at the end. Without the cluster the tests are skipped, and fail
under CI."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from conftest import TrackingServer, wait_for
from test_cli import slow_checkpoint
from test_launch_tracking import events, get

ROOT = Path(__file__).resolve().parents[2]
RESUME = ROOT / "examples" / "resume.py"
RELAUNCH = [sys.executable, "-m", "relaunch"]
# 2 ranks x batches of 8 over 384 samples: 24 steps an epoch, 48 in all.
TRAIN = ["--epochs", "2", "--samples", "384", "--batch-size", "8", "--ckpt-every", "10"]

CLUSTER = os.environ.get("RELAUNCH_TEST_SLURM")


@pytest.fixture(scope="module")
def cluster() -> Path:
    if not CLUSTER or not os.environ.get("SLURM_CONF") or shutil.which("sbatch") is None:
        reason = (
            "no test SLURM cluster (scripts/test.sh starts one with scripts/slurm.sh: "
            "needs root, slurmctld, slurmd, munge)"
        )
        if os.environ.get("CI"):
            pytest.fail(f"{reason}; CI is set, so this fails instead of skipping")
        pytest.skip(reason)
    return Path(CLUSTER)


@pytest.fixture
def jobs(cluster: Path, tmp_path: Path) -> Iterator[list[int]]:
    """Job ids submitted by the test; every one is cancelled at the end."""
    submitted: list[int] = []
    yield submitted
    for job in submitted:
        subprocess.run(["scancel", "--full", str(job)], capture_output=True, timeout=30)
    wait_for(lambda: not any(state(job) in ("RUNNING", "PENDING", "COMPLETING", "REQUEUED")
                             for job in submitted), 60, "the test's jobs to end")  # fmt: skip


def sbatch(jobs: list[int], script: Path, *args: str) -> int:
    out = subprocess.run(
        # Appended: a requeued job's output follows its first allocation's.
        ["sbatch", "--parsable", "--open-mode=append", *args, str(script)],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=script.parent,
    )
    assert out.returncode == 0, out.stderr
    job = int(out.stdout.strip().split(";")[0])
    jobs.append(job)
    return job


def show(job: int) -> dict[str, str]:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", str(job)], capture_output=True, text=True, timeout=30
    )
    if out.returncode != 0:
        return {}
    return dict(re.findall(r"(\S+?)=(\S*)", out.stdout))


def state(job: int) -> str:
    return show(job).get("JobState", "")


def requeued(job: int) -> bool:
    """Whether `job` was requeued. SLURM holds a requeued job (its BeginTime)
    for AuthInfo's cred_expire, 10 s on the test cluster, before it may start
    again: slurmd refuses the job id until the old credential expires."""
    return int(show(job).get("Restarts", "0")) >= 1


def accounting(job: int) -> list[str]:
    """The state of each allocation of `job` in SLURM's accounting (sacct
    through slurmdbd; -D: the requeued ones too), oldest first."""
    out = subprocess.run(
        ["sacct", "-j", str(job), "-X", "-D", "--noheader", "--parsable2", "-o", "JobID,State"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return [line.split("|")[1] for line in out.stdout.splitlines() if line.strip()]


def batch_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def relaunch_cmd() -> str:
    return " ".join([*RELAUNCH, "run"])


def losses(path: Path) -> list[tuple[int, str]]:
    return [(int(s), v) for s, v in (line.split() for line in path.read_text().splitlines())]


def uninterrupted_run(d: Path, nproc: int, train: list[str], steps: int, env: dict[str, str]):
    """examples/resume.py run through without a stop on this host by `nproc`
    ranks in `d`: its losses (all `steps` of them) and final parameters."""
    out = subprocess.run(
        [*RELAUNCH, "run", "--nproc-per-node", str(nproc), str(RESUME), "--ckpt-dir",
         str(d / "ckpt"), "--losses", str(d / "losses"), "--params", str(d / "params.pt"), *train],
        capture_output=True, text=True, timeout=300, cwd=d, env=env,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    expected = losses(d / "losses")
    assert [s for s, _ in expected] == list(range(steps))
    return expected, torch.load(d / "params.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, dict]:
    """An uninterrupted run of examples/resume.py: its losses and final parameters."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RELAUNCH_", "SLURM_"))}
    return uninterrupted_run(tmp_path_factory.mktemp("reference"), 2, TRAIN, 48, env)


def assert_same_params(got: Path, want: dict) -> None:
    params = torch.load(got, weights_only=True)
    assert params.keys() == want.keys()
    for name, value in want.items():
        assert torch.equal(params[name], value), name  # bitwise


def test_a_job_resolves_its_nodes_from_slurm_and_finishes(cluster, jobs, tmp_path):
    """Two workers from --ntasks-per-node=2, one node, run id slurm-JOBID, a
    master host from the nodelist: no node flags on the command line."""
    script = batch_script(
        tmp_path / "job.sh",
        f"""
        {relaunch_cmd()} --print-config x.py > config.txt
        exec {relaunch_cmd()} {RESUME} --ckpt-dir ckpt --losses losses --params params.pt \
            {" ".join(TRAIN)}
        """,
    )
    job = sbatch(jobs, script, "--ntasks-per-node=2", "--output=out.txt", "--time=5")
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 120, "the job to end")
    log = (tmp_path / "out.txt").read_text()
    assert state(job) == "COMPLETED", log
    config = (tmp_path / "config.txt").read_text()
    assert "inside SLURM" in config, config
    lines = {line.split()[0]: line for line in config.splitlines()[1:]}
    assert re.search(rf"run_id +slurm-{job} +<- \$SLURM_JOB_ID", lines["run_id"]), config
    assert re.search(r"nnodes +1 +<- \$SLURM_NNODES", lines["nnodes"]), config
    assert re.search(r"node_rank +0 +<- \$SLURM_NODEID", lines["node_rank"]), config
    assert re.search(r"nproc_per_node +2 +<- \$SLURM_NTASKS_PER_NODE", lines["nproc_per_node"])
    assert "SIGUSR1" in lines["signals_to_handle"], config
    assert f"run slurm-{job}: 2 worker(s) on this node, 1 node(s)" in log, log
    assert len(losses(tmp_path / "losses")) == 48


def test_a_preempted_job_is_requeued_and_resumes_to_the_same_parameters(
    cluster, jobs, tmp_path, reference, tracking_server: TrackingServer
):
    """A `high` job preempts the `low` one (real SLURM preemption: SIGTERM to
    every process of the job, KillWait, requeue); every rank stops at one
    step and commits, SLURM requeues the job, the next allocation resumes
    from the checkpoint and ends with the uninterrupted run's losses and
    bitwise the same parameters; the tracking server has one run with both
    attempts."""
    expected, params = reference
    script = batch_script(
        tmp_path / "job.sh",
        f"""
        exec {relaunch_cmd()} --server {tracking_server.url} --tracking-dir spool \
            {RESUME} --ckpt-dir ckpt --losses losses --params params.pt --step-time 0.1 \
            {" ".join(TRAIN)}
        """,
    )
    # Both CPUs of the node: the `high` job can only run by preempting it.
    job = sbatch(
        jobs, script, "--ntasks-per-node=2", "--exclusive", "--output=out.txt", "--time=5",
        "--requeue", "--partition=low",
    )  # fmt: skip
    trajectory = tmp_path / "losses"
    wait_for(lambda: trajectory.exists() and len(trajectory.read_text().splitlines()) >= 15,
             120, "the job to train past step 15")  # fmt: skip
    high = batch_script(tmp_path / "high.sh", "sleep 2\n")
    sbatch(jobs, high, "--partition=high", "--ntasks=1", "--output=high.txt", "--time=1")
    wait_for(lambda: requeued(job) and state(job) != "REQUEUED", 90, "SLURM to requeue the job")
    wait_for(lambda: requeued(job) and state(job) in ("RUNNING", "COMPLETED"), 120,
             "the requeued job to start")  # fmt: skip
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED"), 240, "the job to end")
    log = (tmp_path / "out.txt").read_text()
    assert state(job) == "COMPLETED", log
    assert int(show(job)["Restarts"]) == 1, show(job)
    wait_for(lambda: accounting(job)[-1:] == ["COMPLETED"], 30, "sacct to record the end")
    assert accounting(job) == ["PREEMPTED", "COMPLETED"], accounting(job)
    stops = {int(m) for m in re.findall(r"rank \d: preempted after step (\d+)", log)}
    assert len(stops) == 1, log  # both ranks stopped at one step
    stop = stops.pop()
    assert "exit code 75" in log, log
    assert f"starting at step {stop + 1}" in log, log
    assert losses(trajectory) == expected  # every step once, every loss equal
    assert_same_params(tmp_path / "params.pt", params)
    run = get(tracking_server, f"/runs/slurm-{job}")
    assert isinstance(run, dict)
    assert (run["status"], run["attempts"]) == ("finished", 2), run
    kinds = [e["kind"] for e in events(tracking_server, f"slurm-{job}")]
    assert kinds == ["start", "preempted", "start", "finished"], kinds


def test_a_job_at_its_time_limit_requeues_itself_and_finishes(
    cluster, jobs, tmp_path, tracking_server: TrackingServer
):
    """--time=1 with --signal=B:USR1@50: SIGUSR1 reaches relaunch (the
    batch shell, exec'd), every rank stops at one step and commits,
    --requeue-on-preempt runs `scontrol requeue`; the requeued job, given a
    longer limit, finishes."""
    script = batch_script(
        tmp_path / "job.sh",
        f"""
        exec {relaunch_cmd()} --requeue-on-preempt --server {tracking_server.url} \
            --tracking-dir spool {RESUME} --ckpt-dir ckpt --losses losses --params params.pt \
            --step-time 0.1 --epochs 20 --samples 384 --batch-size 8 --ckpt-every 10
        """,
    )
    job = sbatch(
        jobs, script, "--ntasks-per-node=2", "--output=out.txt", "--time=1",
        "--signal=B:USR1@50", "--partition=low",
    )  # fmt: skip
    wait_for(lambda: int(show(job).get("Restarts", "0")) >= 1, 120, "the job to requeue itself")
    # The next allocation gets time to finish (SLURM keeps the limit).
    subprocess.run(["scontrol", "update", f"JobId={job}", "TimeLimit=5"], check=True, timeout=30)
    wait_for(lambda: requeued(job) and state(job) in ("RUNNING", "COMPLETED"), 120,
             "the requeued job to start")  # fmt: skip
    wait_for(lambda: state(job) in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), 240,
             "the job to end")  # fmt: skip
    log = (tmp_path / "out.txt").read_text()
    assert state(job) == "COMPLETED", log
    assert "SIGUSR1" in log and "exit code 75" in log, log
    assert f"scontrol requeue {job}" in log, log
    assert int(show(job)["Restarts"]) == 1, show(job)
    wait_for(lambda: accounting(job)[-1:] == ["COMPLETED"], 30, "sacct to record the end")
    assert accounting(job) == ["REQUEUED", "COMPLETED"], accounting(job)
    steps = [s for s, _ in losses(tmp_path / "losses")]
    assert steps == list(range(480)), steps  # every step once
    run = get(tracking_server, f"/runs/slurm-{job}")
    assert isinstance(run, dict)
    assert (run["status"], run["attempts"]) == ("finished", 2), run


def test_doctor_in_a_job_checks_its_stop_warning_against_the_last_save(cluster, jobs, tmp_path):
    """`relaunch doctor --ckpt-dir` inside real jobs: it reads the job's
    `#SBATCH --signal` from SLURM (`scontrol write batch_script`) and fails
    one that warns 2 s ahead when the last checkpoint took 2.5 s to save;
    it warns that a --signal without B: never reaches a launcher that is
    the batch shell, but not inside an srun step, which SLURM does signal;
    and it fails a warning asked for 600 s before a 5-minute limit, which
    SLURM sends at its first check after the start (`scontrol show job`)."""
    took = slow_checkpoint(tmp_path / "ckpt", 2.5)
    doctor = f"{' '.join(RELAUNCH)} doctor --format json --ckpt-dir {tmp_path / 'ckpt'}"
    early = tmp_path / "early.sh"
    early.write_text(f"#!/bin/bash\n#SBATCH --signal=B:USR1@2\n{doctor} > early.json || true\n")
    # A 20-minute limit: the warning 600 s ahead must not come while it runs.
    steps = tmp_path / "steps.sh"
    steps.write_text(
        "#!/bin/bash\n#SBATCH --time=20\n#SBATCH --signal=USR1@600\n"
        f"{doctor} > batch.json || true\n"
        f"srun --ntasks=1 {doctor} > step.json || true\n"
    )
    # This one's warning does come at once: the shell ignores it.
    at_once = tmp_path / "at_once.sh"
    at_once.write_text(
        "#!/bin/bash\n#SBATCH --time=5\n#SBATCH --signal=B:USR1@600\n"
        f"trap '' USR1\n{doctor} > at_once.json || true\n"
    )
    submitted = [sbatch(jobs, s, "--ntasks=1", f"--output={s.stem}.out")
                 for s in (early, steps, at_once)]  # fmt: skip
    wait_for(lambda: all(state(j) in ("COMPLETED", "FAILED", "CANCELLED") for j in submitted),
             120, "the doctor jobs to end")  # fmt: skip

    def finding(name: str, script: Path) -> dict:
        path = tmp_path / name
        output = (tmp_path / f"{script.stem}.out").read_text()
        assert path.exists() and path.stat().st_size, output
        (found,) = [f for f in json.loads(path.read_text()) if f["check"] == "slurm stop warning"]
        return found

    f = finding("early.json", early)
    assert f["level"] == "fail", f
    assert "--signal=B:USR1@2 warns 2 s before the time limit" in f["found"], f
    assert f"(step 7) took {took:.1f} s to save" in f["found"], f
    assert f["fix"] == f"warn earlier: --signal=B:USR1@{math.ceil(2 * took)}", f
    f = finding("batch.json", steps)
    assert f["level"] == "warn" and "has no B:" in f["found"], f
    assert f["fix"] == "use --signal=B:USR1@600 (examples/slurm/train.sbatch)", f
    f = finding("step.json", steps)
    assert f["level"] == "ok", f
    assert "--signal=USR1@600 warns 600 s before the time limit" in f["found"], f
    f = finding("at_once.json", at_once)
    assert f["level"] == "fail", f
    assert "600 s before the time limit" in f["found"] and "limit is 300 s" in f["found"], f


def test_scancel_stops_every_rank_at_one_step_with_its_data_loader_workers(cluster, jobs, tmp_path):
    """`scancel JOB`: SLURM sends SIGTERM to every process of the job at
    once (relaunch, both ranks, their spawned DataLoader workers), then
    SIGKILL after KillWait (60 s). Both ranks stop at one agreed step, rank
    0's checkpoint of that step is written, relaunch exits 75 well before
    the SIGKILL, and no process of the job is left."""
    out = tmp_path / "out"
    out.mkdir()
    loader_train = Path(__file__).resolve().parent / "workers" / "loader_train.py"
    script = batch_script(
        tmp_path / "job.sh",
        f"""
        exec {relaunch_cmd()} {loader_train} {out} --workers 2 --start-method spawn --persistent
        """,
    )
    job = sbatch(jobs, script, "--ntasks-per-node=2", "--output=out.txt", "--time=5")

    def under_way() -> bool:
        return all((out / f"pids.{r}").exists() for r in range(2)) or state(job) not in (
            "RUNNING",
            "PENDING",
        )

    wait_for(under_way, 180, "training to be under way")
    assert state(job) == "RUNNING", (tmp_path / "out.txt").read_text()
    pids = [json.loads((out / f"pids.{r}").read_text()) for r in range(2)]
    job_pids = [p["rank"] for p in pids] + [c for p in pids for c in p["children"]]
    assert sum(len(p["children"]) for p in pids) >= 4, pids  # 2 loader workers a rank
    cancelled = subprocess.run(["scancel", str(job)], capture_output=True, text=True, timeout=30)
    assert cancelled.returncode == 0, cancelled.stderr
    wait_for(lambda: all((out / f"out.{r}").exists() for r in range(2)), 55,
             "both ranks to stop (SLURM's SIGKILL comes at 60 s)")  # fmt: skip
    wait_for(lambda: state(job) == "CANCELLED", 60, "the job to end")
    log = (tmp_path / "out.txt").read_text()
    reports = [json.loads((out / f"out.{r}").read_text()) for r in range(2)]
    assert all(r["preempted"] and r["step"] == r["agreed"] for r in reports), reports
    assert reports[0]["step"] == reports[1]["step"], reports
    assert (out / f"ckpt_{reports[0]['step']}.pt").exists()
    wait_for(lambda: "exit code 75" in (tmp_path / "out.txt").read_text(), 10,
             "relaunch to report its exit")  # fmt: skip
    assert "killed by signal" not in log, log
    wait_for(lambda: not [p for p in job_pids if Path(f"/proc/{p}").exists()], 30,
             "every process of the job to be gone")  # fmt: skip
