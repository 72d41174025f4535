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

import base64
import binascii
import contextlib
import json
import random
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "LoaderSeeds",
    "LoopSeeds",
    "capture",
    "from_json",
    "mine",
    "observe_loaders",
    "per_rank",
    "restore",
    "to_json",
]


def capture() -> dict[str, Any]:
    """The state of every global generator that training draws from: torch
    CPU (once torch is imported), each CUDA device (once CUDA is
    initialized), numpy (once imported) and Python's ``random``. Picklable,
    and ``torch.load(weights_only=True)`` reads it back; :func:`to_json`
    writes it as JSON."""
    state: dict[str, Any] = {"python": _python_state()}
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
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
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
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


def to_json(state: dict[str, Any], loader: dict[str, Any] | None = None) -> str:
    """:func:`capture`'s ``state`` and ``loader`` (:meth:`LoopSeeds.at_save`)
    as JSON: no pickle, so reading a checkpoint's file runs no code."""
    out: dict[str, Any] = {"format": 1, "python": state["python"]}
    if "torch" in state:
        out["torch"] = _b64(state["torch"])
    if "cuda" in state:
        out["cuda"] = [_b64(s) for s in state["cuda"]]
    if "numpy" in state:
        out["numpy"] = state["numpy"]
    if loader is not None:
        drawn = loader["drawn"]
        out["loader"] = {"kind": loader["kind"], "drawn": None if drawn is None else _b64(drawn)}
    return json.dumps(out, separators=(",", ":"))


