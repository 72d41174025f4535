"""``ml_logger.helpers``: ml-logger's helpers for reading what it wrote and
preparing data, working on local files and streams (nothing here talks to a
server). The submodules are ml-logger's: ``color_helpers`` (``Color``,
``percent``), ``print_utils`` (``PrintHelper``), ``func_helpers``
(``assign``, ``dot_flatten``), ``default_set``, ``data_helpers``,
``file_helpers``.

The pickle readers unpickle, which runs whatever code the pickle names:
give them only files you trust (the logger's ``load_pkl``, which reads from
a server, asks for consent; these read the local file you name)."""

from __future__ import annotations

import json
import pickle
import random
from collections.abc import Iterable, Iterator
from typing import IO

__all__ = [
    "load_from_file",
    "load_from_jsonl_file",
    "load_from_pickle",
    "load_from_pickle_file",
    "load_from_torch_file",
    "load_pickle_as_dataframe",
    "regularize_for_json",
    "sample",
]


class _Missing:
    """Stands in for a class that a pickle names but this interpreter cannot
    import: it keeps what it was given, so the rest of the record loads."""

    _where = "?"

    def __init__(self, *args: object, **kwargs: object) -> None:
        self.args, self.kwargs = args, kwargs
        self.items: dict[object, object] = {}

    def __setstate__(self, state: object) -> None:
        self.state = state

    def __setitem__(self, key: object, value: object) -> None:
        self.items[key] = value

    def __getitem__(self, key: object) -> object:
        return self.items[key]

    def __call__(self, *args: object, **kwargs: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"<class '{self._where}'>"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> object:
        try:
            return super().find_class(module, name)
        except (ImportError, AttributeError):
            return type(name, (_Missing,), {"_where": f"{module}.{name}"})


def load_from_pickle_file(file: IO[bytes], **kwargs: object) -> Iterator[object]:
    """Each record of a file of pickles appended one after another (as
    ml-logger's ``log_data``/``save_pkl(append=True)`` write them), in order;
    a class that cannot be imported loads as a placeholder."""
    while True:
        try:
            yield _Unpickler(file, **kwargs).load()  # type: ignore[arg-type]
        except EOFError:
            return


def load_from_pickle(path: str = "parameters.pkl", **kwargs: object) -> Iterator[object]:
    """:func:`load_from_pickle_file` of the local file ``path``."""
    with open(path, "rb") as f:
        yield from load_from_pickle_file(f, **kwargs)


def load_from_torch_file(file: IO[bytes], **kwargs: object) -> Iterator[object]:
    """Each ``torch.save`` record of a file, in order (``torch.load``'s keyword arguments)."""
    import torch

    while True:
        try:
            yield torch.load(file, **kwargs)
        except EOFError:
            return


def load_from_jsonl_file(file: IO, **kwargs: object) -> Iterator[object]:
    """Each JSON line of a text or binary stream; blank lines and ``//`` comments are skipped."""
    for line in file:
        text = line.decode() if isinstance(line, bytes) else line
        text = text.strip()
        if text and not text.startswith("//"):
            yield json.loads(text)


def load_from_file(path: str) -> Iterator[bytes]:
    """The bytes of the local file ``path`` (one block)."""
    with open(path, "rb") as f:
        yield f.read()


def regularize_for_json(obj: object, _depth: int = 0) -> object:
    """``obj`` as JSON data: dicts, numbers and strings as they are, arrays
    and sequences as lists, functions as their repr, other objects as the
    dict of their attributes (else their repr); nesting past 32 levels is
    cut off with ``{"error": "max recursion limit"}``."""
    import types
    from collections.abc import Mapping, Sequence

    if _depth > 32:
        return {"error": "max recursion limit"}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, Mapping):
        return {str(k): regularize_for_json(v, _depth + 1) for k, v in obj.items()}
    tolist = getattr(obj, "tolist", None)
    if callable(tolist) and getattr(obj, "shape", None) is not None:
        return tolist()
    if isinstance(obj, Sequence | set | frozenset):
        return [regularize_for_json(v, _depth + 1) for v in obj]
    if isinstance(obj, types.FunctionType | types.BuiltinFunctionType | type):
        return repr(obj)
    try:
        attributes = vars(obj)
    except TypeError:
        return repr(obj)
    return {str(k): regularize_for_json(v, _depth + 1) for k, v in attributes.items()}


def sample(stream: Iterable[object], k: int) -> Iterator[object]:
    """``k`` items of ``stream`` chosen uniformly (reservoir sampling), in stream order."""
    reservoir: list[tuple[int, object]] = []
    for count, item in enumerate(stream):
        if count < k:
            reservoir.append((count, item))
        else:
            at = random.randint(0, count)
            if at < k:
                reservoir[at] = (count, item)
    for _, item in sorted(reservoir, key=lambda pair: pair[0]):
        yield item


def load_pickle_as_dataframe(path: str = "data.pkl", k: int | None = None):
    """A pandas DataFrame of the records of a local pickle file (``k``: a sample of them)."""
    import pandas

    records = load_from_pickle(path)
    return pandas.DataFrame(list(sample(records, k) if k else records))
