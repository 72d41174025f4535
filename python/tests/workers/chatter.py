"""Prints many long lines fast, on stdout and stderr."""

import os
import sys

rank = os.environ["RANK"]
lines = int(sys.argv[1])
pad = "x" * 150
for i in range(lines):
    stream = sys.stdout if i % 2 == 0 else sys.stderr
    stream.write(f"rank {rank} line {i} {pad}\n")
