"""`relaunch run` on a terminal: workers get a pseudo-terminal per stream, and
what they draw (Rich's live displays, tqdm's stacked bars, colours) reaches
the launcher's terminal redrawn in place below the output, each rank's lines
prefixed, while log files keep plain finished lines.

The launcher's terminal here is a real pseudo-terminal; pyte (a terminal
emulator) renders what the launcher wrote to it, chunk by chunk, as a user's
terminal would show it.
"""

from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pyte
import pytest

HERE = Path(__file__).parent
WORKERS = HERE / "workers"
RELAUNCH = [sys.executable, "-m", "relaunch", "run"]
COLUMNS, ROWS = 100, 40
PREFIX = len("[default0]:")


def terminal_env() -> dict[str, str]:
    """A 256-colour terminal, and nothing that overrides what a library
    detects from it."""
    env = dict(os.environ, TERM="xterm-256color")
    for name in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE"):
        env.pop(name, None)
    return env


def on_terminal(
    *args: object, stdout_too: bool = True, timeout: float = 120
) -> tuple[int, list[bytes], str]:
    """Runs ``relaunch run ARGS`` with its stderr (and stdout, unless
    ``stdout_too`` is false: then stdout is a pipe) on a new pseudo-terminal
    of COLUMNS x ROWS. Returns the exit code, what reached the terminal
    chunk by chunk, and the piped stdout."""
    import fcntl
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(
        [*RELAUNCH, *map(str, args)],
        stdin=subprocess.DEVNULL,
        stdout=follower if stdout_too else subprocess.PIPE,
        stderr=follower,
        env=terminal_env(),
    )
    os.close(follower)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([leader], [], [], 1.0)
            if not ready:
                continue
            try:
                data = os.read(leader, 65536)
            except OSError:  # every writer closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        else:
            proc.kill()
            pytest.fail(f"relaunch run did not end within {timeout} s")
        piped = proc.stdout.read().decode() if proc.stdout else ""
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, chunks, piped


def render(chunks: list[bytes], each=None) -> pyte.Screen:
    """The terminal after ``chunks``; ``each(screen)`` runs after every chunk.
    The screen is taller than the terminal, so nothing scrolls away."""
    screen = pyte.Screen(COLUMNS, 400)
    stream = pyte.ByteStream(screen)
    for chunk in chunks:
        stream.feed(chunk)
        if each is not None:
            each(screen)
    return screen


def lines(screen: pyte.Screen) -> list[str]:
    return [line.rstrip() for line in screen.display if line.strip()]


def probes(text: str) -> dict[int, dict]:
    found = re.findall(r"\[default(\d)\]:probe (\{.*?\})", text)
    return {int(rank): json.loads(probe) for rank, probe in found}


def test_workers_see_a_terminal_as_wide_as_the_launchers_less_the_prefix(tmp_path):
    code, chunks, _ = on_terminal(
        "--nproc-per-node", "2", "--log-dir", tmp_path, WORKERS / "tty_probe.py"
    )
    assert code == 0
    screen = render(chunks)
    shown = "\n".join(lines(screen))
    expected = {"stdout": True, "stderr": True, "size": [COLUMNS - PREFIX, ROWS]}
    assert probes(shown) == {0: expected, 1: expected}, shown
    for rank in range(2):
        # Colour reaches the terminal; the log file keeps the text.
        [row] = [y for y, line in enumerate(screen.display) if f"[default{rank}]:red" in line]
        red = screen.buffer[row][PREFIX]
        assert (red.data, red.fg, red.bold) == ("r", "red", True)
        assert f"[default{rank}]:last words, no newline" in shown
        [log] = tmp_path.glob(f"*/attempt_0/{rank}/stdout.log")
        assert log.read_text() == "red plain\nlast words, no newline\n"


def test_only_streams_the_console_shows_on_a_terminal_get_one(tmp_path):
    # --worker-tty never: pipes.
    code, chunks, _ = on_terminal("--worker-tty", "never", WORKERS / "tty_probe.py")
    assert code == 0
    assert probes("\n".join(lines(render(chunks))))[0] == {
        "stdout": False,
        "stderr": False,
        "size": None,
    }
    # stdout redirected to its log file: a pipe, as under torchrun a file.
    code, chunks, _ = on_terminal("--redirects", "1", WORKERS / "tty_probe.py")
    assert code == 0
    probe = probes("\n".join(lines(render(chunks))))[0]
    assert (probe["stdout"], probe["stderr"]) == (False, True)
    # The launcher's stdout is a pipe and its stderr a terminal: so are the workers'.
    code, chunks, piped = on_terminal(WORKERS / "tty_probe.py", stdout_too=False)
    assert code == 0
    probe = probes("\n".join(lines(render(chunks))))[0]
    assert (probe["stdout"], probe["stderr"]) == (False, True)
    assert "[default0]:\x1b[1;31mred\x1b[0m plain\n" in piped  # the worker's own bytes


