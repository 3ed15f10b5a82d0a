#!/usr/bin/env bash
# `make scale`: the disk tier at scale (issue 17, item 11).
#
# Fills a disk tier with 1k and with $SCALE_COUNT (1M) small objects through
# the storage crate's API (inlay-scale fill), then reopens each as a restart
# would (inlay-scale probe): time from main() to the first hit, RSS per
# object, lookup p50/p99 at both sizes once the background count has read
# every record (--settle), and the same lookups against a memory-only
# store of as many objects (inlay-scale memory: the floor). The 1M fill
# writes about 1.1 GB (200 B bodies are inline in their records) and took
# 43 s on the shared 2-core machine: run it once, not in a loop.
#
#   SCALE_DIR    where the stores go (/tmp/inlay-scale; removed at the end
#                unless SCALE_KEEP=1; an existing full store is reused)
#   SCALE_COUNT  objects of the large store (1000000)
#   OUT          figures as JSON (loadtests/reports/scale)
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=${BIN:-target/release}
DIR=${SCALE_DIR:-/tmp/inlay-scale}
COUNT=${SCALE_COUNT:-1000000}
OUT=${OUT:-loadtests/reports/scale}
[ -x "$BIN/inlay-scale" ] || { echo "scale: $BIN/inlay-scale missing (cargo build --release -p inlay-loadtools)" >&2; exit 2; }
mkdir -p "$DIR" "$OUT"

for n in 1000 "$COUNT"; do
    store="$DIR/$n"
    if [ -f "$store.filled" ]; then
        echo "scale: reusing $store ($n objects)"
    else
        rm -rf "$store"
        echo "scale: filling $store with $n objects"
        "$BIN/inlay-scale" fill --dir "$store" --count "$n" --json "$OUT/fill-$n.json"
        touch "$store.filled"
    fi
    echo "scale: reopening $store"
    "$BIN/inlay-scale" probe --dir "$store" --count "$n" --settle --json "$OUT/probe-$n.json"
    "$BIN/inlay-scale" memory --count "$n" --json "$OUT/memory-$n.json"
    echo "scale: on disk: $(du -sh "$store" | cut -f1)"
done
if [ "${SCALE_KEEP:-0}" != 1 ]; then
    rm -rf "${DIR:?}/1000" "$DIR/1000.filled" "${DIR:?}/$COUNT" "$DIR/$COUNT.filled"
fi
