"""``python -m relaunch``: hands the command line to the Rust CLI, in-process
(the `relaunch` command itself is the native binary the wheel installs)."""

import signal
import sys

from relaunch import _native


def main() -> None:
    # The Rust side handles SIGINT itself (to stop servers cleanly), so
    # Python's KeyboardInterrupt handler must not sit in front of it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_native.cli_main(["relaunch", *sys.argv[1:]], sys.executable))
