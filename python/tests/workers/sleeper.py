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

# Written under another name, then renamed: a test that sees pid.N reads a
# whole pid, never the empty file between open and write.
# (The temporary name is not matched by the tests' glob "pid.*".)
rank = os.environ["LOCAL_RANK"]
partial = os.path.join(sys.argv[1], f".partial.pid.{rank}")
with open(partial, "w") as f:
    f.write(str(os.getpid()))
os.rename(partial, os.path.join(sys.argv[1], f"pid.{rank}"))
print("sleeping", flush=True)
time.sleep(3600)
