#!/usr/bin/env bash
# Runs every test: formatting, lints, the Rust tests and the Python tests
# against real PyTorch. Installs what it needs first (see scripts/env.sh).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

ensure_system_packages
ensure_venv

say "cargo fmt --check"
cargo fmt --all --check
say "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
say "cargo test"
cargo test --workspace --locked

install_relaunch
say "ruff"
"$VENV/bin/ruff" check python examples bench
"$VENV/bin/ruff" format --check python examples bench
say "pytest"
"$PY" -m pytest "$@"
say "all tests passed"
