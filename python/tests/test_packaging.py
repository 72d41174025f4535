"""The installed package: version, typing markers, the console script."""

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
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"relaunch {relaunch.__version__}"
    out_m = subprocess.run(
        [sys.executable, "-m", "relaunch", "--version"], capture_output=True, text=True, check=True
    )
    assert out_m.stdout == out.stdout


def test_import_is_light():
    """`import relaunch` must not drag in torch (it runs in every worker)."""
    code = "import sys, relaunch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
