"""Writes its pid, then sleeps: a worker that only a signal ends.

Usage: sleeper.py DIR [--preemption]. With ``--preemption`` it imports
``relaunch.preemption`` first, so a stop signal only asks it to stop (and it
never checks): only the end of its attempt ends it.
"""

import os
import sys
import time

if "--preemption" in sys.argv[2:]:
    import relaunch.preemption  # noqa: F401

with open(os.path.join(sys.argv[1], f"pid.{os.environ['LOCAL_RANK']}"), "w") as f:
    f.write(str(os.getpid()))
print("sleeping", flush=True)
time.sleep(3600)
