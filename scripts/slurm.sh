# A throwaway one-machine SLURM cluster for the tests; source it, don't run it.
#
# start_test_slurm installs slurmctld, slurmd, slurmdbd, slurm-client,
# munge and mariadb-server with apt-get where they are missing, then starts
# munged, MariaDB, slurmdbd, slurmctld and slurmd in a temporary directory: their own munge key and socket, a slurm.conf
# (this host as the only node, with the CPUs and memory `slurmd -C`
# reports; partitions `low` (the default) and `high`, where a `high` job
# preempts a `low` one and SLURM requeues it: preempt/partition_prio,
# PreemptMode=REQUEUE; no cgroups: proctrack/linuxproc, task/none;
# accounting through slurmdbd into a throwaway MariaDB, so that `sacct`
# answers), state and spool directories, logs and free ports. It
# exports
#   SLURM_CONF             the clients (sbatch, scontrol, squeue) read it
#   RELAUNCH_TEST_SLURM    the cluster's directory; the tests write their
#                          jobs' files below it
# and stops the daemons and deletes the directory when the calling shell
# exits (env.sh's `on_exit`). Without root, or where a daemon does not
# start, it says why and returns 1; the SLURM tests then say they are
# skipped (and fail under CI=true).

start_test_slurm() {
    if [ -n "${RELAUNCH_TEST_SLURM:-}" ]; then
        say "SLURM tests use the given RELAUNCH_TEST_SLURM (SLURM_CONF=${SLURM_CONF:-})"
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        say "not root: the SLURM daemons cannot start here, SLURM tests will be skipped"
        return 1
    fi
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v sbatch >/dev/null || ! command -v munged >/dev/null \
        || ! command -v slurmdbd >/dev/null || ! command -v mariadbd >/dev/null; then
        say "installing slurmctld slurmd slurmdbd slurm-client munge mariadb-server"
        # Debian's packages would start their services; nothing here may.
        if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
            apt-get install -y -qq slurmctld slurmd slurmdbd slurm-client munge \
            mariadb-server >/dev/null; }; then
            say "cannot install SLURM: SLURM tests will be skipped"
            return 1
        fi
    fi
    SLURM_TEST_DIR="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-slurm.XXXXXX")"
    SLURM_TEST_PIDS=()
    on_exit stop_test_slurm
    local dir="$SLURM_TEST_DIR"
    chmod 755 "$dir"
    mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/jobs"
    chmod 700 "$dir/munge"
    # munge: its own key, socket, log and seed; started in the foreground
    # so that its pid is ours to stop.
    head -c 1024 /dev/urandom >"$dir/munge/munge.key"
    chmod 400 "$dir/munge/munge.key"
    munged --foreground --force --key-file="$dir/munge/munge.key" \
        --socket="$dir/munge/munge.socket" --pid-file="$dir/munge/munged.pid" \
        --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" \
        >"$dir/munge/stdout.log" 2>&1 &
    SLURM_TEST_PIDS+=($!)
    local deadline=$((SECONDS + 20))
    until [ -S "$dir/munge/munge.socket" ]; do
        if [ $SECONDS -ge $deadline ]; then
            cat "$dir/munge/munged.log" "$dir/munge/stdout.log" >&2 2>/dev/null
            say "munged did not start: SLURM tests will be skipped"
            stop_test_slurm
            return 1
        fi
        sleep 0.2
    done
    local node ctld_port slurmd_port dbd_port db_port node_line
    node="$(hostname -s)"
    read -r ctld_port slurmd_port dbd_port db_port <<<"$(python3 -c '
import socket
ports = []
for _ in range(4):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); ports.append(s.getsockname()[1]); s.close()
print(*ports)')"
    # The node as slurmd sees it (CPUs, sockets, memory), less 1 GiB of
    # memory so that a busy machine still passes slurmd's check.
    node_line="$(slurmd -C | head -n 1 | awk '{
        for (i = 1; i <= NF; i++) if ($i ~ /^RealMemory=/) { split($i, m, "="); $i = "RealMemory=" (m[2] > 2048 ? m[2] - 1024 : m[2]) }
        print }')"
    cat >"$dir/slurm.conf" <<CONF
