"""What a process of ``relaunch.start_processes`` runs: the function it was
given, its return value written for the parent, its error written to
torch's error file (``TORCHELASTIC_ERROR_FILE``) when it raises.

With the spawn method this module is the new interpreter's main
(``python -c "from relaunch._spawn import main; main()" CALL``): it sets up
the parent's main module as ``multiprocessing``'s spawn does, then unpickles
the function and its arguments from ``CALL``. With the fork method the
forked child calls :func:`call` directly.
"""

from __future__ import annotations

import json
import multiprocessing.spawn
import os
import pickle
import sys
import time
import traceback
from typing import Any


def call(fn: Any, args: tuple, result_path: str) -> int:
    """Runs ``fn(*args)``; its return value goes to ``result_path`` (written
    under another name, then renamed: whole or absent). Returns the exit
    code: 0, or 1 with the error file written."""
    try:
        value = fn(*args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if code != 0:
            _write_error(f"SystemExit: {e.code}")
        return code
    except BaseException as e:
        _write_error(f"{type(e).__name__}: {e}")
        traceback.print_exc()
        return 1
    partial = f"{result_path}.partial"
    with open(partial, "wb") as f:
        pickle.dump(value, f)
    os.replace(partial, result_path)
    return 0


def _write_error(message: str) -> None:
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    record = {
        "message": {
            "message": message,
            "extraInfo": {
                "py_callstack": traceback.format_exc(),
                "timestamp": str(int(time.time())),
            },
        }
    }
    with open(path, "w") as f:
        json.dump(record, f)


def main() -> None:
    with open(sys.argv[1], "rb") as f:
        payload = pickle.load(f)
    # The parent's main module, importable as __mp_main__, so that a
    # function defined there unpickles here.
    multiprocessing.spawn.prepare(payload["prep"])
    fn, args = pickle.loads(payload["call"])
    sys.exit(call(fn, args, payload["result"]))
