"""The random generators that training draws from, as one value to save
with a checkpoint and put back on resume, and the DataLoader's base seed.

An exact resume needs every generator that the next steps draw from where
the uninterrupted run had it: torch's CPU generator (dropout, random
augmentations, ``RandomSampler``), each CUDA device's, numpy's global one and
Python's ``random``. :func:`capture` takes them, :func:`restore` puts them
back.

One draw escapes a checkpoint of the step: creating a DataLoader's iterator
draws its base seed (``torch.empty((), dtype=torch.int64).random_()``, the
seed of every worker's ``torch``/``random`` generators) from torch's CPU
generator. The uninterrupted run drew it at the start of the epoch (or, with
``persistent_workers``, of the first one); a resumed run creates its
iterator again, so the draw comes from the step's state, shifts everything
after it, and gives the workers other seeds. :func:`observe_loaders` wraps
every iterator's creation while a caller watches: it sees the state the draw
came from (saved with the checkpoint) and can have a creation draw from a
saved state again, leaving the generator as it was (:class:`LoaderSeeds`).
The wrap is of ``torch.utils.data.DataLoader._get_iterator``, the one place
where ``__iter__`` creates an iterator (torch 1.7 to 2.15 at least).

Limits: a generator of the script's own (``torch.Generator()`` passed to a
sampler or a ``DataLoader(generator=...)``) is the script's to save; draws
that a DataLoader without workers makes in the training process while it
fetches a batch ahead (a dataset's random augmentation) are not replayed.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["LoaderSeeds", "capture", "mine", "observe_loaders", "per_rank", "restore"]


def capture() -> dict[str, Any]:
    """The state of every global generator that training draws from: torch
    CPU, each CUDA device (once CUDA is initialized), numpy (once imported)
    and Python's ``random``. Picklable, and ``torch.load(weights_only=True)``
    reads it back."""
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": _python_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state()
        state["numpy"] = [kind, keys.tolist(), pos, has_gauss, cached]
    return state


def restore(state: dict[str, Any]) -> None:
    """Puts back what :func:`capture` took. A generator the state does not
    hold (numpy saved before it was imported, CUDA on a CPU-only resume) is
    left alone; one the state holds but this process cannot have (CUDA on a
    machine without it) raises ValueError naming it."""
    import torch

    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state:
        if not torch.cuda.is_available():
            raise ValueError(
                "the checkpoint holds CUDA random states, but CUDA is not available here: "
                "resume on a machine with as many GPUs, or without the saved RNG state"
            )
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy

        kind, keys, pos, has_gauss, cached = state["numpy"]
        keys = numpy.array(keys, dtype=numpy.uint32)
        numpy.random.set_state((kind, keys, pos, has_gauss, cached))


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def per_rank(value: Any) -> list[Any]:
    """``value`` of every rank of the default process group, in rank order
    (a collective: every rank calls it), or ``[value]`` without a group.
    Frameworks write a checkpoint's shared part from rank 0 alone, and each
    rank's generators differ (seeded by rank, or drawn differently), so the
    checkpoint holds them all."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [value]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def mine(values: Any, what: str) -> Any:
    """This rank's entry of what :func:`per_rank` gave when the checkpoint
    was saved; None, said once, when the world size differs (a resume on
    another number of ranks cannot replay the ranks' generators)."""
    import torch.distributed as dist

    if not isinstance(values, list) or not values:
        return None
    grouped = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if grouped else 1
    rank = dist.get_rank() if grouped else 0
    if len(values) != world:
        if rank == 0:
            warnings.warn(
                f"relaunch: the checkpoint holds the {what} of {len(values)} rank(s), this job "
                f"has {world}: they are not restored, so the resumed steps draw other random "
                "numbers than an uninterrupted run would (resume on as many ranks for an "
                "exact resume)",
                stacklevel=3,
            )
        return None
    return values[rank]


# -- the DataLoader's base seed --------------------------------------------------

# Who watches iterator creations, innermost last: each gets the loader and a
# function that creates the iterator, and returns the iterator.
_Observer = Callable[[Any, Callable[[], Any]], Any]
_observers: list[_Observer] = []
_install_lock = threading.Lock()


def _install() -> None:
    from torch.utils.data import DataLoader

    with _install_lock:
        original = DataLoader._get_iterator
        if getattr(original, "_relaunch_observed", False):
            return

        def _get_iterator(self: DataLoader) -> Any:
            create = lambda: original(self)  # noqa: E731
            for observer in list(_observers):
                create = (lambda o, inner: lambda: o(self, inner))(observer, create)
            return create()

        _get_iterator._relaunch_observed = True  # type: ignore[attr-defined]
        DataLoader._get_iterator = _get_iterator  # type: ignore[method-assign]


@contextlib.contextmanager
def observe_loaders(observer: _Observer) -> Iterator[None]:
    """Within the block, ``observer(loader, create)`` is called for every
    DataLoader iterator created in this process and returns the iterator
    (``create()`` makes it)."""
    _install()
    _observers.append(observer)
    try:
        yield
    finally:
        _observers.remove(observer)


class LoaderSeeds:
    """The state that a training DataLoader's base seed was drawn from, and
    its replay on resume.

    ``seeds.observer`` is an observer for :func:`observe_loaders`; ``wants``
    says which loaders it concerns (the training loader). Each creation of
    such a loader's iterator records :attr:`state`, the torch CPU state the
    draw came from, to save with a checkpoint. After :meth:`replay` of a
    saved one, the next creation draws from that state instead, and the
    generator is left as it was before the creation, as if no draw had been
    made; the workers get the uninterrupted run's seeds.
    """

    def __init__(self, wants: Callable[[Any], bool] = lambda loader: True) -> None:
        self._wants = wants
        self.state: Any = None
        self._replay: Any = None
        self._replay_if: Callable[[Any], bool] = lambda loader: True

    def replay(self, state: Any, only_if: Callable[[Any], bool] = lambda loader: True) -> None:
        """The next creation (of a loader that ``only_if`` accepts; other
        ones draw as usual) draws from ``state``, a saved :attr:`state`."""
        self._replay = state
        self._replay_if = only_if

    @property
    def replaying(self) -> bool:
        return self._replay is not None

    def observer(self, loader: Any, create: Callable[[], Any]) -> Any:
        if getattr(loader, "generator", None) is not None or not self._wants(loader):
            return create()  # the draw is from the loader's own generator
        import torch

        replay, self._replay = self._replay, None
        if replay is not None and not self._replay_if(loader):
            replay = None
        if replay is None:
            self.state = torch.get_rng_state()
            return create()
        now = torch.get_rng_state()
        torch.set_rng_state(replay)
        try:
            return create()
        finally:
            torch.set_rng_state(now)
            self.state = replay
