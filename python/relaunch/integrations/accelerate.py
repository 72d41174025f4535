"""relaunch for Hugging Face accelerate (1.x).

::

    from accelerate import Accelerator, DataLoaderConfiguration
    from relaunch.integrations.accelerate import Preemption, RelaunchTracker

    accelerator = Accelerator(
        log_with=[RelaunchTracker()],
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),
    )
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("my-project", config=vars(args))
    stop = Preemption(accelerator, "checkpoints")
    for epoch in stop.epochs(num_epochs):          # starts where the newest checkpoint stopped
        for batch in stop.batches(loader):         # that epoch's batches not yet trained
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            accelerator.log({"loss": loss.item()}, step=stop.step)
            if stop.reached():                     # the agreed stop step: state saved
                sys.exit(0)

Run it with ``relaunch run --nproc-per-node N train.py``.

- :class:`RelaunchTracker` is an accelerate ``GeneralTracker`` for
  ``Accelerator(log_with=...)``: ``accelerator.log`` and the config of
  ``init_trackers`` go to the job's run under ``relaunch run --server``
  (accelerate calls it on the main process only).
- :class:`Preemption` stops every rank at one agreed step (a stop signal
  reaching the launcher, every process or one rank) with accelerate's own
  checkpoint of that step (``accelerator.save_state``: model, optimizer,
  schedulers, RNG states, objects registered for checkpointing), committed
  atomically (written under a temporary name, renamed once every rank's
  part is on disk), so the launcher exits 75; and resumes from the newest
  complete one with ``accelerator.load_state``, skipping the batches that
  epoch already trained (``accelerator.skip_first_batches``). With the
  seedable sampler (``use_seedable_sampler=True``, not accelerate's
  default) the resumed epoch is exactly the rest of the interrupted one.
  :meth:`Preemption.reached` beats for hang detection.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

try:
    from accelerate.tracking import GeneralTracker
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "relaunch.integrations.accelerate needs accelerate: pip install accelerate"
    ) from e

from relaunch import _rng
from relaunch.integrations import _common

__all__ = ["Preemption", "RelaunchTracker"]

_STEP_PREFIX = "step_"


class RelaunchTracker(GeneralTracker):
    """accelerate's metrics and config in the job's relaunch run.

    The arguments are ``relaunch.init``'s (``project``, ``name``, ``server``,
    ``offline``, ...); ``init_trackers(project_name, ...)`` names the project
    when ``project`` is not given. Without a server (and without
    ``offline=True``) it logs nothing.
    """

    name = "relaunch"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, **init_kwargs: Any) -> None:
        super().__init__()
        self._kwargs = init_kwargs
        self._run = _common.LazyRun(init_kwargs)

    def start(self, project_name: str | None = None, **kwargs: Any) -> None:
        if project_name and "project" not in self._kwargs:
            self._kwargs["project"] = project_name
            self._run = _common.LazyRun(self._kwargs)

    @property
    def tracker(self) -> Any:
        """The ``relaunch.Run`` (None where nothing is logged)."""
        return self._run.get()

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        plain = _common.plain_config(values)
        if self._run.opened:
            run = self._run.get()
            if run is not None:
                run.event("config", "configuration stored after the run began", plain)
            return
        self._run.config.update(plain)
        self._run.get()

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        run = self._run.get()
        numbers = _common.numbers(values)
        if run is not None and numbers:
            run.log(numbers, step=step)

    def finish(self) -> None:
        # The run outlives this tracker: the launcher ends it with the job,
        # and the interpreter's exit ships what is left.
        run = self._run.get() if self._run.opened else None
        if run is not None:
            run.flush()


class Preemption:
    """One agreed stop step across ranks, with ``accelerator.save_state`` of
    it under ``checkpoint_dir/step_NNNNNNNN``, and the resume from there.

    Counts one step per :meth:`reached` call (call it once per batch, after
    the optimizer step); :attr:`epoch`, :attr:`batch` (batches of the epoch
    trained) and :attr:`step` are saved with every checkpoint (registered for
    checkpointing) and restored by the resume.
    """

    def __init__(self, accelerator: Any, checkpoint_dir: str | os.PathLike[str]) -> None:
        from relaunch import preemption

        config = getattr(accelerator, "project_configuration", None)
        if getattr(config, "automatic_checkpoint_naming", False):
            raise ValueError(
                "Preemption saves into checkpoint_dir itself, but this Accelerator's "
                "ProjectConfiguration has automatic_checkpoint_naming=True, which makes "
                "save_state ignore the directory it is given; turn it off"
            )
        dataloader_config = getattr(accelerator, "dataloader_config", None)
        if dataloader_config is not None and not getattr(
            dataloader_config, "use_seedable_sampler", True
        ):
            warnings.warn(
                "relaunch Preemption: without DataLoaderConfiguration(use_seedable_sampler="
                "True) accelerate shuffles a resumed epoch differently from the interrupted "
                "one, so a mid-epoch resume trains some samples twice and others not at all",
                stacklevel=2,
            )
        preemption.install()
        _common.destroy_process_group_at_exit()
        self.accelerator = accelerator
        self.dir = Path(checkpoint_dir)
        self.epoch = 0
        self.batch = 0
        self.step = 0
        self._resumed: Path | None = None
        self._resume_checked = False
        # The state each epoch's loader drew its base seed from, saved with
        # every checkpoint (accelerate saves the generators themselves).
        self._seeds = _rng.LoaderSeeds()
        self._replay_seed: Any = None
        accelerator.register_for_checkpointing(self)

    # -- what accelerate saves with every checkpoint -----------------------------

    def state_dict(self) -> dict[str, Any]:
        # Every rank's (a collective: accelerate calls this on every rank,
        # and the main process writes it).
        return {
            "epoch": self.epoch,
            "batch": self.batch,
            "step": self.step,
            "loader_rng": _rng.per_rank(self._seeds.state),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.batch = int(state["batch"])
        self.step = int(state["step"])
        if "loader_rng" in state:
            self._replay_seed = _rng.mine(state["loader_rng"], "DataLoader base seeds")
        else:
            warnings.warn(
                "relaunch Preemption: this checkpoint holds no DataLoader base seed (saved by "
                "an earlier relaunch): the resumed epoch draws one more random number than an "
                "uninterrupted run, so dropout masks and workers' seeds differ from it",
                stacklevel=2,
            )

    # -- resume -----------------------------------------------------------------

    def latest(self) -> Path | None:
        """The newest complete checkpoint in ``checkpoint_dir`` (one that was
        renamed to its final name; a save cut short never is)."""
        if not self.dir.is_dir():
            return None
        steps = []
        for entry in self.dir.iterdir():
            name = entry.name
            if entry.is_dir() and name.startswith(_STEP_PREFIX) and name[5:].isdigit():
                steps.append((int(name[5:]), entry))
        return max(steps)[1] if steps else None

    def resume(self) -> Path | None:
        """Loads the newest complete checkpoint (``accelerator.load_state``), if
        there is one, and returns it; :meth:`epochs` calls this first."""
        self._resume_checked = True
        latest = self.latest()
        if latest is not None:
            self.accelerator.load_state(str(latest))
            self._resumed = latest
        return latest

    def epochs(self, num_epochs: int) -> Iterator[int]:
        """The epochs left to train: from the resumed checkpoint's epoch (after
        loading it) to ``num_epochs - 1``."""
        if not self._resume_checked:
            self.resume()
        while self.epoch < num_epochs:
            yield self.epoch
            self.epoch += 1
            self.batch = 0

    def batches(self, dataloader: Iterable[Any]) -> Iterator[Any]:
        """``dataloader``'s batches of the current epoch not trained yet: its
        sampler set to the epoch, and after a resume mid-epoch the first
        batches skipped without being loaded (``skip_first_batches``)."""
        set_epoch = getattr(dataloader, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(self.epoch)
        resumed, self._replay_seed = self._replay_seed, None
        if resumed is not None:
            self._seeds.state = resumed
        if self._seeds.state is not None and (
            _persistent(dataloader) or (resumed is not None and self.batch > 0)
        ):
            # The uninterrupted run drew this base seed before the checkpoint
            # (mid-epoch; or once, at its first epoch, for workers that
            # persist): draw it from the same state, leaving the generators
            # as accelerate restored them.
            self._seeds.replay(self._seeds.state)
        if self.batch > 0:
            dataloader = self.accelerator.skip_first_batches(dataloader, self.batch)
        iterator = iter(dataloader)
        with _rng.observe_loaders(self._seeds.observer):
            try:  # creates the loader's iterator (accelerate's is lazy)
                first = next(iterator)
            except StopIteration:
                return
            finally:
                self._seeds.replay(None)  # a persistent loader made none
        yield first
        yield from iterator

    # -- the stop ---------------------------------------------------------------

    def reached(self) -> bool:
        """Counts a trained batch; True at the step every rank agreed to stop
        at, once accelerate's checkpoint of it is saved and committed (leave
        the loop and exit then; the launcher exits 75)."""
        from relaunch import preemption

        self.batch += 1
        self.step += 1
        # Inside a gradient accumulation cycle the optimizer did not step:
        # the stop waits for the cycle's end, so nothing accumulated is lost.
        boundary = bool(getattr(self.accelerator, "sync_gradients", True))
        if not preemption.reached(self.step, boundary=boundary):
            return False
        path = self._save()
        preemption.saved(path, self.step)
        return True

    def _save(self) -> Path:
        """``save_state`` of every rank into a temporary folder, renamed to
        ``step_NNNNNNNN`` by the main process once every rank's part is
        written: a kill during the save leaves no checkpoint with a final
        name that is not whole."""
        final = self.dir / f"{_STEP_PREFIX}{self.step:08d}"
        partial = self.dir / f".partial-{_STEP_PREFIX}{self.step:08d}"
        accelerator = self.accelerator
        if accelerator.is_main_process:
            shutil.rmtree(partial, ignore_errors=True)
            self.dir.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        accelerator.save_state(str(partial))
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            _fsync_tree(partial)
            if final.exists():
                shutil.rmtree(final)
            os.rename(partial, final)
            _fsync_dir(self.dir)
        accelerator.wait_for_everyone()
        return final


def _persistent(dataloader: Any) -> bool:
    """Whether ``dataloader`` (accelerate's, over a torch one) keeps its
    workers across epochs: its iterator, and base seed, are made once."""
    base = getattr(dataloader, "base_dataloader", dataloader)
    return bool(getattr(base, "persistent_workers", False)) and base.num_workers > 0


def _fsync_tree(root: Path) -> None:
    for dirpath, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
