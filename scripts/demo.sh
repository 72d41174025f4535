#!/usr/bin/env bash
# The demo: starts `relaunch store serve` and runs a 4-process PyTorch gloo
# all_reduce whose rendezvous goes through it. Installs what it needs first
# (see scripts/env.sh).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

ensure_system_packages
ensure_venv
install_relaunch
say "running the demo"
exec "$PY" examples/allreduce.py "$@"
