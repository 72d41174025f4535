"""relaunch for PyTorch Lightning (``lightning.pytorch``, 2.x).

::

    from relaunch.integrations.lightning import RelaunchCallback, RelaunchLogger

    trainer = L.Trainer(callbacks=[RelaunchCallback()], logger=RelaunchLogger(), ...)
    trainer.fit(model, datamodule, ckpt_path="last")

Run it with ``relaunch run --nproc-per-node N train.py``. What it gives:

- **One agreed stop step.** A stop signal that reaches any process of the
  job (the launcher, every process, or one rank) makes every rank stop after
  the same training batch: :mod:`relaunch.preemption` owns the stop signals
  while ``fit()`` trains (Lightning's own SIGTERM handler, which stops each
  rank by itself, never fires a callback, and broadcasts inside the handler
  so a SIGTERM to one rank deadlocks, is replaced from ``on_train_start``
  and Lightning puts its snapshot back at teardown).
- **A checkpoint of that step**, written by Lightning itself
  (``trainer.save_checkpoint``, every rank taking part, rank 0 writing) as
  the first ``ModelCheckpoint``'s ``last`` checkpoint, so
  ``fit(ckpt_path="last")`` resumes from it. Then the ranks leave ``fit()``
  the way Lightning's own graceful stop does (``SIGTERMException``, exit
  code 0: no epoch-end hooks or checkpoints after the stop step), and the
  launcher exits 75.
- **Exact resume mid-epoch.** Lightning keeps a mid-epoch checkpoint's batch
  counter but restarts the data from the top of the epoch (the rest of the
  epoch is never trained, its start twice). Where Lightning injects its
  ``DistributedSampler`` (DDP and the other distributed strategies), an
  ``InterruptibleSampler`` with the same order takes its place, its progress
  is saved with every checkpoint (this callback's state), and a resumed
  epoch trains exactly the batches an uninterrupted one would have.
- **Hang detection**: a progress beat after every training and validation
  batch.

``RelaunchLogger`` is a Lightning ``Logger``: metrics, hyperparameters and
the checkpoints ``ModelCheckpoint`` writes go to the job's run (the one
``relaunch run --server`` opened; rank 0 logs).

Limits: the exact mid-epoch resume needs a sampler Lightning injects (or a
``DataLoader(sampler=relaunch.InterruptibleSampler(...))`` of your own); on
one device Lightning injects none, and a mid-epoch resume follows Lightning.
The stop waits for the end of the training batch in progress (a long
validation loop delays it: size the grace period for it).
"""

from __future__ import annotations

import contextlib
import os
import warnings
import weakref
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

try:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    from lightning.pytorch.loggers.logger import Logger
    from lightning.pytorch.trainer.states import RunningStage
    from lightning.pytorch.utilities import rank_zero_only
    from lightning.pytorch.utilities.exceptions import SIGTERMException
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "relaunch.integrations.lightning needs PyTorch Lightning 2.x: pip install lightning"
    ) from e

import torch
from torch.utils.data import DistributedSampler

import relaunch
from relaunch import _rng
from relaunch.integrations import _common
from relaunch.sampler import InterruptibleSampler

__all__ = ["RelaunchCallback", "RelaunchLogger"]


class _EpochLengthSampler(InterruptibleSampler):
    """An ``InterruptibleSampler`` whose length is always a whole epoch's
    share, as ``DistributedSampler``'s is: Lightning counts a resumed
    epoch's batches from its own checkpoint (it fast-forwards its fetcher by
    the batches already trained), so the loader must report the epoch's
    length while the sampler yields only what is left of it."""

    def __len__(self) -> int:
        return self._share(0)


