"""``python -m relaunch``: the ``relaunch`` command, run as the native binary
that the wheel installs beside the interpreter (the extension module does
not carry the command line a second time).

The interpreter running this is the one ``relaunch run`` starts workers
with, as before: it is handed over in ``RELAUNCH_PYTHON`` unless
``PYTHON_EXEC`` (torchrun's choice of worker interpreter) says otherwise.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path


def _binary() -> Path:
    """The native ``relaunch`` of this installation: in the interpreter's
    scripts folder (a virtual environment's ``bin/``, or the user scheme's
    with ``pip install --user``), else on ``PATH``."""
    candidates = [Path(sys.executable).parent / "relaunch"]
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = (
                sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
            )
        except KeyError:
            continue
        candidates.append(Path(scripts) / "relaunch")
    on_path = shutil.which("relaunch")
    if on_path:
        candidates.append(Path(on_path))
    for candidate in candidates:
        try:
            with open(candidate, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    return candidate
        except OSError:
            continue
    raise SystemExit(
        "error: the native `relaunch` command is not installed beside this Python "
        f"(looked in {', '.join(sorted({str(c.parent) for c in candidates}))}); "
        "reinstall the package with `pip install relaunch`"
    )


def main() -> None:
    binary = _binary()
    env = dict(os.environ)
    env.setdefault("RELAUNCH_PYTHON", sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(binary, ["relaunch", *sys.argv[1:]], env)
