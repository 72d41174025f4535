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
- **The run's summary is the whole run's.** The Trainer ends every
  ``train()`` with a summary of that call (``train_loss``, ``train_runtime``,
  samples and steps per second, ``total_flos``). A stopped attempt's covers
  its own steps only: it goes to the run as a ``summary`` event of that
  attempt, not as metrics, and its totals are kept beside its checkpoint
  (``relaunch_summary.json``); the attempt that finishes logs the whole
  run's summary (the loss averaged over every attempt's steps, the
  runtimes added up).
"""

from __future__ import annotations

import json
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

# Beside a stop's checkpoint: the totals of the attempts up to it.
SUMMARY_FILE = "relaunch_summary.json"


class RelaunchCallback(TrainerCallback):
    """Preemption at one agreed step with the Trainer's own checkpoint of
    it, progress beats, and metrics in the job's run."""

    def __init__(self, **init_kwargs: Any) -> None:
        self._run = _common.LazyRun(init_kwargs)
        self._stopping = False
        self._first_step = 0
        self._before: dict[str, float] | None = None  # earlier attempts' totals

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        from relaunch import preemption

        # The Trainer has loaded the resumed checkpoint's state by now.
        self._first_step = state.global_step
        self._before = _totals_beside(args, state.global_step)
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
        if "train_runtime" in values:
            self._log_summary(args, state, values, run)
        elif run is not None and values:
            run.log(values, step=state.global_step)

    def _log_summary(
        self, args: Any, state: Any, summary: dict[str, float], run: relaunch.Run | None
    ) -> None:
        """The Trainer's summary of this ``train()`` call: a stopped
        attempt's as an event of it (its totals kept beside its checkpoint
        for the attempt that finishes); the finishing one's made the whole
        run's."""
        steps = state.global_step - self._first_step
        whole = _combined(self._before, summary, steps)
        if self._stopping:
            path = os.path.join(
                args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}", SUMMARY_FILE
            )
            try:
                with open(path, "w") as f:
                    json.dump(whole["totals"], f)
            except OSError as e:
                sys.stderr.write(f"relaunch: cannot keep this attempt's summary in {path}: {e}\n")
            if run is not None:
                run.event(
                    "summary",
                    f"the Trainer's summary of this attempt's {steps} step(s) "
                    f"({self._first_step + 1} to {state.global_step}), which stopped for a "
                    "preemption: not the run's",
                    summary,
                )
            return
        if run is not None:
            run.log(whole["metrics"], step=state.global_step)

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


def _totals_beside(args: Any, step: int) -> dict[str, float] | None:
    """The totals a stopped attempt kept beside the checkpoint of ``step``
    (the one the Trainer resumed from), if any."""
    path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}", SUMMARY_FILE)
    try:
        with open(path) as f:
            totals = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(totals, dict) or not all(
        isinstance(totals.get(k), (int, float)) for k in ("steps", "loss_sum", "runtime", "samples")
    ):
        return None
    return totals


def _combined(
    before: dict[str, float] | None, summary: dict[str, float], steps: int
) -> dict[str, dict[str, float]]:
    """This attempt's summary with the earlier attempts' totals: the totals
    to keep, and the whole run's summary as the Trainer would have logged
    it for one uninterrupted ``train()``."""
    runtime = summary.get("train_runtime", 0.0)
    samples = summary.get("train_samples_per_second", 0.0) * runtime
    totals = {
        "steps": steps,
        "loss_sum": summary.get("train_loss", 0.0) * steps,
        "runtime": runtime,
        "samples": samples,
    }
    if before is not None:
        totals = {k: totals[k] + before[k] for k in totals}
    metrics = dict(summary)
    if before is not None:
        metrics["train_loss"] = totals["loss_sum"] / max(totals["steps"], 1)
        metrics["train_runtime"] = totals["runtime"]
        if totals["runtime"] > 0:
            metrics["train_samples_per_second"] = totals["samples"] / totals["runtime"]
            metrics["train_steps_per_second"] = totals["steps"] / totals["runtime"]
    return {"totals": totals, "metrics": metrics}
