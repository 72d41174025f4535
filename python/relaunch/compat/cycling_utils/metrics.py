"""cycling_utils' ``MetricsTracker`` (``cycling_utils.metrics``).

As there: ``update(dict)`` adds this rank's values into ``local``;
``reduce()`` sums ``local`` over the ranks, leaves the sums in ``local``
(for reporting this batch: ``rpt = metrics.local; rpt["loss"] /
rpt["examples_seen"]``) and adds them to ``agg``; ``reset_local()`` clears
``local`` for the next batch; ``end_epoch()`` files ``agg`` in
``epoch_reports`` and clears both. Each call returns the tracker.

What differs: ``reduce()`` sums in float64 (cycling_utils: float32, which
rounds counts above 2**24) on the process group's own device (a CPU tensor
for gloo, the current CUDA device for NCCL; cycling_utils always uses
CUDA); with one process and no process group it keeps the values as they
are (cycling_utils raises), and reducing nothing is a no-op (cycling_utils
raises ``ValueError``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from relaunch.compat.cycling_utils.timing import TimestampedTimer

__all__ = ["MetricsTracker", "TimestampedTimer"]


class MetricsTracker:
    """Sums of named values over the ranks: per batch in ``local`` (after
    :meth:`reduce`), per epoch in ``agg``, one report per epoch in
    ``epoch_reports`` (see the module)."""

    def __init__(self) -> None:
        self.local: defaultdict[str, float] = defaultdict(float)
        self.agg: defaultdict[str, float] = defaultdict(float)
        self.epoch_reports: list[dict[str, float]] = []

    def update(self, metrics: Mapping[str, Any]) -> MetricsTracker:
        """Add this rank's values (numbers, or one-element tensors) to ``local``."""
        if not isinstance(metrics, Mapping):
            raise TypeError(f"update() takes a dict of numbers, not {type(metrics).__name__}")
        for key, value in metrics.items():
            try:
                number = float(value)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(
                    f"update(): the value of {key!r} must be a number (or a one-element "
                    f"tensor), got {value!r}"
                ) from None
            self.local[key] += number
        return self

    def reduce(self) -> MetricsTracker:
        """Sum ``local`` over the ranks into ``local``, and add it to ``agg``."""
        if not self.local:
            return self
        keys = list(self.local)
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
        self.local = defaultdict(float, zip(keys, values, strict=True))
        for key, value in self.local.items():
            self.agg[key] += value
        return self

    def reset_local(self) -> MetricsTracker:
        self.local = defaultdict(float)
        return self

    def end_epoch(self) -> MetricsTracker:
        self.epoch_reports.append(dict(self.agg))
        self.agg = defaultdict(float)
        return self.reset_local()

    def state_dict(self) -> dict[str, Any]:
        """``epoch_reports`` and ``agg`` (``local`` differs between ranks)."""
        return {"epoch_reports": self.epoch_reports, "agg": dict(self.agg)}

    def load_state_dict(self, state: Mapping[str, Any]) -> MetricsTracker:
        if not isinstance(state, Mapping) or not {"epoch_reports", "agg"} <= set(state):
            raise ValueError(
                "state must be the dict MetricsTracker.state_dict() returned, with "
                f"'epoch_reports' and 'agg'; got {state!r:.100}"
            )
        self.epoch_reports = list(state["epoch_reports"])
        self.agg = defaultdict(float, state["agg"])
        return self.reset_local()
