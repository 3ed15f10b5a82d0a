#!/usr/bin/env bash
# `make demo`: the test origin as the demo site, inlay in front of it on the
# embedded default config with a Wasm policy. Ctrl-C stops both.
#
#   demo.sh ORIGIN_ADDR LISTEN_ADDR POLICY.wasm [BIN_DIR]
#
# BIN_DIR holds inlay and inlay-origin (target/release unless given).
set -euo pipefail
origin_addr="$1"; listen="$2"; policy="$3"; bin="${4:-target/release}"
cd "$(dirname "$0")/../.."
for exe in "$bin/inlay" "$bin/inlay-origin" "$policy"; do
  [ -f "$exe" ] || { echo "demo: $exe is missing (make demo builds it)" >&2; exit 1; }
done

for addr in "$origin_addr" "$listen"; do
  if (exec 3<>"/dev/tcp/${addr%:*}/${addr##*:}") 2>/dev/null; then
    echo "demo: $addr is already in use; stop what runs there or set DEMO_ORIGIN / DEMO_LISTEN" >&2
    exit 1
  fi
done

"$bin/inlay-origin" --listen "$origin_addr" > /tmp/inlay-demo-origin.log 2>&1 &
origin_pid=$!
trap 'kill $origin_pid ${inlay_pid:-} 2>/dev/null || true' EXIT INT TERM
for _ in $(seq 50); do grep -q listening /tmp/inlay-demo-origin.log 2>/dev/null && break; sleep 0.1; done

# The embedded default config listens on 127.0.0.1:6081 with the backend at
# 127.0.0.1:8080; the flags below only restate it when DEMO_* are changed.
"$bin/inlay" serve -a "$listen" -b "http://$origin_addr" --policy "$policy" &
inlay_pid=$!
for _ in $(seq 100); do
  curl -s -o /dev/null "http://$listen/resp" 2>/dev/null && break
  sleep 0.1
done

cat <<MSG

  Inlay is running at   http://$listen/
  in front of the demo origin at http://$origin_addr/ with policy $policy.

  Try:
    curl -i http://$listen/esi/page?n=10\&delay_ms=100      # 10 slow fragments, assembled in parallel
    curl -i http://$listen/static/16384                     # cached: see Cache-Status and Age
    curl -i -X PURGE http://$listen/static/16384            # purge it
    curl -i "http://$listen/resp?utm_source=x&a=1"          # tracking parameters stripped by the policy

  Open http://$listen/esi/page?n=10&delay_ms=100 in a browser. Ctrl-C stops.

MSG
wait $inlay_pid
