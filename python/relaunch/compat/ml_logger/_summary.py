"""Summaries: the stats of stored values that ``log_metrics_summary`` logs,
named as ml-logger names them, and the cache that holds the values until
then (cleared by each summary, or a sliding window)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

from ._values import _floats

_STAT_WORDS = ("sum", "max", "min", "mean", "std", "quantile")


def _percentile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) percentile of sorted values."""
    at = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def summary_stats(key: str, values: list[float], stats: str) -> dict[str, float]:
    """The summary of ``key``'s values that ml-logger names by ``stats`` (see the package doc)."""
    if not isinstance(stats, str):
        raise TypeError(f"the stats for {key!r} must be a str such as 'mean', not {stats!r}")
    if "hist" in stats:
        raise ValueError(
            f"stats {stats!r} for {key!r}: relaunch metrics are numbers, so histograms are not "
            "logged; use 'quantile' or 'min_max'"
        )
    if not any(word in stats for word in _STAT_WORDS):
        raise ValueError(
            f"unknown stats {stats!r} for {key!r}; use one of mean, min_max, std_dev, "
            "quantile, sum, min, max"
        )
    d = [x for x in values if not math.isnan(x)]
    if not d:
        return {}
    out: dict[str, float] = {}
    mean = math.fsum(d) / len(d)
    if "sum" in stats:
        out[f"{key}/sum"] = math.fsum(d)
    if "max" in stats:
        out[f"{key}/max"] = max(d)
    if "min" in stats:
        out[f"{key}/min"] = min(d)
    if "mean" in stats or stats == "min_max":
        out[f"{key}/mean"] = mean
    if "std" in stats:
        out[f"{key}/stddev"] = math.sqrt(math.fsum((x - mean) ** 2 for x in d) / len(d))
        out[f"{key}/mean"] = mean
        counts: dict[float, int] = {}
        for x in d:
            counts[x] = counts.get(x, 0) + 1
        top = max(counts.values())
        out[f"{key}/mode"] = min(x for x, n in counts.items() if n == top)
    if "quantile" in stats:
        ordered = sorted(d)
        out[f"{key}/0"] = ordered[0]
        out[f"{key}/25"] = _percentile(ordered, 25)
        out[f"{key}/mean"] = _percentile(ordered, 50)  # the median, named as ml-logger names it
        out[f"{key}/75"] = _percentile(ordered, 75)
        out[f"{key}/100"] = ordered[-1]
    return {k: float(v) for k, v in out.items()}


class _SummaryCache:
    """Values stored per key until a summary: cleared by it (``tiled``) or a
    sliding ``window`` (``rolling``)."""

    def __init__(self, mode: str = "tiled", default_stats: str = "mean", window=None) -> None:
        if mode == "tiled" and window is not None:
            raise ValueError("window is for mode='rolling'; a tiled cache clears at each summary")
        if mode not in ("tiled", "rolling"):
            raise ValueError(f"summary cache mode {mode!r} is not 'tiled' or 'rolling'")
        self.mode, self.window, self.default_stats = mode, window, default_stats
        self.data: dict[str, deque[float] | list[float]] = {}

    def store(self, values: Mapping) -> None:
        converted = {k: _floats(k, v) for k, v in values.items()}
        for k, floats in converted.items():
            if k not in self.data:
                self.data[k] = deque(maxlen=self.window) if self.mode == "rolling" else []
            self.data[k].extend(floats)

    def summarize(self, key_stats: Mapping[str, str], default: str | None) -> dict[str, float]:
        summary: dict[str, float] = {}
        for k, values in self.data.items():
            summary.update(summary_stats(k, list(values), key_stats.get(k) or default or "mean"))
        if self.mode == "tiled":
            self.data.clear()
        return summary

    def __bool__(self) -> bool:
        return any(self.data.values())
