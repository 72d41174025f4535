"""Copying a training state to CPU memory for ``Checkpointer.save_async``,
reusing the previous save's buffers."""

from __future__ import annotations

import copy as _copy
from collections.abc import Callable, Mapping
from typing import Any


class Stager:
    """Copies state to CPU memory for :meth:`Checkpointer.save_async`.

    The copy shares nothing with the original, so training may change it at
    once. Each save reuses the buffers of the previous one (the same tensors
    in the same order, as a training loop saves them): no allocation, no page
    faults, and pinned memory for GPU tensors, copied without blocking and
    synchronized once. Views of one storage with the same shape and strides
    (tied weights) are copied once and stay shared in the file.
    """

    def __init__(self) -> None:
        self.buffers: list[Any] = []

    def copy(self, obj: Any, torch: Any) -> Any:
        self._torch = torch
        self._next: list[Any] = []
        self._memo: dict[tuple, Any] = {}
        self._cuda = False
        out = self._copy(obj)
        if self._cuda:
            torch.cuda.synchronize()
        self.buffers = self._next
        return out

    def _tensor(self, t: Any) -> Any:
        torch = self._torch
        t = t.detach()
        if t.layout != torch.strided or t.is_quantized or t.device.type not in ("cpu", "cuda"):
            return t.to("cpu", copy=True)
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride(), t.dtype)
        if key in self._memo:
            return self._memo[key]
        cuda = t.device.type == "cuda"
        i = len(self._next)
        buf = self.buffers[i] if i < len(self.buffers) else None
        if buf is None or buf.shape != t.shape or buf.dtype != t.dtype or buf.is_pinned() != cuda:
            buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=cuda)
        buf.copy_(t, non_blocking=cuda)
        self._cuda |= cuda
        self._next.append(buf)
        self._memo[key] = buf
        return buf

    def _copy(self, obj: Any) -> Any:
        return rebuild(obj, self._leaf)

    def _leaf(self, obj: Any) -> Any:
        if isinstance(obj, self._torch.Tensor):
            return self._tensor(obj)
        if obj is None or isinstance(obj, str | bytes | int | float | bool):
            return obj
        try:
            return _copy.deepcopy(obj)
        except Exception:
            return obj


def rebuild(obj: Any, leaf: Callable[[Any], Any]) -> Any:
    """``obj`` with its dicts (and other mappings), lists, tuples and named
    tuples rebuilt, and ``leaf`` applied to everything else in them."""
    if isinstance(obj, Mapping):
        items = [(k, rebuild(v, leaf)) for k, v in obj.items()]
        if type(obj) is dict:
            return dict(items)
        try:
            return type(obj)(items)
        except TypeError:
            return dict(items)
    if isinstance(obj, list):
        return [rebuild(v, leaf) for v in obj]
    if isinstance(obj, tuple):
        items = [rebuild(v, leaf) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else tuple(items)
    return leaf(obj)
