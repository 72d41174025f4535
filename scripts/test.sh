#!/usr/bin/env bash
# Runs every test: formatting, lints, the Rust tests, the Python tests
# against real PyTorch, and the dashboard's tests in Debian's chromium.
# Installs what it needs first (see scripts/env.sh).
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
say "the dashboard in a real browser"
scripts/browser-test.sh "$VENV/bin/relaunch" "$PY"
say "all tests passed"
