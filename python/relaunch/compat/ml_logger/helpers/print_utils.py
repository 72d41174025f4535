"""``ml_logger.helpers.print_utils``: ``PrintHelper``, the tables ml-logger
printed: one row of key/value pairs (``format_tabular``) and columns of
values (``format_row_table``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import zip_longest


def _numpy_text(v: object) -> str:
    import numpy as np

    if isinstance(v, np.ndarray):
        return np.array2string(v, precision=3, separator=",", suppress_small=True)
    return str(v)


DEFAULT_FORMATS: dict[object, Callable[[object], str]] = {
    "numpy": _numpy_text,
    float: lambda v: format(v, ".3f"),
    int: str,
}
"""Formatters by type, or by the name of the module a type comes from."""


def _is_sequence(d: object) -> bool:
    if isinstance(d, str):
        return False
    shape = getattr(d, "shape", None)
    return isinstance(d, Sequence) or (shape is not None and len(shape) > 0)


class PrintHelper:
    def __init__(self, formatters: Mapping[object, Callable[[object], str]] | None = None):
        self.formatters = dict(DEFAULT_FORMATS)
        if formatters:
            self.formatters.update(formatters)

    def to_string(self, v: object) -> str:
        kind = type(v)
        if kind.__module__ in self.formatters:
            return self.formatters[kind.__module__](v)
        if kind in self.formatters:
            return self.formatters[kind](v)
        return "NA" if v is None else str(v)

    def format_tabular(
        self,
        data: Mapping[str, object],
        do_not_print_list: Sequence[str] = (),
        min_key_width: int = 20,
        min_value_width: int = 20,
    ) -> str | None:
        """The key/value pairs as a two-column table, keys' ``_`` as spaces (None when empty)."""
        cells = [
            (k.replace("_", " "), self.to_string(v))
            for k, v in data.items()
            if k not in do_not_print_list
        ]
        if not cells:
            return None
        kw = max([min_key_width, *(len(k) for k, _ in cells)])
        vw = max([min_value_width, *(len(v) for _, v in cells)])
        rows = [f"│{k:^{kw}}│{v:^{vw}}│\n" for k, v in cells]
        between = f"├{'─' * kw}┼{'─' * vw}┤\n"
        return f"╒{'═' * kw}╤{'═' * vw}╕\n" + between.join(rows) + f"╘{'═' * kw}╧{'═' * vw}╛\n"

    def format_row_table(
        self,
        data: Mapping[str, object],
        max_rows: int | None = None,
        do_not_print_list: Sequence[str] = (),
        min_column_width: int = 5,
    ) -> str:
        """Each key a column of its values (the first ``max_rows``)."""
        keys = [k for k in data if k not in do_not_print_list]
        columns = [
            list(data[k])[:max_rows] if _is_sequence(data[k]) else [data[k]]  # type: ignore[call-overload]
            for k in keys
        ]
        widths = [
            max([min_column_width, len(k), *(len(self.to_string(v)) for v in column)])
            for k, column in zip(keys, columns, strict=True)
        ]
        lines = ["|".join(f"{k.replace('-', ' '):^{w}}" for k, w in zip(keys, widths, strict=True))]
        lines.append("┿".join("━" * w for w in widths))
        for row in zip_longest(*columns, fillvalue=""):
            lines.append(
                "|".join(f"{self.to_string(v):^{w}}" for v, w in zip(row, widths, strict=True))
            )
        return "\n".join(lines) + "\n"
