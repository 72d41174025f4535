"""Fails with torch's @record, which writes the traceback to the error file."""

import os

from torch.distributed.elastic.multiprocessing.errors import record


def load_batch(step):
    raise ValueError(f"corrupt batch at step {step} on rank {os.environ['RANK']}")


@record
def main():
    if os.environ["LOCAL_RANK"] == "1":
        load_batch(7)


if __name__ == "__main__":
    main()
