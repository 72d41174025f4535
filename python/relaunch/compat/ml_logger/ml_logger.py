"""``ml_logger.ml_logger``: the module ml-logger kept its logger in, for
imports such as ``from ml_logger.ml_logger import Color, metrify``."""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence

from . import logger
from ._logger import METRICS_FILE, PARAMS_FILE, ML_Logger
from ._names import LOGGER_USER, PREFIX, ROOT, USER, now, pJoin, utcnow
from .helpers.color_helpers import Color
from .helpers.print_utils import PrintHelper

__all__ = [
    "LOGGER_USER",
    "METRICS_FILE",
    "PARAMS_FILE",
    "PREFIX",
    "ROOT",
    "USER",
    "Color",
    "ML_Logger",
    "PrintHelper",
    "interpolate",
    "logger",
    "metrify",
    "now",
    "pJoin",
    "utcnow",
]


def metrify(data: object) -> object:
    """``data`` as plain data: an array or tensor with dimensions as a
    (nested) list, a numpy scalar or 0-d array as an int, float or bool;
    sequences, numbers, None, dicts and strings as they are; anything else
    as its ``str``."""
    shape = getattr(data, "shape", None)
    if shape is not None and len(shape) > 0 and callable(getattr(data, "tolist", None)):
        return data.tolist()  # type: ignore[attr-defined]
    if data is None or isinstance(data, Sequence | numbers.Number | dict | bool):
        return data
    item = getattr(data, "item", None)
    if getattr(data, "dtype", None) is None or not callable(item):
        return str(data)
    try:
        value = item()
    except (TypeError, ValueError, RuntimeError):
        return str(data)
    return value if isinstance(value, bool | int | float) else str(data)


def interpolate(path: object = None) -> str | None:
    """A prefix part as ml-logger read it: ``$NAME`` is that variable's value (None when unset)."""
    if path is None:
        return None
    path = str(path)
    if path.startswith("$"):
        return os.environ.get(path[1:])
    return path
