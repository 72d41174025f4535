"""cycling_utils' ``MetricsTracker`` and ``TimestampedTimer``.

``MetricsTracker.reduce()`` sums each rank's values over torch.distributed
on the process group's own device (a CPU tensor for gloo, the current CUDA
device for NCCL; cycling_utils always uses CUDA), and with one process
(no process group) keeps them as they are. Reducing nothing is a no-op
(cycling_utils raises ``ValueError`` there).
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

__all__ = ["MetricsTracker", "TimestampedTimer"]


class MetricsTracker:
    """Sums of named values: ``update`` adds this rank's, ``reduce`` sums them
    over the ranks into ``agg``, ``end_epoch`` files ``agg`` as one report."""

    def __init__(self) -> None:
        self.local: defaultdict[str, float] = defaultdict(float)
        self.agg: defaultdict[str, float] = defaultdict(float)
        self.epoch_reports: list[dict[str, float]] = []

    def update(self, metrics: Mapping[str, float]) -> MetricsTracker:
        if not isinstance(metrics, Mapping):
            raise TypeError(f"update() takes a dict of numbers, not {type(metrics).__name__}")
        for key, value in metrics.items():
            self.local[key] += float(value)
        return self

    def reduce(self) -> MetricsTracker:
        if not self.local:
            return self
        keys = sorted(self.local)
        values = [self.local[k] for k in keys]
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            import torch

            device = "cpu"
            if dist.get_backend() == "nccl":
                device = f"cuda:{torch.cuda.current_device()}"
            tensor = torch.tensor(values, dtype=torch.float64, device=device)
            dist.all_reduce(tensor)
            values = tensor.tolist()
        for key, value in zip(keys, values, strict=True):
            self.agg[key] += value
        self.reset_local()
        return self

    def reset_local(self) -> None:
        self.local = defaultdict(float)

    def end_epoch(self) -> None:
        self.epoch_reports.append(dict(self.agg))
        self.local = defaultdict(float)
        self.agg = defaultdict(float)

    def state_dict(self) -> dict[str, Any]:
        return {"epoch_reports": self.epoch_reports, "agg": dict(self.agg)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.epoch_reports = list(state["epoch_reports"])
        self.agg = defaultdict(float, state["agg"])
        self.reset_local()


class TimestampedTimer:
    """Prints ``[ time ] message: N ms, T s total`` on rank 0 for each
    :meth:`report`, and returns the seconds since the last one when asked."""

    def __init__(
        self, report: str | None = None, start_time: float | None = None, running: float = 0
    ) -> None:
        self.start_time = time.time() if start_time is None else start_time
        self.last = self.start_time
        self.running = running
        if report is not None:
            self.report(report)

    def report(self, annot: str = "", ret: bool = False) -> float | None:
        now = time.time()
        duration = now - self.last
        self.running += duration
        self.last = now
        if os.environ.get("RANK", "0") == "0":
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
            print(f"[ {stamp} ] {annot} {duration * 1000:,.3f} ms, {self.running:,.3f} s total")
        return duration if ret else None
