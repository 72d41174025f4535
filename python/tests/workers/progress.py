"""Draws a carriage-return progress bar, as tqdm does, then prints a line."""

import sys
import time

frames = int(sys.argv[1])
for i in range(frames + 1):
    bar = "#" * (30 * i // frames)
    sys.stderr.write(f"\r{100 * i // frames:3d}%|{bar:<30}| {i}/{frames}")
    sys.stderr.flush()
    time.sleep(0.001)
sys.stderr.write("\n")
print("done", flush=True)
