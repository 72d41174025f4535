# A throwaway PostgreSQL cluster for the tests; source it, don't run it.
#
# start_test_postgres exports RELAUNCH_TEST_POSTGRES (an admin URL with a
# password; each test creates its own database through it) for a cluster
# made with initdb in a temporary directory, listening on 127.0.0.1 on a
# free port, and stops and deletes it when the calling shell exits
# (env.sh's `on_exit`). As
# root the cluster runs as the `postgres` user (PostgreSQL refuses root).
# A RELAUNCH_TEST_POSTGRES already set is used as it is. Where no cluster
# can start, it says why and returns 1; the PostgreSQL tests then say they
# are skipped (and fail under CI=true).

# The newest installed server's bin directory (Debian keeps them out of PATH).
pg_bindir() {
    local dir
    for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
        [ -x "$dir/initdb" ] && { echo "$dir"; return 0; }
    done
    command -v initdb >/dev/null && { dirname "$(command -v initdb)"; return 0; }
    return 1
}

start_test_postgres() {
    if [ -n "${RELAUNCH_TEST_POSTGRES:-}" ]; then
        say "PostgreSQL tests use the given RELAUNCH_TEST_POSTGRES"
        return 0
    fi
    local bin
    if ! bin="$(pg_bindir)"; then
        say "no PostgreSQL server installed (initdb not found): PostgreSQL tests will be skipped"
        return 1
    fi
    local run_as=()
    if [ "$(id -u)" -eq 0 ]; then
        if ! id postgres >/dev/null 2>&1; then
            say "running as root without a postgres user: PostgreSQL tests will be skipped"
            return 1
        fi
        run_as=(runuser -u postgres --)
    fi
    PG_TEST_DIR="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-pg.XXXXXX")"
    chmod 755 "$PG_TEST_DIR"
    local password port
    password="$(head -c 18 /dev/urandom | base64 | tr -d '/+=')"
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    printf '%s\n' "$password" >"$PG_TEST_DIR/pwfile"
    [ ${#run_as[@]} -gt 0 ] && chown -R postgres "$PG_TEST_DIR"
    # Password authentication over TCP, so the tests can check a wrong one.
    "${run_as[@]}" "$bin/initdb" -D "$PG_TEST_DIR/data" -U postgres --pwfile="$PG_TEST_DIR/pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --no-locale >"$PG_TEST_DIR/initdb.log" 2>&1 \
        || { cat "$PG_TEST_DIR/initdb.log" >&2; say "initdb failed"; return 1; }
    # Durability is not under test here: fsync off keeps CREATE DATABASE per test fast.
    if ! "${run_as[@]}" "$bin/pg_ctl" -D "$PG_TEST_DIR/data" -l "$PG_TEST_DIR/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $PG_TEST_DIR -c max_connections=400 -c fsync=off -c full_page_writes=off" \
        start >/dev/null; then
        cat "$PG_TEST_DIR/server.log" >&2
        say "PostgreSQL did not start"
        return 1
    fi
    PG_TEST_STOP=("${run_as[@]}" "$bin/pg_ctl" -D "$PG_TEST_DIR/data" -m immediate stop)
    on_exit stop_test_postgres
    export RELAUNCH_TEST_POSTGRES="postgres://postgres:$password@127.0.0.1:$port/postgres"
    say "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') for the tests on 127.0.0.1:$port"
}

stop_test_postgres() {
    if [ -n "${PG_TEST_DIR:-}" ]; then
        "${PG_TEST_STOP[@]}" >/dev/null 2>&1 || true
        rm -rf "$PG_TEST_DIR"
        PG_TEST_DIR=
    fi
}
