"""``ml_logger.helpers.data_helpers``: ``Stream``, the last values of a series."""

from __future__ import annotations

import math
from collections import deque


class Stream:
    """The last ``len`` values appended; ``mean``/``max``/``min`` are None while it is empty."""

    def __init__(self, len: int = 100) -> None:
        self.d: deque[float] = deque(maxlen=len)

    def append(self, d: float) -> None:
        self.d.append(d)

    @property
    def latest(self) -> float:
        return self.d[-1]

    @property
    def mean(self) -> float | None:
        return math.fsum(self.d) / len(self.d) if self.d else None

    @property
    def max(self) -> float | None:
        return max(self.d) if self.d else None

    @property
    def min(self) -> float | None:
        return min(self.d) if self.d else None
