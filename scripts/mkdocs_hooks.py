"""mkdocs hook: the CLI reference is the installed `relaunch` command's own
`--help`, run while the site builds, so it cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys

MARKER = re.compile(r"<!-- relaunch-help: (.*?) -->")


def _help(args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "relaunch", *args.split()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
    )
    if out.returncode != 0:
        raise RuntimeError(f"`relaunch {args}` failed ({out.returncode}): {out.stderr}")
    return f"```text\n$ relaunch {args}\n{out.stdout.rstrip()}\n```"


def on_page_markdown(markdown: str, **kwargs: object) -> str:
    return MARKER.sub(lambda m: _help(m.group(1)), markdown)
