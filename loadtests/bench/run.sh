#!/usr/bin/env bash
# The benchmark harness entry point (`make bench` = full, `make bench-quick` =
# quick): installs wrk, varnish and k6 when missing, builds the release
# binaries if absent, then runs harness.py, which writes
# loadtests/reports/latest/{report.md,report.json,*.svg}.
#
#   bash loadtests/bench/run.sh quick|full [--only hits,esi,...] [--keep-workdir] [--pairs N]
#
# Everything listens on 127.0.0.1. The harness stops what it starts; should
# it die without cleaning up, the EXIT trap below stops the process groups
# it recorded in its pid file.
set -euo pipefail
mode="${1:-quick}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"

bash loadtests/scripts/ensure-deps.sh bench
export PATH="$PATH:$HOME/go/bin:/usr/sbin"
if [ ! -x target/release/inlay ] || [ ! -x target/release/inlay-origin ]; then
  cargo build --release -p inlay -p inlay-origin
fi

keep=0
for a in "$@"; do [ "$a" = --keep-workdir ] && keep=1; done
workdir="$(mktemp -d "${TMPDIR:-/tmp}/inlay-bench-XXXXXX")"
export INLAY_BENCH_WORKDIR="$workdir"
cleanup() {
  if [ -f "$workdir/pids" ]; then
    while read -r pid; do
      kill -KILL -- "-$pid" 2>/dev/null || true
    done <"$workdir/pids"
  fi
  [ "$keep" = 1 ] || rm -rf "$workdir"
}
trap cleanup EXIT

python3 loadtests/bench/harness.py "$mode" "$@" &
harness=$!
trap 'kill -TERM "$harness" 2>/dev/null || true' INT TERM
status=0
wait "$harness" || status=$?
# `wait` returns early when a trapped signal arrives: wait for the cleanup.
while kill -0 "$harness" 2>/dev/null; do sleep 0.2; done
exit "$status"
