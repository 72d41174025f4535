"""relaunch for the Hugging Face ``Trainer`` (transformers 4.40 and later).

::

    from transformers.trainer_utils import get_last_checkpoint
    from relaunch.integrations.transformers import RelaunchCallback

    trainer = Trainer(model, args, train_dataset=..., callbacks=[RelaunchCallback()])
    trainer.train(resume_from_checkpoint=get_last_checkpoint(args.output_dir))

Run it with ``relaunch run --nproc-per-node N train.py``. What it gives:

- **One agreed stop step.** A stop signal that reaches any process of the
  job (the launcher, every process, or one rank) makes every rank stop after
  the same optimizer step (:mod:`relaunch.preemption`; the Trainer installs
  no handler of its own).
- **A checkpoint of that step**, whatever ``save_steps`` says: the Trainer
  writes its own ``OUTPUT_DIR/checkpoint-STEP`` (model, optimizer,
  scheduler, RNG states, ``trainer_state.json``), which
  ``resume_from_checkpoint`` picks up; the Trainer then resumes exactly
  there (it skips the batches already trained of the epoch, and restores
  the RNG states). Every rank waits until every rank's part is written,
  then the process exits (code 0), so the launcher exits 75. Code after
  ``trainer.train()`` does not run after a stop: the job is not finished.
- **Hang detection**: a progress beat after every step, gradient
  accumulation step and evaluation step.
- **Metrics and config** in the job's run under ``relaunch run --server``
  (rank 0 logs what the Trainer logs, at its global step; the config is the
  ``TrainingArguments`` and the model's config). The arguments are
  ``relaunch.init``'s (``project``, ``name``, ``server``, ``offline``...);
  without a server (and without ``offline=True``) nothing is logged.
"""

from __future__ import annotations

import os
import sys
from typing import Any

try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as e:  # pragma: no cover - depends on the environment
    raise ImportError(
        "relaunch.integrations.transformers needs transformers: pip install transformers"
    ) from e

import relaunch
from relaunch.integrations import _common

__all__ = ["RelaunchCallback"]


class RelaunchCallback(TrainerCallback):
    """Preemption at one agreed step with the Trainer's own checkpoint of
    it, progress beats, and metrics in the job's run."""

    def __init__(self, **init_kwargs: Any) -> None:
        self._run = _common.LazyRun(init_kwargs)
        self._stopping = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from relaunch import preemption

        preemption.install()
        _common.destroy_process_group_at_exit()
        if state.is_world_process_zero and self._run.enabled and not self._run.opened:
            config: dict[str, Any] = {"args": _common.plain_config(args.to_dict())}
            model = kwargs.get("model")
            model_config = getattr(model, "config", None)
            if model_config is not None and hasattr(model_config, "to_dict"):
                config["model"] = _common.plain_config(model_config.to_dict())
            self._run.config.update(config)
            self._run.get()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from relaunch import preemption

        if self._stopping or not preemption.reached(state.global_step):
            return
        # The Trainer saves checkpoint-STEP right after this hook, on every
        # rank (its save gathers across ranks), then leaves its loop.
        self._stopping = True
        control.should_save = True
        control.should_training_stop = True

    def on_substep_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        relaunch.heartbeat()

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        relaunch.heartbeat()

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._stopping:
            return
        from relaunch import preemption

        # The Trainer has no barrier after its save: rank 0 may still be
        # writing the files it alone writes when the others get here.
        _common.barrier()
        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        preemption.saved(path, state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if not state.is_world_process_zero or not logs:
            return
        run = self._run.get()
        values = _common.numbers(logs)
        if run is not None and values:
            run.log(values, step=state.global_step)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self._stopping:
            return
        sys.stderr.write(
            f"relaunch: stopped at step {state.global_step} for a preemption, its checkpoint "
            "written; exiting so that the job can be relaunched from it\n"
        )
        sys.stderr.flush()
        # Out of train(): what follows it in the script (evaluation, a final
        # save) is for a finished job, and this one is not.
        raise SystemExit(0)
