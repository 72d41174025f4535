"""Says on stderr, as JSON, whether its streams are terminals and their size."""

import json
import os
import sys

size = os.get_terminal_size(2) if sys.stderr.isatty() else None
probe = {
    "stdout": sys.stdout.isatty(),
    "stderr": sys.stderr.isatty(),
    "size": list(size) if size else None,
}
print("probe " + json.dumps(probe), file=sys.stderr, flush=True)
print("\x1b[1;31mred\x1b[0m plain", flush=True)
sys.stdout.write("last words, no newline")
sys.stdout.flush()
os._exit(0)
