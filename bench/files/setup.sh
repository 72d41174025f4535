#!/usr/bin/env bash
# The files benchmark's own environment: bench/files/.venv with the peer,
# ml-logger (its server and client) and pycurl, apart from the project's
# .venv. relaunch's side of every measurement runs with the project's
# .venv/bin/python (scripts/test.sh or scripts/demo.sh builds it); the
# peer's side with this one, in the same run, as subprocesses.
#
#   bash bench/files/setup.sh      # idempotent; a few minutes the first time
#
# BENCH_VENV  where the environment lives   [default: bench/files/.venv]
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${BENCH_VENV:-$HERE/.venv}"
PY="$VENV/bin/python"
# Versions the figures in BENCHMARKS.md were measured with.
# params-proto 3 dropped the API ml-logger's server imports (ParamsProto).
REQUIREMENTS=(ml-logger==0.10.36 params-proto==2.13.2 pycurl==7.49.0)

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

want="$(printf '%s\n' "${REQUIREMENTS[@]}" | sha256sum | cut -d' ' -f1)"
stamp="$VENV/.requirements.sha256"
if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] \
    && "$PY" -c 'import ml_logger.server, params_proto, pycurl' 2>/dev/null; then
    exit 0
fi
# pycurl builds from source where no wheel fits its platform: it needs
# libcurl's headers and curl-config, and OpenSSL's headers.
if ! command -v curl-config >/dev/null; then
    echo "==> installing libcurl4-openssl-dev libssl-dev (pycurl's build)" >&2
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        libcurl4-openssl-dev libssl-dev
fi
echo "==> creating $VENV with ${REQUIREMENTS[*]}" >&2
rm -rf "$VENV"
python3 -m venv "$VENV"
"$PY" -m pip install --quiet --upgrade pip
"$PY" -m pip install --quiet "${REQUIREMENTS[@]}"
echo "$want" >"$stamp"
