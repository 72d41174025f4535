"""``ml_logger.helpers.func_helpers``: merging and dot-flattening nested dicts,
as ml-logger reads params (``Args.lr``)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping


def assign(d1: dict, d2: Mapping | None) -> dict:
    """Merges ``d2`` into ``d1`` (in place, and returns it): where both hold
    a dict they merge, anything else in ``d2`` replaces."""
    if not d2:
        return d1
    for k, v in d2.items():
        if isinstance(d1.get(k), dict) and isinstance(v, Mapping):
            d1[k] = assign(d1[k], v)
        else:
            d1[k] = v
    return d1


def idot_keys(d: Mapping, strict: bool = True) -> Iterator[str]:
    """The dotted keys of the leaves (``strict=False``: of the dicts too)."""
    for k, v in d.items():
        if isinstance(v, dict):
            if not strict:
                yield k
            for below in idot_keys(v, strict):
                yield f"{k}.{below}"
        else:
            yield k


def dot_keys(d: Mapping, strict: bool = True) -> list[str]:
    return list(idot_keys(d, strict))


def idot_flatten(d: Mapping) -> Iterator[tuple[str, object]]:
    for k, v in d.items():
        if isinstance(v, dict):
            for below, leaf in idot_flatten(v):
                yield f"{k}.{below}", leaf
        else:
            yield k, v


def dot_flatten(d: Mapping) -> dict[str, object]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``, in order."""
    return dict(idot_flatten(d))


def dot_unflatten(d: Mapping[str, object]) -> dict:
    """The inverse of :func:`dot_flatten`."""
    root: dict = {}
    for k, v in d.items():
        *parents, last = k.split(".")
        at = root
        for p in parents:
            at = at.setdefault(p, {})
        at[last] = v
    return root
