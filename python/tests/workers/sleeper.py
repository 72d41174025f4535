"""Writes its pid, then sleeps: a worker that only a signal ends."""

import os
import sys
import time

with open(os.path.join(sys.argv[1], f"pid.{os.environ['LOCAL_RANK']}"), "w") as f:
    f.write(str(os.getpid()))
print("sleeping", flush=True)
time.sleep(3600)