def test_worker_tty_always_draws_colours_into_a_pipe(tmp_path):
    proc = subprocess.run(
        [*RELAUNCH, "--worker-tty", "always", WORKERS / "tty_probe.py"],
        capture_output=True,
        text=True,
        timeout=120,
        env=terminal_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert probes(proc.stderr)[0] == {"stdout": True, "stderr": True, "size": [80 - PREFIX, 24]}
    assert "[default0]:\x1b[0;1;31mred\x1b[0m plain\n" in proc.stdout


def test_rich_bars_of_two_ranks_are_redrawn_in_place_below_the_output(tmp_path):
    code, chunks, _ = on_terminal(
        "--nproc-per-node", "2", "--log-dir", tmp_path, WORKERS / "rich_bars.py", "60"
    )
    assert code == 0
    bar = re.compile(r"^\[default(\d)\]:rank \1 .*?(\d+)%")
    seen_live: set[int] = set()

    def at_every_moment(screen: pyte.Screen) -> None:
        shown = [m for line in screen.display if (m := bar.match(line))]
        ranks = [int(m.group(1)) for m in shown]
        # One bar per rank at any moment: redrawn, never printed again.
        assert sorted(set(ranks)) == sorted(ranks), "\n".join(lines(screen))
        seen_live.update(int(m.group(1)) for m in shown if int(m.group(2)) < 100)

    screen = render(chunks, at_every_moment)
    assert seen_live == {0, 1}, "the bars were not drawn while the ranks ran"
    shown = lines(screen)
    for rank in range(2):
        mine = [line for line in shown if line.startswith(f"[default{rank}]:")]
        assert [line for line in mine if "halfway" in line] == [f"[default{rank}]:halfway {rank}"]
        bars = [line for line in mine if bar.match(line)]
        assert len(bars) == 1 and "100%" in bars[0], shown
        # A rank's lines in its order: the line printed above the live bar,
        # the bar's final state, then what came after.
        assert mine.index(f"[default{rank}]:halfway {rank}") < mine.index(bars[0])
        assert mine.index(bars[0]) < mine.index(f"[default{rank}]:done {rank}")
        # In colour: Rich's bar and its markup.
        [row] = [y for y, line in enumerate(screen.display) if line.rstrip() == bars[0]]
        cells = [screen.buffer[row][x] for x in range(COLUMNS)]
        assert any(c.data == "━" and c.fg != "default" for c in cells)
        [row] = [y for y, line in enumerate(screen.display) if f"halfway {rank}" in line]
        assert (screen.buffer[row][PREFIX].fg, screen.buffer[row][PREFIX].bold) == ("red", True)
        [log] = tmp_path.glob(f"*/attempt_0/{rank}/stdout.log")
        logged = log.read_text().splitlines()
        assert logged[0] == f"halfway {rank}" and logged[-1] == f"done {rank}", logged
        assert len(logged) == 3 and re.match(rf"rank {rank} ━+ 100%", logged[1]), logged


def test_tqdm_stacked_bars_leave_one_final_bar_and_every_message(tmp_path):
    code, chunks, _ = on_terminal(
        "--nproc-per-node", "2", "--log-dir", tmp_path, WORKERS / "tqdm_bars.py", "3", "15"
    )
    assert code == 0

    def at_every_moment(screen: pyte.Screen) -> None:
        for rank in range(2):
            mine = [line for line in screen.display if line.startswith(f"[default{rank}]:epochs")]
            assert len(mine) <= 1, "\n".join(lines(screen))

    shown = lines(render(chunks, at_every_moment))
    for rank in range(2):
        mine = [line for line in shown if line.startswith(f"[default{rank}]:")]
        assert [line for line in mine if "epochs" in line] == [
            line for line in mine if re.search(rf"epochs{rank}: 100%.* 3/3 ", line)
        ] and len([line for line in mine if "epochs" in line]) == 1, shown
        assert not [line for line in mine if "batches" in line], shown  # leave=False
        for epoch in range(3):
            assert mine.count(f"[default{rank}]:epoch {epoch} done on {rank}") == 1, shown
        [log] = tmp_path.glob(f"*/attempt_0/{rank}/stderr.log")
        assert re.fullmatch(rf"epochs{rank}: 100%[^\n]* 3/3 [^\n]*\n", log.read_text())
