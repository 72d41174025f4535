"""A Hugging Face Trainer job that survives preemption, with relaunch's callback.

    relaunch run --nproc-per-node 2 examples/frameworks/hf_job.py --out /tmp/hf

Send the launcher SIGTERM (or Ctrl-C) while it trains: every rank stops
after the same step, the Trainer writes its ``checkpoint-STEP`` of it
(whatever ``save_steps`` says), the launcher exits 75. Run the same command
again: ``resume_from_checkpoint`` picks it up and training goes on exactly.
A tiny BERT built from its config on synthetic sequences: no download.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from torch.utils.data import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint

from relaunch.integrations.transformers import RelaunchCallback


class Sequences(Dataset):
    """Sequences of 8 tokens, labelled by whether the first is even."""

    def __init__(self, n: int = 2048) -> None:
        g = torch.Generator().manual_seed(0)
        self.tokens = torch.randint(0, 100, (n, 8), generator=g)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.tokens[i], "labels": (self.tokens[i, 0] % 2).long()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("hf-job"))
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=16,
    )
    training = TrainingArguments(
        output_dir=str(args.out),
        per_device_train_batch_size=16,
        num_train_epochs=args.epochs,
        save_strategy="no",  # relaunch saves at a stop; add save_steps for crashes
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        ddp_find_unused_parameters=False,
    )
    trainer = Trainer(
        model=BertForSequenceClassification(config),
        args=training,
        train_dataset=Sequences(),
        callbacks=[RelaunchCallback(project="hf-job")],
    )
    last = get_last_checkpoint(training.output_dir) if os.path.isdir(training.output_dir) else None
    result = trainer.train(resume_from_checkpoint=last)
    if trainer.is_world_process_zero():
        print(f"done: {result.global_step} steps, loss {result.training_loss:.4f}")


if __name__ == "__main__":
    main()
