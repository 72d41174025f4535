"""The checkpointer's arguments and environment, checked: each bad value
gets an error that says what was wrong and what to write instead."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import Any

DEFAULT_TIMEOUT = 1800.0
"""Seconds a rank waits for the others at each step of a save (torch's default
process-group timeout): writing a large checkpoint can take minutes."""

# Environment the launchers set (crates/relaunch-launch/src/env.rs).
ENV_RUN_ID = ("RELAUNCH_RUN_ID", "TORCHELASTIC_RUN_ID")
ENV_ATTEMPT = ("RELAUNCH_ATTEMPT", "TORCHELASTIC_RESTART_COUNT")


def positive(value: object, name: str, allow_none: bool = True) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        none = " or None" if allow_none else ""
        raise ValueError(f"{name} must be an int >= 1{none}, got {value!r}")
    return value


def check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int):
        raise TypeError(f"step must be an int, not {type(step).__name__}: {step!r}")
    if step < 0:
        raise ValueError(f"step must be >= 0, got {step}")
    return step


def keep_best_spec(spec: object) -> tuple[str, str, int] | None:
    """``(metric, "min"|"max")`` or ``(metric, "min"|"max", count)``."""
    if spec is None:
        return None
    usage = (
        'keep_best must be (metric, "min" or "max") or (metric, "min" or "max", count), '
        f'e.g. ("val_loss", "min"); got {spec!r}'
    )
    if not isinstance(spec, tuple | list) or len(spec) not in (2, 3):
        raise ValueError(usage)
    metric, mode = spec[0], spec[1]
    count = spec[2] if len(spec) == 3 else 1
    if not isinstance(metric, str) or not metric or mode not in ("min", "max"):
        raise ValueError(usage)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(usage)
    return metric, mode, count


def json_dict(value: object, name: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, not {type(value).__name__}")
    out = {str(k): v for k, v in value.items()}
    try:
        json.dumps(out)
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{name} must be JSON-serializable (numbers, strings, lists, dicts): {e}"
        ) from None
    return out


def env(names: Iterable[str]) -> str | None:
    for name in names:
        value = os.environ.get(name)
        if value:
            return value
    return None


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if not value:
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None
