"""Values: what a script logs, as relaunch takes it. Params become JSON data
(the way ml-logger's ``metrify`` kept them) and merge as ml-logger merged
them; metrics become numbers, naming the key that is not one."""

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


def _number(key: str, value: object) -> int | float:
    """A metric value as relaunch logs it; raises naming the key otherwise."""
    if value is None:
        return math.nan
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str | bytes | bytearray):
        raise TypeError(
            f"metric {key!r} is {type(value).__name__} {value!r:.60}, not a number: relaunch "
            "metrics are numbers; put text in log_params() or log_text()"
        )
    if isinstance(value, numbers.Integral):
        return int(value)
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError, RuntimeError):
        raise TypeError(
            f"metric {key!r} ({type(value).__name__}) is not one number; log a Python number, a "
            "numpy scalar or a one-element tensor (loss.item()), or store_metrics() many values "
            "and log their summary"
        ) from None


def _metric_row(values: Mapping, prefix: str = "") -> dict[str, int | float]:
    row: dict[str, int | float] = {}
    for k, v in values.items():
        if not isinstance(k, str):
            raise TypeError(f"metric names must be str, not {type(k).__name__}: {k!r}")
        key = prefix + k
        if isinstance(v, Mapping):
            row.update(_metric_row(v, key + "/"))
        else:
            row[key] = _number(key, v)
    return row


def _floats(key: str, value: object, depth: int = 0) -> list[float]:
    """ml-logger's ``flatten``: nested sequences and arrays to floats, None as NaN."""
    if depth > 32:
        raise ValueError(f"{key!r}: values nested deeper than 32 levels")
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
    return [float(_number(key, value))]


def _step_of(row: Mapping[str, int | float]) -> int | None:
    step = row.get("step")
    if step is None:
        nested = [v for k, v in row.items() if k.endswith("/step")]
        step = nested[0] if len(nested) == 1 else None
    return step if isinstance(step, int) else None
