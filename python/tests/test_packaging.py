"""The installed package: version, typing markers, the native `relaunch` command."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import relaunch


def test_version_is_the_crate_version():
    root = Path(__file__).resolve().parents[2]
    cargo = (root / "Cargo.toml").read_text()
    assert f'version = "{relaunch.__version__}"' in cargo


def test_typing_markers_are_installed():
    package = Path(relaunch.__file__).parent
    assert (package / "py.typed").is_file()
    assert (package / "_native.pyi").is_file()


def test_relaunch_command_is_on_path_and_matches_python_m():
    exe = shutil.which("relaunch", path=os.path.dirname(sys.executable))
    assert exe, "pip install . must put `relaunch` next to the interpreter"
    # The Rust binary itself (build_backend/relaunch_build.py), not a
    # console script: no interpreter starts for a command.
    assert Path(exe).read_bytes()[:4] == b"\x7fELF", f"{exe} is not the native binary"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"relaunch {relaunch.__version__}"
    out_m = subprocess.run(
        [sys.executable, "-m", "relaunch", "--version"], capture_output=True, text=True, check=True
    )
    assert out_m.stdout == out.stdout


def test_the_command_runs_workers_under_the_python_beside_it(tmp_path):
    """Run by its path with its environment off PATH (not activated), the
    command still runs workers under the environment's own Python, as the
    console script it replaces did."""
    exe = Path(sys.executable).parent / "relaunch"
    (tmp_path / "where.py").write_text("import sys\nprint('worker python:', sys.executable)\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHON_EXEC", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    out = subprocess.run(
        [exe, "run", "--nproc-per-node", "1", "where.py"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    (line,) = [x for x in out.stdout.splitlines() if "worker python:" in x]
    worker = Path(line.split("worker python:", 1)[1].strip())
    assert worker.parent == Path(sys.executable).parent, line


def test_import_is_light():
    """`import relaunch` must not drag in torch (it runs in every worker)."""
    code = "import sys, relaunch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
