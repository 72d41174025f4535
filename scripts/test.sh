#!/usr/bin/env bash
# Runs every test: formatting, lints, the Rust tests (the storage suite on
# SQLite and on a throwaway PostgreSQL, the chunk store on a directory and
# on a throwaway SeaweedFS S3), the Python tests against real
# PyTorch, and the dashboard's tests in Debian's chromium.
# Installs what it needs first (see scripts/env.sh).
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
source "$ROOT/scripts/postgres.sh"
source "$ROOT/scripts/s3.sh"
source "$ROOT/scripts/slurm.sh"

ensure_system_packages
ensure_venv
# The client's default spool directory ($XDG_STATE_HOME/relaunch/runs) is
# this run's, not the machine user's; python/tests' conftest gives each
# test one of its own as well.
XDG_STATE_HOME="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-test-state.XXXXXX")"
export XDG_STATE_HOME
remove_test_state() { rm -rf "$XDG_STATE_HOME"; }
on_exit remove_test_state
# The storage suite runs on PostgreSQL too; without it those runs say
# they are skipped (and fail under CI).
start_test_postgres || true
# The chunk store tests and the HTTP file tests run on S3 (SeaweedFS, from
# the virtual environment) too, the same way.
start_test_s3 || true
# python/tests/test_slurm.py runs against a one-machine SLURM (root only).
start_test_slurm || true

install_relaunch
# The SLURM tests mostly wait (on slurmctld's scheduling, on time limits
# and signals), so with no arguments they run in a pytest of their own in
# the background, while the Rust checks and tests use the CPUs; their
# output follows the main pytest's. The framework integration tests
# (Lightning, transformers, accelerate: small 2-rank jobs that mostly
# import and wait on their step times and signals) and the DCP jobs run
# after them there, and the Checkpointer loops' exact-resume jobs.
BACKGROUND_TESTS=(
    python/tests/test_slurm.py python/tests/test_slurm_nodes.py
    python/tests/test_integration_lightning.py python/tests/test_integration_transformers.py
    python/tests/test_integration_accelerate.py python/tests/test_framework_examples.py
    python/tests/test_dcp.py python/tests/test_checkpoint_rng.py
)
SLURM_PYTEST_PID=""
if [ $# -eq 0 ]; then
    SLURM_PYTEST_DIR="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-slurm-pytest.XXXXXX")"
    say "pytest ${BACKGROUND_TESTS[*]}, in the background (output below, after the other tests)"
    # A background job of a script starts with SIGINT ignored; pytest gets
    # Python's default handler back, so that SIGINT stops it cleanly.
    "$PY" -c 'import signal, sys, pytest
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.exit(pytest.main())' -p no:cacheprovider --basetemp "$SLURM_PYTEST_DIR/tmp" \
        "${BACKGROUND_TESTS[@]}" >"$SLURM_PYTEST_DIR/log" 2>&1 &
    SLURM_PYTEST_PID=$!
    # Stopped first on the way out (before the services it uses): SIGINT,
    # so that its fixtures tear down (jobs, namespaces), then SIGKILL.
    stop_slurm_pytest() {
        if [ -n "$SLURM_PYTEST_PID" ] && kill -0 "$SLURM_PYTEST_PID" 2>/dev/null; then
            kill -INT "$SLURM_PYTEST_PID" 2>/dev/null || true
            local deadline=$((SECONDS + 60))
            while kill -0 "$SLURM_PYTEST_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do
                sleep 1
            done
            kill -KILL "$SLURM_PYTEST_PID" 2>/dev/null || true
            cat "$SLURM_PYTEST_DIR/log" >&2 || true
        fi
        rm -rf "$SLURM_PYTEST_DIR"
    }
    on_exit_first stop_slurm_pytest
fi

say "cargo fmt --check"
cargo fmt --all --check
say "cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
say "cargo test"
cargo test --workspace --locked

say "ruff"
"$VENV/bin/ruff" check python examples bench build_backend scripts
"$VENV/bin/ruff" format --check python examples bench build_backend scripts
say "pytest"
if [ $# -eq 0 ]; then
    # --durations: where CI's time goes.
    "$PY" -m pytest --durations=20 "${BACKGROUND_TESTS[@]/#/--ignore=}"
    say "pytest ${BACKGROUND_TESTS[*]} (run in the background since the start)"
    slurm_status=0
    wait "$SLURM_PYTEST_PID" || slurm_status=$?
    SLURM_PYTEST_PID=""
    cat "$SLURM_PYTEST_DIR/log"
    if [ "$slurm_status" -ne 0 ]; then
        echo "error: the background tests (SLURM, frameworks) failed (exit $slurm_status)" >&2
        exit "$slurm_status"
    fi
else
    "$PY" -m pytest "$@"
fi
say "the docs site (mkdocs build --strict: a broken link or reference fails it)"
DOCS_SITE="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-docs.XXXXXX")"
NO_MKDOCS_2_WARNING=1 "$PY" -m mkdocs build --strict --quiet --site-dir "$DOCS_SITE/site"
rm -rf "$DOCS_SITE"
say "the dashboard in a real browser"
scripts/browser-test.sh "$VENV/bin/relaunch" "$PY"
# Once more on two replicas on PostgreSQL + S3: the tracking, files,
# launcher-tracking, resume and read-API tests, and the dashboard's (clients write
# through one replica, reads go through the other).
if [ $# -eq 0 ]; then
    if [ -n "${RELAUNCH_TEST_POSTGRES:-}" ] && [ -n "${RELAUNCH_TEST_S3:-}" ]; then
        say "pytest, the tracking tests on two replicas (PostgreSQL + S3)"
        RELAUNCH_TEST_SERVERS=replicas "$PY" -m pytest python/tests/test_tracking.py \
            python/tests/test_files.py python/tests/test_launch_tracking.py python/tests/test_resume.py \
            python/tests/test_api.py python/tests/test_alerts.py
        say "the dashboard in a real browser, on two replicas (PostgreSQL + S3)"
        RELAUNCH_TEST_SERVERS=replicas scripts/browser-test.sh "$VENV/bin/relaunch" "$PY"
    elif [ -n "${CI:-}" ]; then
        echo "error: CI runs the tests on replicas, but PostgreSQL or S3 did not start" >&2
        exit 1
    else
        say "no PostgreSQL or S3 here: the tests on replicas are skipped"
    fi
fi
say "all tests passed"
