"""A Rich progress bar per rank, as Lightning's RichProgressBar draws one, with
a line printed above it half-way: `rich_bars.py STEPS`."""

import os
import sys
import time

from rich.progress import Progress

rank = int(os.environ["RANK"])
steps = int(sys.argv[1])
with Progress() as progress:
    task = progress.add_task(f"rank {rank}", total=steps)
    for step in range(steps):
        time.sleep(0.02)
        if step == steps // 2:
            progress.console.print(f"[bold red]halfway[/] {rank}")
        progress.advance(task)
print(f"done {rank}", flush=True)
