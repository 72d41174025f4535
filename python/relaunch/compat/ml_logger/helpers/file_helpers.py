"""``ml_logger.helpers.file_helpers``: ``CwdContext``."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def CwdContext(path: str | os.PathLike[str]) -> Iterator[None]:
    """A context in the working directory ``path``; the old one comes back after it."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)
