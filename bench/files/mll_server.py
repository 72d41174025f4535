"""Starts ml-logger's server (``python -m ml_logger.server``) on Python 3.10+.

ml-logger 0.10.36 pins sanic==20.9.0, written for Python <= 3.9: sanic
passes ``loop=`` to asyncio's Event and Queue, and ml-logger's upload handler
imports ``collections.Sequence``; Python 3.10 removed both, so the unpatched
server fails on its first connection. This shim puts them back (dropping the
ignored ``loop=`` argument, as Python 3.8-3.9 did in effect) and changes
nothing else: the request path is ml-logger's and sanic's own.

    bench/files/.venv/bin/python bench/files/mll_server.py --logdir DIR --port PORT
"""

import asyncio
import collections
import collections.abc
import runpy
import sys


def _drop_loop(cls):
    init = cls.__init__

    def __init__(self, *args, loop=None, **kwargs):
        init(self, *args, **kwargs)

    cls.__init__ = __init__


for _cls in (asyncio.Event, asyncio.Queue, asyncio.Lock, asyncio.Condition, asyncio.Semaphore):
    _drop_loop(_cls)
collections.Sequence = collections.abc.Sequence  # type: ignore[attr-defined]

if __name__ == "__main__":
    sys.argv[0] = "ml_logger.server"
    runpy.run_module("ml_logger.server", run_name="__main__", alter_sys=True)
