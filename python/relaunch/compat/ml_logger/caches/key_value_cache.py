"""``ml_logger.caches.key_value_cache``: a dict whose newer values replace
older ones, emptied by ``pop_all``."""

from __future__ import annotations

from collections.abc import Mapping


class KeyValueCache:
    """Key-value pairs kept until ``pop_all`` or ``clear``; a value stored
    again under its key replaces the older one."""

    def __init__(self) -> None:
        self.data: dict = {}

    def peek(self) -> dict:
        return self.data

    def __bool__(self) -> bool:
        return bool(self.data)

    def update(self, key_values: Mapping | None = None, **kwargs: object) -> None:
        # ml-logger appended keyword values to a list that was never made
        # (an AttributeError); here both forms replace, as the class says.
        if key_values is not None:
            self.data.update(key_values)
        self.data.update(kwargs)

    def pop_all(self) -> dict:
        data, self.data = self.data, {}
        return data

    def clear(self) -> None:
        self.data = {}