ClusterName=relaunchtest
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire: how long slurmd refuses a job id it just stopped, and so
# how long SLURM holds a requeued job before it may start again (120 s by
# default). Starting it sooner fails it ("Job credential revoked").
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=10
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$dbd_port
# With munge, this names the munge socket for slurmdbd connections.
AccountingStoragePass=$dir/munge/munge.socket
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobRequeue=1
# A preempted job gets SIGTERM, then this long before SIGKILL.
KillWait=60
# Finished jobs stay visible to scontrol (Restarts=) this long.
MinJobAge=600
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
$node_line NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=low Nodes=$node Default=YES PriorityTier=1 PreemptMode=REQUEUE MaxTime=INFINITE State=UP
PartitionName=high Nodes=$node PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
CONF
    export SLURM_CONF="$dir/slurm.conf"
    if ! start_test_slurm_accounting "$dir" "$node" "$db_port" "$dbd_port"; then
        say "SLURM accounting (MariaDB, slurmdbd) did not start: SLURM tests will be skipped"
        stop_test_slurm
        unset SLURM_CONF
        return 1
    fi
    slurmctld -D -c -f "$SLURM_CONF" >"$dir/slurmctld.stdout" 2>&1 &
    SLURM_TEST_PIDS+=($!)
    slurmd -D -f "$SLURM_CONF" -N "$node" >"$dir/slurmd.stdout" 2>&1 &
    SLURM_TEST_PIDS+=($!)
    deadline=$((SECONDS + 60))
    until scontrol show node "$node" 2>/dev/null | grep -Eq 'State=IDLE'; do
        if [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/slurmctld.stdout" "$dir/slurmd.stdout" >&2 2>/dev/null
            say "the SLURM node did not come up: SLURM tests will be skipped"
            stop_test_slurm
            unset SLURM_CONF
            return 1
        fi
        sleep 0.5
    done
    export RELAUNCH_TEST_SLURM="$dir"
    say "SLURM $(sinfo --version | awk '{print $2}') for the tests: node $node, partitions low and high (SLURM_CONF=$SLURM_CONF)"
}

# MariaDB on loopback (its own data directory, no grant for anyone but
# root on its socket and the slurm user), then slurmdbd on it, and the
# cluster registered; slurmdbd.conf beside slurm.conf, where SLURM looks.
start_test_slurm_accounting() {
    local dir="$1" node="$2" db_port="$3" dbd_port="$4" deadline
    mkdir -p "$dir/db"
    if ! mariadb-install-db --user=root --datadir="$dir/db/data" --skip-test-db \
        --auth-root-authentication-method=socket >"$dir/db/install.log" 2>&1; then
        cat "$dir/db/install.log" >&2
        return 1
    fi
    # Native AIO off: some sandboxes (gVisor) lack it.
    mariadbd --user=root --datadir="$dir/db/data" --socket="$dir/db/mysqld.sock" \
        --port="$db_port" --bind-address=127.0.0.1 --pid-file="$dir/db/mysqld.pid" \
        --innodb-use-native-aio=0 --skip-name-resolve --log-error="$dir/db/error.log" \
        >"$dir/db/stdout.log" 2>&1 &
    SLURM_TEST_PIDS+=($!)
    deadline=$((SECONDS + 30))
    until mariadb --socket="$dir/db/mysqld.sock" -e "SELECT 1" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$dir/db/error.log" >&2 2>/dev/null
            return 1
        fi
        sleep 0.2
    done
    mariadb --socket="$dir/db/mysqld.sock" -e "
        CREATE USER 'slurm'@'127.0.0.1' IDENTIFIED BY 'relaunch-test';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || return 1
    cat >"$dir/slurmdbd.conf" <<CONF
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
DbdHost=$node
DbdAddr=127.0.0.1
DbdPort=$dbd_port
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$db_port
StorageUser=slurm
StoragePass=relaunch-test
StorageLoc=slurm_acct_db
LogFile=$dir/slurmdbd.log
PidFile=$dir/slurmdbd.pid
DebugLevel=info
CONF
    chmod 600 "$dir/slurmdbd.conf"
    slurmdbd -D >"$dir/slurmdbd.stdout" 2>&1 &
    SLURM_TEST_PIDS+=($!)
    deadline=$((SECONDS + 30))
    until sacctmgr --immediate add cluster relaunchtest >>"$dir/sacctmgr.log" 2>&1 \
        || sacctmgr --noheader --parsable2 list cluster 2>/dev/null | grep -q '^relaunchtest|'; do
        if [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$dir/slurmdbd.log" "$dir/sacctmgr.log" >&2 2>/dev/null
            return 1
        fi
        sleep 0.5
    done
}

stop_test_slurm() {
    if [ -n "${SLURM_TEST_DIR:-}" ]; then
        # Jobs first (their processes belong to slurmd), then the daemons.
        scancel --full --quiet --user=root 2>/dev/null || true
        local pid
        for pid in "${SLURM_TEST_PIDS[@]}"; do
            kill "$pid" 2>/dev/null || true
        done
        for pid in "${SLURM_TEST_PIDS[@]}"; do
            wait "$pid" 2>/dev/null || true
        done
        SLURM_TEST_PIDS=()
        rm -rf "$SLURM_TEST_DIR"
        SLURM_TEST_DIR=
    fi
}
