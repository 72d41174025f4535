#!/usr/bin/env bash
# The dashboard's end-to-end tests in a real browser: Debian's chromium
# (installed with apt-get if missing; playwright downloads no browser),
# playwright-core from tests/browser/package-lock.json (npm ci), node's
# own test runner.
#
#   scripts/browser-test.sh [RELAUNCH_BIN] [PYTHON]
#
# RELAUNCH_BIN  the relaunch binary under test   [default: target/debug/relaunch]
# PYTHON        a Python with relaunch installed [default: .venv/bin/python]
# CHROMIUM      the browser                      [default: /usr/bin/chromium]
# Screenshots of every page land in tests/browser/screenshots/.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export RELAUNCH_BIN="$(realpath "${1:-${RELAUNCH_BIN:-target/debug/relaunch}}")"
export RELAUNCH_PYTHON="$(realpath -s "${2:-${RELAUNCH_PYTHON:-.venv/bin/python}}")"
export CHROMIUM="${CHROMIUM:-/usr/bin/chromium}"

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

[ -x "$RELAUNCH_BIN" ] || { echo "error: no relaunch binary at $RELAUNCH_BIN (cargo build -p relaunch-cli)" >&2; exit 1; }
"$RELAUNCH_PYTHON" -c 'import relaunch' 2>/dev/null \
    || { echo "error: $RELAUNCH_PYTHON cannot import relaunch (scripts/env.sh installs it into .venv)" >&2; exit 1; }
if [ ! -x "$CHROMIUM" ]; then
    echo "==> installing chromium (apt-get)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    echo "==> installing nodejs and npm (apt-get)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm
fi

cd tests/browser
npm ci --no-audit --no-fund --loglevel=error
exec node --test --test-concurrency=1 --test-timeout=300000 dashboard.test.mjs
