#!/usr/bin/env bash
# The demo: `relaunch server` on loopback, then a 4-process PyTorch DDP job
# launched with `relaunch run --server`, logged to it, preempted with SIGTERM
# (every rank stops at one step, exit code 75) and resumed from that step to
# the end as the same run, exactly (examples/resume.py: Checkpointer and
# InterruptibleSampler). Installs what it needs first (see
# scripts/env.sh).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

ensure_system_packages
ensure_venv
install_relaunch
say "running the demo"
exec "$PY" examples/demo.py "$@"
