"""A Hugging Face Trainer job as people write one, with relaunch's callback.

Usage: hf_train.py OUT [--epochs N] [--step-time S] [--workers N]
       [--signal-at STEP] [--hang-at STEP] [--crash-at STEP]
       [--dropout P] [--accumulate N]

A tiny BERT built from its config (one layer, hidden size 16, dropout
``--dropout``, 0.1 by default: the Trainer's checkpoints carry the RNG
states; ``--accumulate``: ``gradient_accumulation_steps``) classifying 64 synthetic
sequences, DDP on gloo over the launcher's ranks (``use_cpu=True``), the
Trainer's own shuffling sampler, ``save_strategy="no"`` (only a stop saves),
and ``resume_from_checkpoint`` from the newest checkpoint. The model's
forward appends ``epoch step sample...`` for each batch it trains to
``OUT/trace.RANK`` (a sample's first token is its index); rank 0 writes the
final parameters to ``OUT/params.pt``. ``--signal-at``, ``--hang-at`` and
``--crash-at`` act on rank 1 of the first attempt at that step, as in
``lightning_train.py``; ``--no-relaunch`` leaves relaunch's callback out,
``--save-every N`` saves every N steps.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import (
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

from relaunch.integrations.transformers import RelaunchCallback


class Sequences(Dataset):
    def __init__(self, n: int = 64, length: int = 6) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(64, 100, (n, length), generator=g)
        self.tokens[:, 0] = torch.arange(n)  # the sample's index, for the trace
        self.labels = (self.tokens[:, 1] % 2).long()

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i], "labels": self.labels[i]}


class Traced(BertForSequenceClassification):
    """Writes what each training forward sees; acts on --*-at flags."""

    out: Path
    flags: argparse.Namespace
    where = (0, 0)  # epoch, step: set by Where before each step

    def forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
        if self.training:
            epoch, step = self.where
            rank = int(os.environ.get("RANK", "0"))
            first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
            if rank == 1 and first_attempt:
                if step == self.flags.crash_at:
                    os._exit(1)
                if step == self.flags.hang_at:
                    time.sleep(3600)
                if step == self.flags.signal_at:
                    os.kill(os.getpid(), signal.SIGTERM)
            with open(self.out / f"trace.{rank}", "a") as f:
                f.write(f"{epoch} {step} {' '.join(map(str, input_ids[:, 0].tolist()))}\n")
            time.sleep(self.flags.step_time)
        return super().forward(
            input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs
        )


class Where(TrainerCallback):
    def __init__(self, model: Traced) -> None:
        self.model = model

    def on_step_begin(self, args, state, control, **kwargs):
        self.model.where = (int(state.epoch or 0), state.global_step)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--step-time", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--signal-at", type=int, default=-1)
    parser.add_argument("--hang-at", type=int, default=-1)
    parser.add_argument("--crash-at", type=int, default=-1)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--accumulate", type=int, default=1, help="gradient accumulation steps")
    parser.add_argument("--no-relaunch", action="store_true")
    parser.add_argument("--save-every", type=int, default=0, help="steps between checkpoints")
    flags = parser.parse_args()
    flags.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
        num_labels=2,
        hidden_dropout_prob=flags.dropout,
        attention_probs_dropout_prob=flags.dropout,
    )
    model = Traced(config)
    model.out, model.flags = flags.out, flags
    args = TrainingArguments(
        output_dir=str(flags.out / "hf"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=flags.accumulate,
        num_train_epochs=flags.epochs,
        learning_rate=1e-3,
        save_strategy="steps" if flags.save_every else "no",
        save_steps=flags.save_every or 500,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=flags.workers,
        ddp_find_unused_parameters=False,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Sequences(),
        callbacks=[Where(model)]
        if flags.no_relaunch
        else [RelaunchCallback(project="hf"), Where(model)],
    )
    last = get_last_checkpoint(args.output_dir) if os.path.isdir(args.output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        torch.save({k: v.clone() for k, v in model.state_dict().items()}, flags.out / "params.pt")
    # As scripts should: a process group left to the interpreter's exit can
    # abort it in gloo's teardown ("terminate called without an active
    # exception").
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
