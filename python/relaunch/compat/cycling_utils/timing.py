"""cycling_utils' ``TimestampedTimer`` (``cycling_utils.timing``)."""

from __future__ import annotations

import os
import time

__all__ = ["TimestampedTimer"]


def _prints() -> bool:
    """Rank 0 prints, and a process outside a distributed job (no ``RANK``, or
    ``RANK=NONE``, as cycling_utils reads it)."""
    return os.environ.get("RANK", "NONE") in ("0", "NONE")


def _line(annot: object, milliseconds: float, total: float) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"[ {stamp} ] {annot!s:<70}{milliseconds:>12,.3f} ms, {total:>12,.2f} s total"


class TimestampedTimer:
    """Point-to-point timing, printed on rank 0 as cycling_utils prints it::

        timer = TimestampedTimer()        # [ 2024-01-01 12:00:00 ] Start   0.000 ms, 0.00 s total
        ...
        timer.report("loaded the data")   # the time since the last report, and the total

    ``report(annot, ret=True)`` also returns the seconds since the previous
    report (or the construction); ``start_time`` is when that was.
    ``running`` starts at ``running=`` (to carry a total across a resume).
    """

    def __init__(
        self, report: str | None = None, start_time: float | None = None, running: float = 0
    ) -> None:
        self.start_time = time.time() if start_time is None else start_time
        self.running = running
        if _prints():
            print(_line(report or "Start", 0.0, 0.0))

    def report(self, annot: str, ret: bool = False) -> float | None:
        now = time.time()
        duration = now - self.start_time
        self.running += duration
        if _prints():
            print(_line(annot, 1000 * duration, self.running))
        self.start_time = now
        return duration if ret else None
