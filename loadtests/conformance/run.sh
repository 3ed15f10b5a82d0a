#!/usr/bin/env bash
# `make conformance`: the public HTTP cache test suite (cache-tests.fyi) run
# through Inlay, configured as the suite's Docker setup runs Varnish (no
# default TTL, no grace, keep 3600s), and h2spec (HTTP/2, strict cases
# too) over TLS with ALPN h2 and over an h2c:// listener. Writes the
# results and the score tables to loadtests/reports/conformance/; exits 1
# when an h2spec case fails.
#
#   bash loadtests/conformance/run.sh            # build, run, score both
#   bash loadtests/conformance/run.sh h2spec     # h2spec only (or: cache)
#   SUITE=/path/to/cache-tests bash loadtests/conformance/run.sh
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WHAT=${1:-all}
# The suite sits beside the repository (../shared/cache-tests).
SUITE=${SUITE:-$ROOT/../shared/cache-tests}
[ -x "$SUITE/run.sh" ] || SUITE=/work/shared/cache-tests
OUT=${OUT:-$ROOT/loadtests/reports/conformance}
PROFILE=${PROFILE:-debug}
CARGO=${CARGO:-cargo}
# `make deps` (ensure-deps.sh conformance) installs it with go install.
H2SPEC=${H2SPEC:-$(command -v h2spec || echo "$HOME/go/bin/h2spec")}
if [ "$WHAT" != h2spec ]; then
  [ -x "$SUITE/run.sh" ] || { echo "no cache-tests suite at $SUITE (set SUITE=)" >&2; exit 1; }
  command -v node >/dev/null || { echo "node is needed to run the suite" >&2; exit 1; }
fi
if [ "$WHAT" != cache ]; then
  [ -x "$H2SPEC" ] || { echo "no h2spec at $H2SPEC (bash loadtests/scripts/ensure-deps.sh conformance)" >&2; exit 1; }
fi

if [ "$PROFILE" = release ]; then
  "$CARGO" build --release -p inlay -p inlay-origin >&2
else
  "$CARGO" build -p inlay -p inlay-origin >&2
