"""tqdm's stacked bars (an epoch bar and a batch bar that goes away), with
tqdm.write between epochs, as Lightning's TQDMProgressBar draws them:
`tqdm_bars.py EPOCHS BATCHES`."""

import os
import sys
import time

from tqdm import tqdm

rank = int(os.environ["RANK"])
epochs, batches = int(sys.argv[1]), int(sys.argv[2])
for epoch in tqdm(range(epochs), desc=f"epochs{rank}", position=0):
    for _ in tqdm(range(batches), desc=f"batches{rank}", position=1, leave=False):
        time.sleep(0.01)
    tqdm.write(f"epoch {epoch} done on {rank}")
print(f"done {rank}", flush=True)
