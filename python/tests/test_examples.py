"""The examples users run first: the README's demo and the store example."""

import re
import signal
import subprocess
import sys
from pathlib import Path

from conftest import wait_for
from test_resume import finish, launch

import relaunch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_the_demo_launches_logs_preempts_and_resumes(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            EXAMPLES / "demo.py",
            "--nproc",
            "2",
            "--epochs",
            "2",
            "--samples",
            "480",
            "--dir",
            tmp_path,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo OK: 2 workers trained 60 steps, preempted mid-epoch and resumed" in out.stdout
    assert "committed its checkpoint; launcher exit code 75" in out.stdout
    assert "status:   finished" in out.stdout  # `relaunch runs show` of the run
    assert "preempted  stopped by SIGTERM" in out.stdout


def test_the_allreduce_example_runs_through_relaunch_store():
    out = subprocess.run(
        [sys.executable, EXAMPLES / "allreduce.py", "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "demo OK: 2 processes rendezvoused" in out.stdout


SLOW_TORCH = """
import os, sys, time

class SlowTorch:
    # torch's import made slow (as on a loaded node), with a marker when it
    # starts: the test's stop signal arrives while every rank imports it.
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and "RANK" in os.environ:
            sys.meta_path.remove(self)
            marker = os.path.join(os.environ["SLOW_TORCH_DIR"], "importing." + os.environ["RANK"])
            open(marker, "w").close()
            time.sleep(4)
        return None

sys.meta_path.insert(0, SlowTorch())
"""


def test_a_stop_signal_while_the_ranks_import_torch_stops_the_job_at_an_agreed_step(tmp_path):
    """SLURM's time-limit warning (or a preemption) can come while the ranks
    are still starting; torch takes seconds to import, many more on a loaded
    node. examples/resume.py installs relaunch.preemption's handler first, so
    the signal is a stop request: the ranks start, agree on a step, commit
    it, and the launcher exits 75. (It imported torch first, and both ranks
    died of the signal: exit 128 + signal.)"""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_TORCH)
    markers = tmp_path / "markers"
    markers.mkdir()
    env = {"PYTHONPATH": str(site), "SLOW_TORCH_DIR": str(markers)}
    job = launch("--signals-to-handle", "SIGTERM,SIGUSR1", EXAMPLES / "resume.py",
                 "--ckpt-dir", tmp_path / "ckpt", "--epochs", "2", "--samples", "384",
                 cwd=tmp_path, env=env)  # fmt: skip
    wait_for(lambda: len(list(markers.iterdir())) == 2 or job.poll() is not None, 120,
             "both ranks to import torch")  # fmt: skip
    job.send_signal(signal.SIGUSR1)
    code, log = finish(job, timeout=180)
    assert code == 75, log
    stops = set(re.findall(r"rank \d: preempted after step (\d+)", log))
    assert len(stops) == 1, log  # both ranks at one step
    latest = relaunch.Checkpointer(tmp_path / "ckpt").latest(verify="full")
    assert latest is not None and latest.step == int(stops.pop()), log
