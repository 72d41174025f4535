"""``ml_logger.helpers.default_set``: ``DefaultSet``."""

from __future__ import annotations


class DefaultSet(set):
    """A set that ``reset()`` fills with the items it was made with (and
    nothing else). It starts empty, as ml-logger's did."""

    def __init__(self, *items: object) -> None:
        super().__init__()
        self._default_set = items

    def reset(self) -> None:
        self.clear()
        self.update(self._default_set)
