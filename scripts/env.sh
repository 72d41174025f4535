# Shared set-up for scripts/demo.sh and scripts/test.sh; source it, don't run it.
#
# Makes sure the machine has what the build needs, keeps a virtual
# environment with torch and the dev tools, and installs relaunch into it
# with `pip install .`. Everything is idempotent: a second run only rebuilds
# what changed.
#
# RELAUNCH_VENV  where the virtual environment lives   [default: .venv]
# CARGO_TARGET_DIR  where cargo builds                 [default: target]

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${RELAUNCH_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"

say() {
    if [ -t 2 ]; then printf '\033[1m==> %s\033[0m\n' "$*" >&2; else printf '==> %s\n' "$*" >&2; fi
}

# Commands to run when the calling shell exits, in order: the throwaway
# services of postgres.sh and s3.sh each register their cleanup here, so
# one EXIT trap stops them all.
TEST_CLEANUPS=()
on_exit() {
    TEST_CLEANUPS+=("$1")
    trap run_test_cleanups EXIT
}
# The same, to run before those registered so far (a user of the services
# stops before they do).
on_exit_first() {
    TEST_CLEANUPS=("$1" "${TEST_CLEANUPS[@]}")
    trap run_test_cleanups EXIT
}
run_test_cleanups() {
    local cleanup
    for cleanup in "${TEST_CLEANUPS[@]}"; do
        "$cleanup" || true
    done
}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the build needs, installed only if missing.
ensure_system_packages() {
    local missing=()
    command -v cc >/dev/null || missing+=(build-essential)
    command -v pkg-config >/dev/null || missing+=(pkg-config)
    command -v python3 >/dev/null || missing+=(python3)
    python3 -c 'import venv, ensurepip' 2>/dev/null || missing+=(python3-venv)
    # A throwaway PostgreSQL cluster for the storage tests (scripts/postgres.sh).
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null \
        || missing+=(postgresql)
    # `ip` makes the network namespaces of the multi-host tests (python/tests/netns.py).
    command -v ip >/dev/null || missing+=(iproute2)
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        as_root apt-get update -qq
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
    fi
    if ! command -v cargo >/dev/null; then
        echo "error: cargo not found; install Rust from https://rustup.rs (rustup default stable)" >&2
        exit 1
    fi
}

# The virtual environment with requirements-dev.txt, rebuilt when the file
# changes or the environment is broken.
ensure_venv() {
    local stamp="$VENV/.requirements.sha256"
    local want
    want="$(sha256sum requirements-dev.txt | cut -d' ' -f1)"
    if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
        && "$PY" -c 'import torch, maturin, pytest' 2>/dev/null; then
        return
    fi
    say "creating $VENV with torch and the dev tools (a few minutes the first time)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --upgrade pip
    "$PY" -m pip install --quiet -r requirements-dev.txt
    echo "$want" >"$stamp"
}

# `pip install .` into the virtual environment: the native module and the
# `relaunch` command.
install_relaunch() {
    say "building and installing relaunch (pip install .)"
    export PATH="$VENV/bin:$PATH"
    # Build isolation would fetch maturin again; the venv already has it.
    "$PY" -m pip install --quiet --no-build-isolation --force-reinstall --no-deps "$ROOT"
}
