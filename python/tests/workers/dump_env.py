"""Writes the variables a launcher added to this worker's environment."""

import json
import os
import sys

base = set(json.loads(open(sys.argv[1]).read()))
added = {k: v for k, v in os.environ.items() if k not in base}
with open(f"{sys.argv[2]}.{os.environ['RANK']}", "w") as f:
    json.dump(added, f, indent=1, sort_keys=True)
