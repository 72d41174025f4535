"""Ships the params that ``relaunch.compat.ml_logger`` queued while the server
could not be reached, when the process that logged them is gone:

    python -m relaunch.compat.ml_logger.outbox [CLIENT_DIR] [--server URL]

``CLIENT_DIR`` is relaunch's client directory (default ``RELAUNCH_DIR``, else
``$XDG_STATE_HOME/relaunch/runs``); each queue goes to the server it was
meant for unless ``--server`` says otherwise, with ``RELAUNCH_SERVER_TOKEN``
as the token. Files queued the same way are relaunch's own pending uploads:
``relaunch sync CLIENT_DIR`` ships them. Exits 1 when something is left.
"""

from __future__ import annotations

import argparse
import sys

from ._outbox import deliver_all


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m relaunch.compat.ml_logger.outbox",
        description="Deliver params queued by relaunch.compat.ml_logger while the server was away.",
    )
    parser.add_argument("client_dir", nargs="?", default=None, help="relaunch's client directory")
    parser.add_argument("--server", default=None, help="deliver there instead")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a request may take")
    args = parser.parse_args(argv)
    left = 0
    for run_id, done, why in deliver_all(args.client_dir, args.server, None, args.timeout):
        if done:
            print(f"run {run_id}: params delivered")
        else:
            left += 1
            print(f"run {run_id}: not delivered: {why}", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
