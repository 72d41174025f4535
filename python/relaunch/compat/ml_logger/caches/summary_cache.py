"""``ml_logger.caches.summary_cache``: values stored per key as they come
(``store``), their stats when asked (``summary_stats``, ``summarize``),
named as ``logger.log_metrics_summary`` names them (``k/mean``,
``k/min``, ``k/max``, ``k/sum``, ``k/stddev``, ``k/mode``, quantiles).

A ``tiled`` cache is emptied by each ``summarize``; a ``rolling`` one keeps
the last ``window`` values of each key. ``flatten`` turns nested lists and
arrays (of uneven lengths too) into floats, ``None`` into NaN; NaN is left
out of the stats. A ``histogram`` stat gives no entries (ml-logger's
summary never computed one either: relaunch metrics are numbers)."""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping

from .._summary import summary_stats as _stats

AVERAGE_MODES = ["rolling", "tiled"]
STAT_MODES = ["mean", "min_max", "std_dev", "quantile", "histogram"]

__all__ = ["AVERAGE_MODES", "STAT_MODES", "SummaryCache", "flatten", "to_float"]


def to_float(item: object) -> float:
    """``item`` as a float; ``None`` is NaN."""
    return math.nan if item is None else float(item)  # type: ignore[arg-type]


def flatten(array: object) -> list[float]:
    """Every number in ``array`` (nested lists, tuples and numpy arrays of
    any shapes), in order, as floats; ``None`` is NaN."""
    if isinstance(array, str | bytes):
        raise TypeError(f"a summary holds numbers, not {type(array).__name__} {array!r}")
    if isinstance(array, Iterable):
        out: list[float] = []
        for item in array:
            out += flatten(item)
        return out
    return [to_float(array)]


class SummaryCache:
    """Values stored per key until summarized (see the module doc)."""

    def __init__(self, mode: str = "tiled", default_stats: str = "mean", window: int | None = None):
        if mode == "rolling":
            self.data: defaultdict = defaultdict(lambda: deque(maxlen=window))
        elif mode == "tiled":
            if window is not None:
                raise ValueError(
                    "window is for mode='rolling'; a tiled cache clears at each summary"
                )
            self.data = defaultdict(list)
        else:
            raise KeyError(f"mode {mode!r} is not supported; use one of {AVERAGE_MODES}")
        self.mode = mode
        self.default_stats = default_stats

    def __bool__(self) -> bool:
        return any(bool(v) for v in self.data.values())

    def __repr__(self) -> str:
        lines = "SummaryCache:"
        for k, v in self.data.items():
            first = v[0] if len(v) else None
            shape = getattr(first, "shape", None)
            if shape is not None:
                lines += f"  {k}: Shape{shape}[:{len(v)}]\n"
            else:
                lines += f"  {k}: {list(v)[:2]}[:{len(v)}]\n"
        return lines

    def __contains__(self, key: object) -> bool:
        return key in self.data

    def __getitem__(self, key: str):
        return self.get(key)

    def store(self, metrics: Mapping | None = None, **key_values: object) -> list[str]:
        """Appends each value under its key; returns the keys."""
        if metrics:
            key_values.update(metrics)
        for k, v in key_values.items():
            self.data[k].append(v)
        return list(key_values)

    def summarize(self, force_clear: bool | None = None, key_stats=None, **_key_stats: str) -> dict:
        """``summary_stats`` of every key, then emptied when tiled (or ``force_clear``)."""
        summary = self.summary_stats(key_stats=key_stats, **_key_stats)
        if force_clear or self.mode == "tiled":
            self.clear()
        return summary

    def clear(self) -> None:
        self.data.clear()

    def peek(self, *keys: str, len: int = 5) -> dict:
        """The last ``len`` values of each key (all keys when none are named)."""
        return {
            k: list(self.data[k])[-len if len else None :]
            for k in (keys or list(self.data))
            if self.data.get(k)
        }

    def get(self, key: str, default=None):
        """The values stored under ``key`` as a numpy array, or ``default``."""
        import numpy

        return numpy.array(self.data[key]) if key in self.data else default

    def pop(self, key: str, default=None):
        """``get``, and the key is removed."""
        import numpy

        return numpy.array(self.data.pop(key)) if key in self.data else default

    def summary_stats(
        self, *only_keys: str, key_stats=None, explicit=None, stats=None, **_key_stats: str
    ) -> dict[str, float]:
        """The stats of each key (``only_keys`` and those in ``key_stats``
        when given, else all), each key's kind from ``key_stats``, else
        ``stats``, else ``default_stats``. Leaves the values stored."""
        explicit = explicit or bool(only_keys)
        wanted = dict(key_stats or {})
        wanted.update(_key_stats)
        keys = [*only_keys, *wanted] if explicit else list(self.data)
        out: dict[str, float] = {}
        for k in dict.fromkeys(keys):
            if k not in self.data:
                continue
            kind = wanted.get(k, stats or self.default_stats)
            if "hist" in kind:
                continue
            out.update(_stats(k, flatten(self.data[k]), kind))
        return out
