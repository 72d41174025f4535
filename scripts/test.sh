#!/usr/bin/env bash
# Runs every test: formatting, lints, the Rust tests (the storage suite on
# SQLite and on a throwaway PostgreSQL, the chunk store on a directory and
# on a throwaway SeaweedFS S3), the Python tests against real
# PyTorch, and the dashboard's tests in Debian's chromium.
# Installs what it needs first (see scripts/env.sh).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$ROOT/scripts/postgres.sh"
source "$ROOT/scripts/s3.sh"

ensure_system_packages
ensure_venv
# The storage suite runs on PostgreSQL too; without it those runs say
# they are skipped (and fail under CI).
start_test_postgres || true
# The chunk store tests and the HTTP file tests run on S3 (SeaweedFS, from
# the virtual environment) too, the same way.
start_test_s3 || true

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
