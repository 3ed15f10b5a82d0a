#!/usr/bin/env bash
# `make conformance`: the public HTTP cache test suite (cache-tests.fyi) run
# through Inlay, configured as the suite's Docker setup runs Varnish (no
# default TTL, no grace, keep 3600s). Writes the results JSON and the score
# table to loadtests/reports/conformance/.
#
#   bash loadtests/conformance/run.sh            # build, run, score
#   SUITE=/path/to/cache-tests bash loadtests/conformance/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
# The suite sits beside the repository (../shared/cache-tests).
SUITE=${SUITE:-$ROOT/../shared/cache-tests}
[ -x "$SUITE/run.sh" ] || SUITE=/work/shared/cache-tests
OUT=${OUT:-$ROOT/loadtests/reports/conformance}
PROFILE=${PROFILE:-debug}
CARGO=${CARGO:-cargo}
[ -x "$SUITE/run.sh" ] || { echo "no cache-tests suite at $SUITE (set SUITE=)" >&2; exit 1; }
command -v node >/dev/null || { echo "node is needed to run the suite" >&2; exit 1; }

if [ "$PROFILE" = release ]; then
  "$CARGO" build --release -p inlay >&2
else
  "$CARGO" build -p inlay >&2
fi
BIN=$ROOT/target/$PROFILE/inlay

# Two free loopback ports: the suite's origin and Inlay.
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
ORIGIN_PORT=$(free_port)
PROXY_PORT=$(free_port)
while [ "$PROXY_PORT" = "$ORIGIN_PORT" ]; do PROXY_PORT=$(free_port); done

TMP=$(mktemp -d)
INLAY=
cleanup() { [ -n "$INLAY" ] && kill "$INLAY" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
cat >"$TMP/inlay.toml" <<TOML
# The suite's Varnish setup: default_ttl=0, default_grace=0 (keep 3600s).
[server]
listen = ["127.0.0.1:$PROXY_PORT"]

[backends.default]
address = "http://127.0.0.1:$ORIGIN_PORT"

[cache]
memory_size = "64MiB"
default_ttl = "0s"
default_grace = "0s"
default_keep = "3600s"

[log]
level = "warn"
access_log = "off"
TOML
"$BIN" check --config "$TMP/inlay.toml" >&2
"$BIN" serve --config "$TMP/inlay.toml" >"$TMP/inlay.log" 2>&1 &
INLAY=$!
for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$PROXY_PORT") 2>/dev/null && break; sleep 0.1; done

mkdir -p "$OUT"
# The suite's run.sh starts its origin, installs its npm deps (npm ci, from
# the registry or npm's cache) on first use, and prints the results JSON.
bash "$SUITE/run.sh" "$PROXY_PORT" "$ORIGIN_PORT" >"$TMP/results.json"
node -e 'JSON.parse(require("fs").readFileSync(process.argv[1]))' "$TMP/results.json"
cp "$TMP/results.json" "$OUT/results.json"
node "$SUITE/score.mjs" "$OUT/results.json" | tee "$OUT/score.md"
for kind in required optimal; do
  node "$SUITE/score.mjs" "$OUT/results.json" --fails "$kind" >"$OUT/fails-$kind.tsv"
done
echo "results: $OUT/results.json, score: $OUT/score.md" >&2
