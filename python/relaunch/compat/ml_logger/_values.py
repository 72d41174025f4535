"""Values: what a script logs, as relaunch takes it. Params become JSON data
(the way ml-logger's ``metrify`` kept them) and merge as ml-logger merged
them; a metric row keeps numbers as metrics and everything else as shown
values (``_Shown``): a ``Color``'s value and an array's mean are metrics
too, strings and other objects are text of the row."""

from __future__ import annotations

import argparse
import copy
import dataclasses
import enum
import math
import numbers
from collections import deque
from collections.abc import Mapping
from pathlib import PurePath

from .helpers.color_helpers import Color, colored


def _jsonable(value: object, depth: int = 0) -> object:
    """``value`` as JSON data, the way ml-logger's ``metrify`` kept it (else its ``str``)."""
    if depth > 64:
        raise ValueError("params nested deeper than 64 levels; is a container inside itself?")
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset | deque):
        return [_jsonable(v, depth + 1) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value), depth + 1)
    if isinstance(value, argparse.Namespace):
        return _jsonable(vars(value), depth + 1)
    if isinstance(value, enum.Enum):
        return _jsonable(value.value, depth + 1)
    if isinstance(value, PurePath):
        return str(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "shape", None) is not None:
        try:
            return _jsonable(tolist(), depth + 1)
        except (TypeError, ValueError):
            pass
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _jsonable(float(value), depth + 1)
    return str(value)


