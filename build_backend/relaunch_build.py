"""The wheel's build backend: maturin's, plus the native `relaunch` command.

maturin packs the Python package and its extension module (`_native`); it
cannot also build a Rust executable into the same wheel. This backend
builds the `relaunch-cli` crate's binary first and hands it to maturin as a
wheel script (`[tool.maturin] data`, `scripts/`), which pip installs beside
the interpreter, as it would a console script. The command then starts in
about 2 ms instead of the ~40 ms Python needs to start and import the
package, and a command line or a cron job that calls `relaunch` often pays
that once per call. `python -m relaunch` still runs the same CLI in-process.

Every other hook is maturin's own.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import maturin
from maturin import (  # noqa: F401 (re-exported hooks)
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)

ROOT = Path(__file__).resolve().parents[1]
# `[tool.maturin] data` in pyproject.toml: its scripts/ become the wheel's.
SCRIPTS = ROOT / "target" / "wheel-data" / "scripts"


def _build_cli() -> None:
    """Builds `relaunch-cli` (release) and stages its binary as a script."""
    command = [
        "cargo", "build", "--release", "--package", "relaunch-cli",
        "--message-format", "json-render-diagnostics",
    ]  # fmt: skip
    print(f"Running `{' '.join(command)}`", file=sys.stderr, flush=True)
    out = subprocess.run(command, cwd=ROOT, stdout=subprocess.PIPE, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"building the relaunch command failed (`{' '.join(command)}`)")
    binary = None
    for line in out.stdout.splitlines():
        message = json.loads(line)
        if message.get("reason") == "compiler-artifact" and message.get("executable"):
            if message["target"]["name"] == "relaunch":
                binary = Path(message["executable"])
    if binary is None:
        raise SystemExit("cargo built no `relaunch` executable: is crates/relaunch-cli intact?")
    SCRIPTS.mkdir(parents=True, exist_ok=True)
    staged = SCRIPTS / "relaunch"
    temporary = staged.with_suffix(".tmp")
    shutil.copy2(binary, temporary)
    os.replace(temporary, staged)


def _data_dir() -> None:
    """maturin refuses a configured data directory that does not exist."""
    SCRIPTS.mkdir(parents=True, exist_ok=True)


def prepare_metadata_for_build_wheel(
    metadata_directory: str, config_settings: Mapping[str, Any] | None = None
) -> str:
    _data_dir()
    return maturin.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _build_cli()
    return maturin.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(
    wheel_directory: str,
    config_settings: Mapping[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    _build_cli()
    return maturin.build_editable(wheel_directory, config_settings, metadata_directory)
