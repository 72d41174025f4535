#!/usr/bin/env bash
# The tracking benchmark's own environment: bench/tracking/.venv with the
# peers (wandb, mlflow) and a few helpers, apart from the project's .venv.
# relaunch's side of every measurement runs with the project's
# .venv/bin/python (scripts/test.sh or scripts/demo.sh builds it); the peers'
# side with this one, in the same run, as subprocesses.
#
#   bash bench/tracking/setup.sh      # idempotent; a few minutes the first time
#
# BENCH_VENV  where the environment lives   [default: bench/tracking/.venv]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${BENCH_VENV:-$HERE/.venv}"
PY="$VENV/bin/python"
# Versions the figures in BENCHMARKS.md were measured with.
REQUIREMENTS=(wandb==0.31.0 mlflow==3.17.2 requests py-spy)

want="$(printf '%s\n' "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.requirements.sha256"
if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$PY" -c 'import wandb, mlflow, requests' 2>/dev/null; then
    exit 0
fi
echo "==> creating $VENV with ${REQUIREMENTS[*]}" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "${REQUIREMENTS[@]}"
echo "$want" >"$stamp"