fi
BIN=$ROOT/target/$PROFILE/inlay

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Waits until something listens on 127.0.0.1:$1 (10 s at most).
wait_port() { for _ in $(seq 1 100); do (echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return; sleep 0.1; done; }

TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
mkdir -p "$OUT"

# h2spec: Inlay with an https:// and an h2c:// listener in front of
# inlay-origin. h2c:// and not a plain listener: a plain one speaks
# HTTP/1.1 too, and answers 3.5/2's "INVALID CONNECTION PREFACE" as the
# malformed HTTP/1 request it is (400, RFC 9112 3) where h2spec wants the
# connection closed. The path answers 1 KiB (6.9.2/2 is skipped below 5
# bytes) 20 ms late and uncached: 6.9.1/3 sends HEADERS and then two
# WINDOW_UPDATEs in writes of their own; an answer finished before they
# arrive closes the stream (RST_STREAM NO_ERROR), after which they are
# ignored (RFC 9113 5.1), and on a busy machine h2spec then reported a
# failure in one run of ten or so.
run_h2spec() {
  local origin_port tls_port h2c_port
  origin_port=$(free_port); tls_port=$(free_port); h2c_port=$(free_port)
  openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost \
    -addext subjectAltName=IP:127.0.0.1 -days 2 \
    -keyout "$TMP/h2spec.key" -out "$TMP/h2spec.pem" 2>/dev/null
  "$ROOT/target/$PROFILE/inlay-origin" --listen "127.0.0.1:$origin_port" >/dev/null &
  PIDS+=($!)
  cat >"$TMP/h2spec.toml" <<TOML
[server]
listen = ["https://127.0.0.1:$tls_port", "h2c://127.0.0.1:$h2c_port"]

[[server.tls]]
cert = "$TMP/h2spec.pem"
key = "$TMP/h2spec.key"

[backends.default]
address = "http://127.0.0.1:$origin_port"

[cache]
memory_size = "16MiB"

[log]
level = "error"
access_log = "off"
TOML
  "$BIN" serve --config "$TMP/h2spec.toml" >"$TMP/h2spec-inlay.log" 2>&1 &
  PIDS+=($!)
  wait_port "$origin_port"; wait_port "$tls_port"; wait_port "$h2c_port"
  H2SPEC_FAILED=0
  {
    echo
    echo "| h2spec v2.2.1, strict (-S) | tests | passed | skipped | failed |"
    echo "|---|---|---|---|---|"
  } >"$TMP/h2spec.md"
  h2spec_over tls "TLS, ALPN h2" -t -k -p "$tls_port"
  h2spec_over h2c "h2c:// (prior knowledge)" -p "$h2c_port"
}

# h2spec over NAME (a row LABEL in the table) with the flags that follow.
h2spec_over() {
  local name=$1 label=$2
  shift 2
  # 1 KiB, 20 ms late, uncached (see above).
  "$H2SPEC" -S "$@" -P '/bytes/1024?delay_ms=20&cc=no-store' \
    | sed -e 's/.*\r//' -e 's/\x1b\[[0-9;]*m//g' >"$OUT/h2spec-$name.txt" || H2SPEC_FAILED=1
  # The last line: "146 tests, 146 passed, 0 skipped, 0 failed".
  local summary tests passed skipped failed
  summary=$(grep -E '^[0-9]+ tests, ' "$OUT/h2spec-$name.txt" | tail -1 || true)
  read -r tests passed skipped failed <<<"$(echo "$summary" | tr -dc '0-9 ' | tr -s ' ')"
  if [ -z "$summary" ]; then
    echo "h2spec over $name gave no summary (see $OUT/h2spec-$name.txt)" >&2
    H2SPEC_FAILED=1
  fi
  echo "| $label | ${tests:-?} | ${passed:-?} | ${skipped:-?} | ${failed:-?} |" >>"$TMP/h2spec.md"
  [ "${failed:-1}" = 0 ] || H2SPEC_FAILED=1
}

# The cache suite: Inlay in front of the suite's own origin.
run_cache_suite() {
  ORIGIN_PORT=$(free_port)
  PROXY_PORT=$(free_port)
  while [ "$PROXY_PORT" = "$ORIGIN_PORT" ]; do PROXY_PORT=$(free_port); done
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
  PIDS+=($!)
  wait_port "$PROXY_PORT"

  # The suite's run.sh starts its origin, installs its npm deps (npm ci, from
  # the registry or npm's cache) on first use, and prints the results JSON.
  bash "$SUITE/run.sh" "$PROXY_PORT" "$ORIGIN_PORT" >"$TMP/results.json"
  node -e 'JSON.parse(require("fs").readFileSync(process.argv[1]))' "$TMP/results.json"
  cp "$TMP/results.json" "$OUT/results.json"
  node "$SUITE/score.mjs" "$OUT/results.json" >"$TMP/cache.md"
  for kind in required optimal; do
    node "$SUITE/score.mjs" "$OUT/results.json" --fails "$kind" >"$OUT/fails-$kind.tsv"
  done
}

H2SPEC_FAILED=0
[ "$WHAT" = h2spec ] || run_cache_suite
[ "$WHAT" = cache ] || run_h2spec
# score.md: the cache suite's table, then h2spec's; a part not run keeps
# its last table.
: >"$TMP/score.md"
if [ -f "$TMP/cache.md" ]; then
  cat "$TMP/cache.md" >>"$TMP/score.md"
elif [ -f "$OUT/score.md" ]; then
  sed '/^$/,$d' "$OUT/score.md" >>"$TMP/score.md"
fi
if [ -f "$TMP/h2spec.md" ]; then
  cat "$TMP/h2spec.md" >>"$TMP/score.md"
elif [ -f "$OUT/score.md" ]; then
  sed -n '/^$/,$p' "$OUT/score.md" >>"$TMP/score.md"
fi
cp "$TMP/score.md" "$OUT/score.md"
cat "$OUT/score.md"
echo "results: $OUT/results.json, $OUT/h2spec-*.txt; score: $OUT/score.md" >&2
if [ "$H2SPEC_FAILED" != 0 ]; then
  echo "h2spec: some cases failed (see $OUT/h2spec-*.txt)" >&2
  exit 1
fi