def from_json(text: str, where: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``(state, loader)`` from :func:`to_json`'s text; ValueError naming
    ``where`` and what is wrong when it is not that. Torch's states are read
    only in a process that imported torch (one that trains with it); a
    process without it (a tool that looks at checkpoints) gets neither them
    nor ``loader``."""
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != 1:
            raise ValueError("not a relaunch random-state file of format 1")
        version, internal, gauss = data["python"]
        if not (isinstance(version, int) and isinstance(internal, list)):
            raise ValueError("its Python random state is malformed")
        state: dict[str, Any] = {"python": [version, internal, gauss]}
        loader = data.get("loader")
        if "torch" not in sys.modules:
            loader = None
        elif "torch" in data:
            state["torch"] = _tensor(data["torch"])
            if "cuda" in data:
                state["cuda"] = [_tensor(s) for s in data["cuda"]]
        if loader is not None:
            kind, drawn = loader["kind"], loader["drawn"]
            if not isinstance(kind, list):
                raise ValueError("its loader's kind is malformed")
            loader = {"kind": kind, "drawn": None if drawn is None else _tensor(drawn)}
        if "numpy" in data:
            kind, keys, pos, has_gauss, cached = data["numpy"]
            if kind != "MT19937" or not isinstance(keys, list) or len(keys) != 624:
                raise ValueError("its numpy random state is malformed")
            state["numpy"] = [kind, keys, pos, has_gauss, cached]
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise ValueError(
            f"{where} is not a readable random-state file ({e}); remove it to resume "
            "without the saved random generators"
        ) from None
    return state, loader


def _tensor(text: Any) -> Any:
    import torch

    if not isinstance(text, str):
        raise ValueError("a torch random state is not a base64 string")
    raw = base64.b64decode(text, validate=True)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def _b64(tensor: Any) -> str:
    return base64.b64encode(tensor.numpy().tobytes()).decode("ascii")


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


class LoopSeeds:
    """For a loop of its own (``relaunch.Checkpointer``): which DataLoader
    was last iterated at a save, and where the resume's iterator of it
    draws its base seed from.

    Every creation of an iterator of a loader without a generator of its
    own is recorded: the loader's kind (sampler and dataset types, dataset
    length, batch size, workers) and the state its base seed was drawn
    from. :meth:`at_save` gives the kind of the newest, and that state while
    the iterator has batches left (or its loader keeps persistent workers,
    whose seed an uninterrupted run draws once): the save falls inside its
    epoch.

    After :meth:`resume`, the next creation of an iterator of a loader of
    that kind first puts the saved generators back (undoing the draws made
    since, by a model's initialization or another loader), draws its seed
    from the saved state if the save fell inside an epoch (else from the
    saved generators, as the uninterrupted run did at the next epoch), and
    leaves the generators as saved. An iterator of that kind with no
    batches (the rest of an epoch saved at its end, which a resumed loop
    iterates before the next) draws nothing meanwhile. The first save after
    a resume ends the wait.
    """

    def __init__(self) -> None:
        # The newest iterator: its loader and itself (weakly), the loader's
        # kind, the state its seed was drawn from, and how many batches it
        # was to yield (None: unknown), counted when it was made (a
        # sampler's length may shrink as an epoch goes).
        self._last: tuple[Any, Any, list[Any], Any, int | None] | None = None
        self._resume: tuple[dict[str, Any], dict[str, Any]] | None = None

    def resume(self, state: dict[str, Any], loader: dict[str, Any] | None) -> None:
        restore(state)
        self._resume = None if loader is None else (state, loader)

    def disarm(self) -> None:
        self._resume = None

    def at_save(self) -> dict[str, Any] | None:
        if self._last is None:
            return None
        loader, iterator = self._last[0](), self._last[1]()
        if loader is None:
            return None
        kind, drawn, batches = self._last[2], self._last[3], self._last[4]
        if getattr(loader, "persistent_workers", False) and loader.num_workers > 0:
            return {"kind": kind, "drawn": drawn}
        if iterator is None:
            left = False
        elif batches is None:  # an IterableDataset: no length to tell
            left = True
        else:
            left = getattr(iterator, "_num_yielded", 0) < batches
        return {"kind": kind, "drawn": drawn if left else None}

    def observer(self, loader: Any, create: Callable[[], Any]) -> Any:
        import weakref

        import torch

        if getattr(loader, "generator", None) is not None:
            return create()  # the draw is from the loader's own generator
        kind = _kind(loader)
        replay = None
        if self._resume is not None and self._resume[1]["kind"] == kind and _empty(loader):
            # The rest of an epoch saved at its end: a loop resumed there
            # iterates it (no batches) before the next epoch, which is the
            # one that drew the seed in the uninterrupted run.
            now = torch.get_rng_state()
            try:
                return create()
            finally:
                torch.set_rng_state(now)
        if self._resume is not None and self._resume[1]["kind"] == kind:
            (state, saved), self._resume = self._resume, None
            restore(state)
            replay = saved["drawn"]
        if replay is None:
            drawn = torch.get_rng_state()
            iterator = create()
        else:
            now, drawn = torch.get_rng_state(), replay
            torch.set_rng_state(replay)
            try:
                iterator = create()
            finally:
                torch.set_rng_state(now)
        try:
            batches: int | None = len(iterator)
        except TypeError:
            batches = None
        try:
            self._last = (weakref.ref(loader), weakref.ref(iterator), kind, drawn, batches)
        except TypeError:
            self._last = None
        return iterator


def _empty(loader: Any) -> bool:
    try:
        return len(loader) == 0
    except TypeError:
        return False


def _kind(loader: Any) -> list[Any]:
    """What tells a loader from the others of a script, across restarts."""
    dataset = getattr(loader, "dataset", None)
    try:
        length = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        length = None
    sampler = getattr(loader, "sampler", None)
    return [
        type(sampler).__qualname__,
        type(dataset).__qualname__,
        length,
        getattr(loader, "batch_size", None),
        getattr(loader, "num_workers", 0),
    ]


_loop_seeds: LoopSeeds | None = None


def loop_seeds() -> LoopSeeds | None:
    """The process's :class:`LoopSeeds`, watching every DataLoader iterator
    from the first call on (once torch is imported; None before)."""
    global _loop_seeds
    if _loop_seeds is None and "torch" in sys.modules:
        seeds = LoopSeeds()
        _install()
        _observers.insert(0, seeds.observer)  # innermost: sees what outer observers set
        _loop_seeds = seeds
    return _loop_seeds
