#!/usr/bin/env python3
"""Prints ARCHITECTURE.md's one-line-per-file codemap, made from each file's
own opening doc line (a Rust file's first `//!` line, a Python module's
docstring's first line, a script's first comment line), so it says what
the files say of themselves.

    python3 scripts/codemap.py            # the section, to paste
    python3 scripts/codemap.py --check    # exit 1 if ARCHITECTURE.md's differs

python/tests/test_packaging.py runs the check: a file added, removed or
renamed without the codemap following fails the tests.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN = "<!-- codemap:begin (scripts/codemap.py writes this section) -->"
END = "<!-- codemap:end -->"

# Where the code is, and which files of it the map lists.
GROUPS = [
    ("Rust crates", ["crates/*/src/**/*.rs"]),
    ("The Python package", ["python/relaunch/**/*.py"]),
    ("Test helpers and workers", ["python/tests/*.py", "python/tests/workers/*.py"]),
    ("Scripts and benchmarks", ["scripts/*", "bench/*/run.py", "bench/common.py"]),
]


def first_sentence(paragraph: str) -> str:
    """Up to the first full stop that ends a sentence (not one inside a name
    such as `relaunch.init` or `e.g.`)."""
    text = " ".join(paragraph.split())
    match = re.search(r"(?<!e\.g)(?<!i\.e)\.(\s|$)", text)
    return text[: match.start() + 1] if match else text


def first_line(path: Path) -> str:
    text = path.read_text(errors="replace")
    lines: list[str] = []
    if path.suffix == ".rs":
        for line in text.splitlines():
            stripped = line.strip()
            if stripped.startswith("//!"):
                body = stripped[3:].strip()
                if not body and lines:
                    break
                lines.append(body)
            elif (stripped and not stripped.startswith(("#!", "//"))) or lines:
                break
    elif path.suffix == ".py":
        try:
            doc = ast.get_docstring(ast.parse(text))
        except SyntaxError:
            doc = None
        lines = (doc or "").strip().split("\n\n")[0].splitlines()
    else:  # a script: its first comment paragraph (after a shebang)
        for line in text.splitlines()[:12]:
            if line.startswith("#!"):
                continue
            if line.startswith("#") and line.lstrip("# ").strip():
                lines.append(line.lstrip("# ").strip())
            elif lines:
                break
    return first_sentence(" ".join(lines))


def files(patterns: list[str]) -> list[Path]:
    found: set[Path] = set()
    for pattern in patterns:
        found.update(p for p in ROOT.glob(pattern) if p.is_file())
    skip = ("__pycache__", "/snapshots/", "conftest.py")
    return sorted(p for p in found if not any(s in str(p) for s in skip))


def section() -> str:
    out = [BEGIN, ""]
    missing = []
    for title, patterns in GROUPS:
        out.append(f"### {title}")
        out.append("")
        for path in files(patterns):
            rel = path.relative_to(ROOT).as_posix()
            line = first_line(path)
            if not line:
                missing.append(rel)
            out.append(f"- `{rel}`: {line}")
        out.append("")
    if missing:
        raise SystemExit(
            "these files open with no doc line to map (a `//!` line, a module "
            "docstring, a comment after the shebang):\n  " + "\n  ".join(missing)
        )
    out.append(END)
    return "\n".join(out)


def main() -> int:
    wanted = section()
    if "--check" not in sys.argv[1:]:
        print(wanted)
        return 0
    doc = (ROOT / "ARCHITECTURE.md").read_text()
    match = re.search(re.escape(BEGIN) + r".*?" + re.escape(END), doc, re.S)
    if match is None or match.group(0) != wanted:
        print(
            "ARCHITECTURE.md's codemap is not the files' own: run "
            "`python3 scripts/codemap.py` and paste its output between the codemap markers",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
