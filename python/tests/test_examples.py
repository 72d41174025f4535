"""The examples users run first: the README's demo and the store example."""

import subprocess
import sys
from pathlib import Path

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
