"""Text: ``print``, ``log_line``, ``log_text``, ``diff`` and the tables that
``flush`` and ``log_params`` print, kept in local files and uploaded as the
run's text files (``outputs.log`` by default) in the background, at most
every TEXT_UPLOAD_INTERVAL seconds and for certain when the run ends. A
resumed run's file is continued, not replaced."""

from __future__ import annotations

import argparse
import builtins
import contextlib
import dataclasses
import hashlib
import math
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping

from relaunch import files as _files
from relaunch.errors import TrackingConfigError, TrackingError

from ._values import _Shown
from .helpers.color_helpers import _ANSI, colored

TEXT_UPLOAD_INTERVAL = 5.0
"""Least seconds between background uploads of one text file."""
LOG_FILE = "outputs.log"


@dataclasses.dataclass
class _TextFile:
    path: str
    dirty: bool = False
    seeded: bool = False
    saved_at: float = -math.inf


class _TextMixin:
    """The text methods of ``ML_Logger``; they use its run (``_on_server``,
    ``_target``) and keep their files in ``_texts`` under ``_text_dir``."""

    def _text_file(self, name: str) -> _TextFile:
        text = self._texts.get(name)
        if text is None:
            if self._text_dir is None:
                self._text_dir = tempfile.mkdtemp(prefix="relaunch-ml-logger-")
            digest = hashlib.sha256(name.encode()).hexdigest()[:16]
            text = self._texts[name] = _TextFile(os.path.join(self._text_dir, digest))
            open(text.path, "wb").close()
        return text

    def _text_target(self, file: str | None) -> str:
        own, run_id, name = self._target((file or self.log_filename,))
        if not own:
            raise TrackingConfigError(
                f"text goes to the run of the configured prefix {self._run_prefix!r}, not to "
                f"run {run_id} ({self._prefix!r})"
            )
        return name

    def _write_text(self, file: str | None, text: str, overwrite: bool = False) -> str:
        name = self._text_target(file)
        entry = self._text_file(name)
        with open(entry.path, "w" if overwrite else "a", encoding="utf-8") as f:
            f.write(text)
        entry.dirty = True
        if overwrite:
            entry.seeded = True
        return name

    def _text_lines(self, lines: list[str], echo: bool) -> None:
        if not lines:
            return
        text = "\n".join(lines)
        if echo:
            builtins.print(text)
        self._write_text(None, text + "\n")

    def _save_texts(self, force: bool, timeout: float | None = None) -> None:
        """Uploads changed text files (``force``: all; else those not saved for
        TEXT_UPLOAD_INTERVAL), through the run's background, crash-safe uploads."""
        for name, text in self._texts.items():
            if not text.dirty or (
                not force and time.monotonic() - text.saved_at < TEXT_UPLOAD_INTERVAL
            ):
                continue
            try:
                run = self._on_server(timeout if force else min(self.timeout, 5.0))
                if not text.seeded:
                    self._seed(run.id, name, text)
            except TrackingError:
                if force:
                    raise
                text.saved_at = time.monotonic() + 30  # try again later; Sync/exit raise
                continue
            snapshot = text.path + ".snapshot"
            shutil.copyfile(text.path, snapshot)
            try:
                run.save_file(snapshot, name)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(snapshot)
            text.dirty, text.saved_at = False, time.monotonic()

    def _seed(self, run_id: str, name: str, text: _TextFile) -> None:
        """Continues the server's copy of a resumed run's text file."""
        if name in self._on_server_files:
            earlier = text.path + ".earlier"
            _files.download(run_id, name, earlier, server=self._server, token=self._token)
            with open(earlier, "ab") as out, open(text.path, "rb") as mine:
                shutil.copyfileobj(mine, out)
            os.replace(earlier, text.path)
        text.seeded = True

    def log_line(
        self,
        *args: object,
        sep: str = " ",
        end: str = "\n",
        flush: bool = True,
        file: str | None = None,
        **kwargs: object,
    ) -> None:
        """Appends a line to ``file`` (``outputs.log``) without printing it."""
        self._write_text(file, sep.join(str(a) for a in args) + end)
        if flush:
            self._save_texts(force=False)

    def print(
        self,
        *args: object,
        sep: str = " ",
        end: str = "\n",
        flush: bool = True,
        file: str | None = None,
        color: str | None = None,
        dedent: bool = False,
        **kwargs: object,
    ) -> None:
        """``print`` (in ``color``), and the same line into ``file`` (``outputs.log``)."""
        text = sep.join(str(a) for a in args)
        if dedent:
            text = textwrap.dedent(text)
        if color not in (None, "default") and color not in _ANSI:
            raise ValueError(f"color {color!r} is not one of {', '.join(_ANSI)}")
        shown = colored(text, color)
        builtins.print(shown, end=end, flush=True)
        self.log_line(text, sep=sep, end=end, flush=flush, file=file)

    def log_text(
        self,
        text: object = None,
        filename: str | None = None,
        dedent: bool = False,
        overwrite: bool = False,
    ) -> None:
        """Appends (or with ``overwrite`` replaces) ``str(text)`` in ``filename``."""
        if text is None:
            return
        text = str(text)
        if dedent:
            text = textwrap.dedent(text)
        self._write_text(filename, text, overwrite=overwrite)
        self._save_texts(force=False)

    def diff(
        self,
        diff_directory: str = ".",
        diff_filename: str = "index.diff",
        ref: str = "HEAD",
        verbose: bool = False,
    ) -> str | None:
        """``git diff REF --binary`` into ``diff_filename`` (replaced, not appended)."""
        done = subprocess.run(
            ["git", "diff", ref, "--binary"],
            cwd=diff_directory,
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines() or [f"exit status {done.returncode}"]
            builtins.print(
                f"logger.diff: not storing the git diff: `git diff {ref}` in "
                f"{os.path.abspath(diff_directory)} failed: {lines[0]}",
                file=sys.stderr,
            )
            return None
        self.log_text(done.stdout, diff_filename, overwrite=True)
        if verbose:
            builtins.print(done.stdout)
        return done.stdout


def _cell(value: object, color: bool = False) -> tuple[str, str]:
    """(plain, shown) text of a table cell: shown is coloured when ``color``."""
    if isinstance(value, _Shown):
        return value.text, value.colored if color else value.text
    text = f"{value:.6g}" if isinstance(value, float) else str(value)
    return text, text


def _row_table(row: Mapping[str, object], color: bool = False) -> str:
    """The row as ml-logger's two-column table; ``color``: ``Color`` values in colour."""
    if not row:
        return ""
    cells = [(k.replace("_", " "), *_cell(v, color)) for k, v in row.items()]
    left = max(len(k) for k, _, _ in cells)
    right = max(len(plain) for _, plain, _ in cells)
    lines = [f"│ {k:>{left}} │ {shown}{' ' * (right - len(plain))} │" for k, plain, shown in cells]
    top = f"╒{'═' * (left + 2)}╤{'═' * (right + 2)}╕"
    bottom = f"╘{'═' * (left + 2)}╧{'═' * (right + 2)}╛"
    return "\n".join([top, *lines, bottom])


def _row_line(row: Mapping[str, object]) -> str:
    """A row on one line (``key: value | ...``), for rows logged silently with text in them."""
    return " | ".join(f"{k}: {_cell(v)[0]}" for k, v in row.items())


def _params_table(namespaces: Mapping[str, object]) -> list[str]:
    lines = []
    for title, section in namespaces.items():
        lines.append("═" * 42)
        lines.append(f"{title:^20}")
        lines.append("─" * 20 + "┬" + "─" * 21)
        if isinstance(section, argparse.Namespace):
            section = vars(section)
        if isinstance(section, Mapping):
            lines += [f"{k!s:^20}│ {v!s:<20}" for k, v in section.items()]
        else:
            lines.append(str(section))
    if lines:
        lines.append("═" * 42)
    return lines