class RelaunchCallback(Callback):
    """Preemption at one agreed step, a checkpoint of it through Lightning's
    own checkpointing, exact mid-epoch resume, and progress beats.

    ``exact_resume=False`` leaves Lightning's sampler alone.
    """

    def __init__(self, *, exact_resume: bool = True) -> None:
        self.exact_resume = exact_resume
        self._trainer: weakref.ReferenceType[pl.Trainer] | None = None
        self._sampler: InterruptibleSampler | None = None
        self._pending: dict[str, Any] | None = None  # sampler state to resume from
        self._unpatch: Any = None
        self._exit_pending = False
        self._last_global_step: int | None = None
        # Random generators: the loader's base seed, and the state to put
        # back before the first resumed batch.
        self._seeds = _rng.LoaderSeeds(self._is_train_loader)
        self._observing = contextlib.ExitStack()
        self._resume_rng: dict[str, Any] | None = None
        self._resume_new_epoch = False

    # -- set-up and signals ---------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = weakref.ref(trainer)
        # Before Lightning registers its handlers (after `setup`): its
        # snapshot then holds relaunch's, which it puts back at teardown.
        from relaunch import preemption

        preemption.install()
        _common.destroy_process_group_at_exit()
        if self.exact_resume:
            self._patch_sampler()
            self._observing.enter_context(_rng.observe_loaders(self._observe_loader))

    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_signals()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._take_signals()
        if self.exact_resume and self._pending is not None and self._sampler is None:
            warnings.warn(
                "RelaunchCallback: this checkpoint holds the sampler's progress through its "
                "epoch, but the train DataLoader's sampler is not one relaunch placed (one "
                "device, or a sampler of your own): the resumed epoch follows Lightning, which "
                "restarts the epoch's data from its beginning",
                stacklevel=2,
            )

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._unpatch is not None:
            self._unpatch()
            self._unpatch = None
        self._observing.close()

    @staticmethod
    def _take_signals() -> None:
        """Lightning replaced the stop signals' handlers at ``fit()``: take
        them back for relaunch.preemption while training runs."""
        from relaunch import preemption

        preemption.install()

    # -- the stop -------------------------------------------------------------

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        from relaunch import preemption

        # With accumulate_grad_batches the optimizer steps on some batches
        # only: the stop is never inside an accumulation cycle.
        stepped = trainer.global_step != self._last_global_step
        self._last_global_step = trainer.global_step
        if self._exit_pending or not preemption.reached(trainer.global_step, boundary=stepped):
            return
        path = self._save_stop_checkpoint(trainer)
        preemption.saved(path, trainer.global_step)
        # Out of fit() before the next batch: Lightning logs this step's
        # metrics after the batch's hooks, so leaving now would lose them.
        self._exit_pending = True

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._leave_if_stopped()
        if self._last_global_step is None:
            self._last_global_step = trainer.global_step
        if self._resume_rng is not None:
            # What the uninterrupted run had before this batch.
            _rng.restore(self._resume_rng)
            self._resume_rng = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # A stop on an epoch's last batch: the epoch is done (its own
        # checkpoint, if any, resumes at the next epoch all the same).
        self._leave_if_stopped()

    def _leave_if_stopped(self) -> None:
        if self._exit_pending:
            # Lightning's own graceful stop: fit() ends through its interrupt
            # path (on_exception, teardown) with exit code 0; nothing after
            # the stop step is trained.
            raise SIGTERMException()

    def on_validation_batch_end(self, *args: Any, **kwargs: Any) -> None:
        relaunch.heartbeat()

    def _save_stop_checkpoint(self, trainer: pl.Trainer) -> str:
        """The stop step's checkpoint, as the first ``ModelCheckpoint``'s
        ``last`` checkpoint (``fit(ckpt_path="last")`` picks the newest of
        those). Every rank takes part; rank 0 writes."""
        callback = trainer.checkpoint_callback
        metrics = {
            **trainer.callback_metrics,
            "epoch": torch.tensor(trainer.current_epoch),
            "step": torch.tensor(trainer.global_step),
        }
        if isinstance(callback, ModelCheckpoint) and callback.dirpath:
            path = callback.format_checkpoint_name(metrics, callback.CHECKPOINT_NAME_LAST)
            callback.last_model_path = path
        else:
            path = os.path.join(trainer.default_root_dir, "checkpoints", "last.ckpt")
            warnings.warn(
                f"RelaunchCallback: the Trainer has no ModelCheckpoint, so fit(ckpt_path='last') "
                f"cannot find the stop's checkpoint; it is {path}: resume with "
                "fit(ckpt_path=that path)",
                stacklevel=2,
            )
        trainer.save_checkpoint(path)
        for logger in trainer.loggers:
            if isinstance(logger, RelaunchLogger):
                logger.log_checkpoint(path)
        return path

    # -- exact resume ---------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The sampler's progress, and every rank's random generators (each
        rank's: Lightning writes rank 0's checkpoint only, so this gathers
        them, on every save, from every rank, which all take part)."""
        state: dict[str, Any] = {}
        if self._sampler is not None:
            state["sampler"] = self._sampler.state_dict()
        if self.exact_resume:
            state["rng"] = _rng.per_rank({"now": _rng.capture(), "loader": self._seeds.state})
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("sampler")
        if not self.exact_resume:
            return
        if "rng" not in state_dict:
            warnings.warn(
                "RelaunchCallback: this checkpoint holds no random generator states (written "
                "without RelaunchCallback, or by an earlier relaunch): the resumed steps draw "
                "other random numbers (dropout masks, augmentations) than an uninterrupted run",
                stacklevel=2,
            )
            return
        mine = _rng.mine(state_dict["rng"], "random generator states")
        if mine is None:
            return
        # Now, before Lightning makes the train loader's iterator (its base
        # seed is drawn from this state in an uninterrupted run when the
        # checkpoint ends an epoch), and again before the first batch.
        _rng.restore(mine["now"])
        self._resume_rng = mine["now"]
        pending = self._pending or {}
        self._resume_new_epoch = pending.get("progress", 0) >= pending.get("dataset_len", 1)
        if mine["loader"] is not None:
            self._seeds.replay(mine["loader"], only_if=self._replays_seed)

    def _replays_seed(self, loader: Any) -> bool:
        """Whether the uninterrupted run drew this loader's base seed before
        the checkpoint: mid-epoch, or at the first epoch with persistent
        workers. At an epoch's end it draws the next epoch's now."""
        persistent = loader.persistent_workers and loader.num_workers > 0
        return persistent or not self._resume_new_epoch

    def _is_train_loader(self, loader: Any) -> bool:
        return self._sampler is not None and getattr(loader, "sampler", None) is self._sampler

    def _observe_loader(self, loader: Any, create: Any) -> Any:
        iterator = self._seeds.observer(loader, create)
        if self._resume_rng is not None and self._is_train_loader(loader):
            # The draw (at an epoch's end) belongs to the resumed steps.
            self._resume_rng = _rng.capture()
        return iterator

    def _patch_sampler(self) -> None:
        """Puts an ``InterruptibleSampler`` where Lightning injects its
        ``DistributedSampler`` into the train DataLoader. Lightning has no
        public hook for that: its module-level ``_get_distributed_sampler``
        is wrapped for this ``fit()`` (restored at teardown), and
        ``on_train_start`` says so when the wrap did not take effect."""
        from lightning.pytorch.trainer.connectors import data_connector

        original = data_connector._get_distributed_sampler
        callback = weakref.ref(self)

        def get_distributed_sampler(*args: Any, **kwargs: Any) -> Any:
            sampler = original(*args, **kwargs)
            owner = callback()
            if (
                owner is None
                or kwargs.get("mode") != RunningStage.TRAINING
                or type(sampler) is not DistributedSampler
            ):
                return sampler
            return owner._adopt(sampler)

        data_connector._get_distributed_sampler = get_distributed_sampler

        def unpatch() -> None:
            if data_connector._get_distributed_sampler is get_distributed_sampler:
                data_connector._get_distributed_sampler = original

        self._unpatch = unpatch

    def _adopt(self, injected: DistributedSampler) -> InterruptibleSampler:
        ours = _EpochLengthSampler(
            injected.dataset,
            num_replicas=injected.num_replicas,
            rank=injected.rank,
            shuffle=injected.shuffle,
            seed=injected.seed,
            drop_last=injected.drop_last,
        )
        state = self._pending
        if state is not None:
            if state.get("progress", 0) >= state.get("dataset_len", 1):
                # A finished epoch resumes at the next one's start. Set now,
                # not left to Lightning's set_epoch: with DataLoader workers
                # the loader draws its first indices before Lightning calls
                # it (its own samplers then give a resumed epoch the order
                # of epoch 0).
                state = {**state, "epoch": state["epoch"] + 1, "progress": 0}
            ours.load_state_dict(state)
            self._pending = None
        self._sampler = ours
        return ours


class RelaunchLogger(Logger):
    """Lightning's metrics, hyperparameters and checkpoints in a relaunch run.

    Under ``relaunch run --server`` it logs to the job's run; the arguments
    are ``relaunch.init``'s (``project``, ``name``, ``server``, ``offline``,
    ...). Without a server (and without ``offline=True``) it logs nothing.
    Rank 0 logs; the other ranks' calls do nothing. Checkpoints that
    ``ModelCheckpoint`` writes are uploaded as the run's files
    ``checkpoints/NAME`` (only the chunks the server lacks travel).
    """

    def __init__(self, **init_kwargs: Any) -> None:
        super().__init__()
        self._run = _common.LazyRun(init_kwargs)
        self._name = init_kwargs.get("project") or "relaunch"

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> str:
        """The job's run id: the same across relaunches, so the checkpoint
        folder Lightning derives from it (``NAME/VERSION/checkpoints``) is
        where a relaunched job finds its ``last`` checkpoint."""
        return os.environ.get("RELAUNCH_RUN_ID") or "local"

    @property
    def experiment(self) -> Any:
        """The ``relaunch.Run`` on rank 0 (opened on first use, so that the
        hyperparameters Lightning logs at the start are its config)."""
        return _RunProxy(self._run)

    @rank_zero_only
    def log_hyperparams(
        self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any
    ) -> None:
        values = vars(params) if isinstance(params, Namespace) else dict(params)
        plain = _common.plain_config(values)
        if self._run.opened:
            run = self._run.get()
            if run is not None:
                run.event("hyperparameters", "hyperparameters logged after the run began", plain)
            return
        self._run.config.update(plain)
        self._run.get()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        run = self._run.get()
        if run is None:
            return
        values = _common.numbers(metrics)
        if values:
            run.log(values, step=step)

    @rank_zero_only
    def after_save_checkpoint(self, checkpoint_callback: ModelCheckpoint) -> None:
        path = checkpoint_callback.last_model_path or checkpoint_callback.best_model_path
        if path:
            self.log_checkpoint(path)

    @rank_zero_only
    def log_checkpoint(self, path: str) -> None:
        """Uploads the checkpoint file at ``path`` as ``checkpoints/NAME``."""
        run = self._run.get()
        if run is not None and os.path.isfile(path):
            run.save_file(path, f"checkpoints/{os.path.basename(path)}")


class _RunProxy:
    """Opens the run when one of its attributes is used (``logger.experiment
    .log(...)``), not when Lightning merely touches ``logger.experiment``."""

    def __init__(self, lazy: _common.LazyRun) -> None:
        self._lazy = lazy

    def __getattr__(self, name: str) -> Any:
        run = self._lazy.get() if _common.rank() == 0 else None
        if run is None:
            raise AttributeError(
                f"no relaunch run on this process (rank {_common.rank()}, or no server): "
                f"cannot use .{name}"
            )
        return getattr(run, name)
