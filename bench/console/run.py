"""The console benchmark: what `relaunch run` costs when its output goes to a
terminal, against `torchrun`, same job, same run.

    .venv/bin/python bench/console/run.py [--repeat 3] [--lines 100000]

The launcher's stdout and stderr are a pseudo-terminal that this script
reads as fast as it can (a terminal emulator that never falls behind).
Two workers each print `--lines` lines of 80 bytes. Three launchers:
relaunch as users get it on a terminal (`--worker-tty auto`: a
pseudo-terminal per worker stream, whose output relaunch parses as a
terminal would), relaunch with pipes (`--worker-tty never`), and torchrun,
whose workers write to the terminal themselves. Figures, medians of
`--repeat` alternating runs: wall time to the launcher's exit, and the CPU
time of the launcher process alone (read from /proc while it is a zombie,
before it is reaped, so its children's time is not in it).
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import write_result

BIN = Path(sys.executable).parent
PRINTER = "import sys\nfor i in range(int(sys.argv[1])): print(f'line {i:>8} ' + 'x' * 66)\n"


def launch(cmd: list[str], lines: int, workdir: Path) -> tuple[float, float, int]:
    """Wall seconds, launcher CPU seconds, bytes that reached the terminal."""
    import fcntl
    import pty
    import struct
    import termios

    script = workdir / "printer.py"
    script.write_text(PRINTER)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))
    start = time.perf_counter()
    proc = subprocess.Popen(
        [*cmd, "--nproc-per-node", "2", "--no-python", sys.executable, str(script), str(lines)],
        stdin=subprocess.DEVNULL,
        stdout=follower,
        stderr=follower,
        cwd=workdir,
    )
    os.close(follower)
    received = 0
    while True:
        ready, _, _ = select.select([leader], [], [], 1.0)
        if not ready:
            if proc.poll() is not None:
                break
            continue
        try:
            data = os.read(leader, 1 << 20)
        except OSError:  # every writer closed the terminal
            break
        if not data:
            break
        received += len(data)
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    wall = time.perf_counter() - start
    fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    code = proc.wait()
    os.close(leader)
    if code != 0:
        raise RuntimeError(f"{cmd[0]} exited {code}")
    return wall, cpu, received


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--lines", type=int, default=100_000)
    args = parser.parse_args()
    launchers = {
        "relaunch --worker-tty auto": [str(BIN / "relaunch"), "run", "--worker-tty", "auto"],
        "relaunch --worker-tty never": [str(BIN / "relaunch"), "run", "--worker-tty", "never"],
        "torchrun": [str(BIN / "torchrun")],
    }
    samples: dict[str, list[tuple[float, float, int]]] = {name: [] for name in launchers}
    workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"relaunch-bench-console-{os.getpid()}"
    workdir.mkdir(parents=True, exist_ok=True)
    for _ in range(args.repeat):
        for name, cmd in launchers.items():
            samples[name].append(launch(cmd, args.lines, workdir))
    result = {}
    for name, runs in samples.items():
        result[name] = {
            "wall_s": statistics.median(r[0] for r in runs),
            "launcher_cpu_s": statistics.median(r[1] for r in runs),
            "bytes": statistics.median(r[2] for r in runs),
        }
    torchrun_wall = result["torchrun"]["wall_s"]
    for name, figures in result.items():
        figures["wall_vs_torchrun"] = torchrun_wall / figures["wall_s"]
        print(
            f"{name:30} wall {figures['wall_s']:6.2f} s ({figures['wall_vs_torchrun']:.2f}x"
            f" torchrun's speed)  launcher CPU {figures['launcher_cpu_s']:5.2f} s"
            f"  {figures['bytes'] / 1e6:.1f} MB shown"
        )
    print(f"written to {write_result('console', {'lines': args.lines, 'results': result})}")


if __name__ == "__main__":
    main()
