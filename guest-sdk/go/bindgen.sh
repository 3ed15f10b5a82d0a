#!/usr/bin/env bash
# The Go SDK's bindings (guest-sdk/go/wit) are generated from the policy
# WIT by `wit-bindgen go` (wit-bindgen-cli 0.63) and committed, as users of
# wit-bindgen's Go generator do: building a Go policy needs only Go.
#
#   guest-sdk/go/bindgen.sh          regenerate them (make go-bindings)
#   guest-sdk/go/bindgen.sh --check  fail if they are not those of the WIT:
#                                    the WIT's digest against the one
#                                    recorded at generation; and, when
#                                    wit-bindgen is installed, a fresh
#                                    generation against the committed files
#
# wit-bindgen-cli is installed when missing, into target/lang/wit-bindgen-0.63
# (cargo install, only its Go generator: about 12 minutes on the 2-core
# machine), or taken from $WIT_BINDGEN. The file
# wit/exports/export_inlay_policy_handler/handler.go is written by hand (the
# generated exports call it) and kept.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
sdk="$root/guest-sdk/go"
wit="$root/guest-sdk/wit"
version=0.63.0
pkg=example.invalid/inlay/guest-sdk/go/wit
stamp="$sdk/wit/WIT.sha256"
tool_root="${INLAY_LANG_DIR:-$root/target/lang}/wit-bindgen-0.63"

log() { echo "go-bindings: $*" >&2; }
die() { echo "go-bindings: error: $*" >&2; exit 1; }

# The digest of every .wit file of the package, in name order.
wit_digest() {
    (cd "$wit" && find . -name '*.wit' -print0 | sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}

# wit-bindgen 0.63 on PATH, in $WIT_BINDGEN or installed here; "" if none
# and $1 is "no-install".
wit_bindgen() {
    local candidate
    for candidate in "${WIT_BINDGEN:-}" "$tool_root/bin/wit-bindgen" "$(command -v wit-bindgen || true)"; do
        if [ -n "$candidate" ] && [ -x "$candidate" ] &&
            [ "$("$candidate" --version 2>/dev/null | cut -d' ' -f2)" = "$version" ]; then
            echo "$candidate"
            return
        fi
    done
    [ "${1:-}" = no-install ] && return
    log "installing wit-bindgen-cli $version (its Go generator) into $tool_root"
    nice -n 19 cargo install -q wit-bindgen-cli --version "$version" --locked \
        --no-default-features --features go --root "$tool_root" >&2
    echo "$tool_root/bin/wit-bindgen"
}

# Generate into $1 (a folder holding the module's wit/).
generate() {
    local tool=$1 out=$2
    rm -rf "$out/wit/imports" "$out/wit/exports/wit_exports"
    local said
    said=$("$tool" go "$wit" --world policy --pkg-name "$pkg" --out-dir "$out/wit" 2>&1) ||
        { echo "$said" >&2; die "wit-bindgen go failed"; }
    wit_digest >"$out/wit/WIT.sha256"
}

if [ "${1:-}" = --check ]; then
    [ -f "$stamp" ] || die "$stamp is missing: run guest-sdk/go/bindgen.sh"
    [ "$(cat "$stamp")" = "$(wit_digest)" ] ||
        die "guest-sdk/wit changed since the Go bindings were generated: run make go-bindings"
    tool=$(wit_bindgen no-install)
    if [ -n "$tool" ]; then
        scratch=$(mktemp -d)
        trap 'rm -rf "$scratch"' EXIT
        mkdir -p "$scratch/wit"
        generate "$tool" "$scratch"
        diff -r -x export_inlay_policy_handler "$scratch/wit" "$sdk/wit" >&2 ||
            die "the committed Go bindings differ from wit-bindgen $version's: run make go-bindings"
        log "up to date (regenerated with wit-bindgen $version and compared)"
    else
        log "up to date with the WIT (wit-bindgen $version is not installed: not regenerated)"
    fi
    exit 0
fi

generate "$(wit_bindgen)" "$sdk"
log "regenerated $sdk/wit from $wit"
