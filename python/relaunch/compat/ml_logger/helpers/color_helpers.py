"""``ml_logger.helpers.color_helpers``: ``Color``, a value shown in colour in
the printed metrics table (the value itself is what is logged), and the
formatters ml-logger offered for it (``percent``, ``ms``, ``sec``) with
colour shorthands (``red(v)``, ``green(v)``, ...).

``Color(0.85, "yellow", percent)`` logged as a metric records 0.85 and
prints ``85.00%`` in yellow; a ``Color`` around a string is text (see the
package doc, "metrics")."""

from __future__ import annotations

from collections.abc import Callable

_ANSI = {
    "black": 30,
    "red": 31,
    "green": 32,
    "yellow": 33,
    "brown": 33,  # what terminals showed for ml-logger's "brown"
    "blue": 34,
    "magenta": 35,
    "cyan": 36,
    "white": 37,
    "grey": 90,
    "gray": 90,
    "dark_grey": 90,
    "light_red": 91,
    "light_green": 92,
    "light_yellow": 93,
    "light_blue": 94,
    "light_magenta": 95,
    "light_cyan": 96,
    "light_grey": 97,
}
"""Colour names and their ANSI foreground codes (termcolor's names)."""

_PLAIN = (None, "default")


def colored(text: str, color: str | None) -> str:
    """``text`` in ``color`` for a terminal (unchanged for None or ``default``)."""
    if color in _PLAIN:
        return text
    return f"\033[{_ANSI[color]}m{text}\033[0m"


def _check_color(color: object) -> None:
    if color not in _PLAIN and color not in _ANSI:
        raise ValueError(f"color {color!r} is not one of default, {', '.join(_ANSI)}")


class Color:
    """A value with a colour (and a formatter) for the printed table.

    ``value`` is what is logged; ``formatter(value)`` is what is shown
    (``str(color)``, uncoloured), ``format(color, spec)`` formats that in
    the colour.
    """

    def __init__(
        self,
        value: object,
        color: str | None = None,
        formatter: Callable[[object], object] | None = lambda v: v,
    ) -> None:
        _check_color(color)
        if formatter is not None and not callable(formatter):
            raise TypeError(f"formatter must be callable or None, not {formatter!r}")
        self.value = value
        self.color = color
        self.formatter = formatter

    def _shown(self) -> object:
        return self.formatter(self.value) if callable(self.formatter) else self.value

    def __str__(self) -> str:
        return str(self._shown())

    def __len__(self) -> int:
        return len(str(self.value))

    def __format__(self, format_spec: str) -> str:
        return colored(format(self._shown(), format_spec), self.color)

    def __repr__(self) -> str:
        return f"Color({self.value!r}, {self.color!r})"


def percent(v: float) -> str:
    """A fraction as a percentage with two decimals: 0.8512 is ``85.12%``."""
    return f"{v:.2%}"


def ms(v: float) -> str:
    """Seconds as milliseconds: 0.0123 is ``12.3ms``."""
    return f"{v * 1000:.1f}ms"


def sec(v: float) -> str:
    """Seconds with three decimals: ``1.500s``."""
    return f"{v:.3f}s"


def default(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "default", *args, **kwargs)


def red(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "red", *args, **kwargs)


def green(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "green", *args, **kwargs)


def gray(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "gray", *args, **kwargs)


grey = gray


def yellow(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "yellow", *args, **kwargs)


def brown(value: object, *args: object, **kwargs: object) -> Color:
    return Color(value, "brown", *args, **kwargs)