def _namespace(value: object) -> object:
    if isinstance(value, argparse.Namespace):
        value = vars(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    return _jsonable(value)


def _assign(into: dict, more: Mapping) -> dict:
    """ml-logger's deep merge: dicts merge, anything else replaces."""
    for k, v in more.items():
        if isinstance(into.get(k), dict) and isinstance(v, Mapping):
            into[k] = _assign(into[k], v)
        else:
            into[k] = copy.deepcopy(v)
    return into


def _dot_flatten(d: Mapping, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            flat.update(_dot_flatten(v, key + "."))
        else:
            flat[key] = v
    return flat


@dataclasses.dataclass(frozen=True)
class _Shown:
    """A row value that is not simply a number: ``number`` is what is logged
    as the metric (None: nothing, it is text), ``text`` what the printed row
    and the run's text file show, ``colored`` the same for a terminal,
    ``data`` the value as JSON data (for rows flushed into a ``.jsonl``)."""

    number: int | float | None
    text: str
    colored: str
    data: object = None


_MAX_SHOWN = 200  # characters of an array's or an object's text in the row


def _short(text: str) -> str:
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."


def _flat(value: object, depth: int = 0) -> list[object] | None:
    """The leaves of nested lists/tuples; None when it nests deeper than 32."""
    if depth > 32:
        return None
    if isinstance(value, list | tuple):
        out: list[object] = []
        for item in value:
            leaves = _flat(item, depth + 1)
            if leaves is None:
                return None
            out += leaves
        return out
    return [value]


def _plain_number(value: object) -> int | float | None:
    """``value`` as a Python number when it is one (bools, numpy scalars,
    0-d and one-element arrays and tensors included); else None."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "shape", None) is not None:
        try:
            leaves = _flat(tolist())
        except (TypeError, ValueError, RuntimeError):
            return None
        if leaves is not None and len(leaves) == 1 and not hasattr(leaves[0], "tolist"):
            return _plain_number(leaves[0])
    return None


def _mean(value: object) -> float | None:
    """The mean of an array, tensor or (nested) list of numbers, NaN and None
    left out (NaN when nothing is left); None when it is not all numbers."""
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "shape", None) is not None:
        try:
            value = tolist()
        except (TypeError, ValueError, RuntimeError):
            return None
    if not isinstance(value, list | tuple):
        return None
    leaves = _flat(value)
    if leaves is None:
        return None
    floats = []
    for leaf in leaves:
        if isinstance(leaf, bool):
            floats.append(float(leaf))
        elif leaf is None:
            continue
        elif isinstance(leaf, numbers.Real):
            floats.append(float(leaf))
        else:
            return None
    kept = [x for x in floats if not math.isnan(x)]
    return math.fsum(kept) / len(kept) if kept else math.nan


def _cell(key: str, value: object) -> int | float | _Shown:
    """A metric value as the row keeps it (see the package doc, "metrics"):
    a number is the metric; a ``Color`` is its value, shown formatted and
    coloured; an array or list of numbers is its mean, shown whole; a string
    or any other object is text, shown and kept out of the metrics."""
    if isinstance(value, _Shown):  # a row's value again (log_metrics_summary's key_values)
        return value
    if isinstance(value, Color):
        inner = _cell(key, value.value)
        number = inner.number if isinstance(inner, _Shown) else inner
        try:
            text = str(value)
            shown = format(value, "")
        except Exception:  # a formatter that fails on this value: show it plain
            text = str(value.value)
            shown = colored(text, value.color)
        data = inner.data if isinstance(inner, _Shown) else inner
        return _Shown(number, _short(text), _short(shown), data)
    number = _plain_number(value)
    if number is not None:
        return number
    if isinstance(value, str):
        return _Shown(None, value, value, value)
    if isinstance(value, bytes | bytearray):
        text = bytes(value).decode("utf-8", "backslashreplace")
        return _Shown(None, text, text, text)
    mean = _mean(value)
    if mean is not None:
        text = _short(str(value))
        return _Shown(mean, text, text, _jsonable(value))
    if isinstance(value, numbers.Number):  # complex
        return _Shown(None, str(value), str(value), str(value))
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError, OverflowError):
        text = _short(str(value))
        return _Shown(None, text, text, str(value))
    return number


def _metric_row(values: Mapping, prefix: str = "") -> dict[str, int | float | _Shown]:
    row: dict[str, int | float | _Shown] = {}
    for k, v in values.items():
        if not isinstance(k, str):
            raise TypeError(
                f"metric names must be str, not {type(k).__name__}: {k!r} (log_key_value takes "
                "the name first: log_key_value('loss', 0.1))"
            )
        key = prefix + k
        if isinstance(v, Mapping):
            row.update(_metric_row(v, key + "/"))
        else:
            row[key] = _cell(key, v)
    return row


def _numbers(row: Mapping[str, int | float | _Shown]) -> dict[str, int | float]:
    """The metrics of a row: its numbers, and the numbers of its shown values."""
    out: dict[str, int | float] = {}
    for k, v in row.items():
        if isinstance(v, _Shown):
            if v.number is not None:
                out[k] = v.number
        else:
            out[k] = v
    return out


def _json_row(row: Mapping[str, int | float | _Shown]) -> dict[str, object]:
    """The row as JSON data, every value as logged (arrays as lists)."""
    return {k: v.data if isinstance(v, _Shown) else v for k, v in row.items()}


def _texts(row: Mapping[str, int | float | _Shown]) -> dict[str, str]:
    """The text values of a row (those that are not metrics)."""
    return {k: v.text for k, v in row.items() if isinstance(v, _Shown) and v.number is None}


def _floats(key: str, value: object, depth: int = 0) -> list[float]:
    """ml-logger's ``flatten``: nested sequences and arrays to floats, None as NaN."""
    if depth > 32:
        raise ValueError(f"{key!r}: values nested deeper than 32 levels")
    if isinstance(value, Color):
        value = value.value
    if value is None:
        return [math.nan]
    if isinstance(value, str | bytes | bytearray | Mapping):
        raise TypeError(
            f"store_metrics: {key!r} is {type(value).__name__}, not a number or a sequence "
            "of numbers"
        )
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and getattr(value, "shape", None) is not None:
        value = tolist()
        if not isinstance(value, list):
            return [math.nan if value is None else float(value)]
    if isinstance(value, list | tuple | deque | set | frozenset):
        return [x for item in value for x in _floats(key, item, depth + 1)]
    number = _plain_number(value)
    if number is None:
        try:
            number = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"store_metrics: {key!r} ({type(value).__name__}) is not a number or a "
                "sequence of numbers"
            ) from None
    return [float(number)]


def _step_of(row: Mapping[str, int | float]) -> int | None:
    """The row's step: its ``step`` (or its one ``.../step``) when an int."""
    step = row.get("step")
    if step is None:
        nested = [v for k, v in row.items() if k.endswith("/step")]
        step = nested[0] if len(nested) == 1 else None
    return step if isinstance(step, int) else None
