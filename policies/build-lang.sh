#!/usr/bin/env bash
# Build the JavaScript, Python, C and Go policies in policies/ (folders named
# <name>-js, <name>-py, <name>-c, <name>-go) to WebAssembly components at
# target/policies/<folder>.wasm, next to the Rust ones from build.sh.
#
#   policies/build-lang.sh              build what changed, every language
#   policies/build-lang.sh js c         only these languages (js, py, c, go)
#   policies/build-lang.sh --test       then run the SDKs' native tests and the
#                                       conformance tests: every language's
#                                       headers and ab-test, and the Rust ones
#                                       (build.sh first), in node via jco
#
# Toolchains, installed when missing, pinned (registries only, no downloads
# of prebuilt toolchains):
#   js  ComponentizeJS 0.23.0 (npm ci in guest-sdk/js, package-lock.json);
#       node and npm from apt-get when absent
#   py  componentize-py 0.25.1 (pip, guest-sdk/python/requirements.txt) in a
#       venv at target/lang/python-venv
#   c   Debian clang-19, lld-19, wasi-libc, libclang-rt-19-dev-wasm32; the
#       bindings come from `inlay-componentize c-bindings` (the wit-bindgen-c
#       0.60 library, what `wit-bindgen c` runs)
#   go  the standard Go toolchain, 1.25 or later (GOOS=wasip1,
#       -buildmode=c-shared); not installed here (Debian's is too old): the
#       Go ports are skipped, with a line saying so, where `go` is missing,
#       unless `go` is asked for by name. The bindings are committed
#       (guest-sdk/go/bindgen.sh; --test checks them against the WIT)
# The components import only inlay:policy interfaces, no WASI: JS is built
# with every ComponentizeJS feature disabled, Python with --stub-wasi, C
# without stdio, Go with Inlay's WASI preview 1 adapter (inlay-componentize
# encode, guest-sdk/go/adapter). Each output is rebuilt only when its
# policy, its SDK, the WIT or the pinned toolchain is newer, so a run with
# nothing changed takes about a second.
#
# Environment:
#   INLAY_LANG_DIR     toolchains and generated bindings (target/lang)
#   CARGO_TARGET_DIR   target dir of inlay-componentize (<repo>/target)
#   INLAY_COMPONENTIZE an inlay-componentize already built: not built here
set -euo pipefail

started=$(date +%s)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
policies="$root/policies"
sdk="$root/guest-sdk"
wit="$sdk/wit"
out="$root/target/policies"
work="${INLAY_LANG_DIR:-$root/target/lang}"
tool_target_dir="${CARGO_TARGET_DIR:-$root/target}"

CLANG=clang-19
run_tests=false
langs=()

for arg in "$@"; do
    case "$arg" in
        --test) run_tests=true ;;
        js|py|c|go) langs+=("$arg") ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "build-lang.sh: unknown argument $arg (try --help)" >&2; exit 2 ;;
    esac
done
go_asked=false
[[ " ${langs[*]} " == *" go "* ]] && go_asked=true
[ "${#langs[@]}" -gt 0 ] || langs=(js py c go)

log() { echo "policies-lang: $*" >&2; }
die() { echo "policies-lang: error: $*" >&2; exit 1; }
wants() { [[ " ${langs[*]} " == *" $1 "* ]]; }

apt_install() {
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null || die "need root (or sudo) to apt-get install $*"
        sudo=(sudo)
    fi
    command -v apt-get >/dev/null || die "no apt-get: install $* yourself"
    log "installing $* with apt-get"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

# True when $1 is missing or any file under the other arguments is newer.
stale() {
    local target=$1
    shift
    [ -f "$target" ] || return 0
    [ -n "$(find "$@" -type f -newer "$target" -print -quit 2>/dev/null)" ]
}

mkdir -p "$out" "$work"
command -v cargo >/dev/null || die "cargo not found (install Rust with rustup)"

# --- the componentize tool: C bindings, encodes C core modules, checks outputs -
tool="${INLAY_COMPONENTIZE:-$tool_target_dir/release/inlay-componentize}"
# build.sh has usually just built it: skip cargo (and its build lock) when
# neither its sources nor Cargo.lock changed since the last check.
tool_stamp="$work/.componentize-built"
if [ -z "${INLAY_COMPONENTIZE:-}" ] &&
    { [ ! -x "$tool" ] || stale "$tool_stamp" "$sdk/componentize" "$root/Cargo.lock"; }; then
    log "building inlay-componentize"
    CARGO_TARGET_DIR="$tool_target_dir" cargo build --release -q \
        --manifest-path "$root/Cargo.toml" -p inlay-componentize
    touch "$tool_stamp"
fi
[ -x "$tool" ] || die "inlay-componentize was not built at $tool"

built=() fresh=0

# Record one output: check it is a policy component importing no WASI.
finish() {
    local name=$1 seconds=$2 report
    report=$("$tool" check "$out/$name.wasm") || die "$name.wasm is not a valid policy component"
    if grep -q 'wasi:' <<<"$report"; then
        die "$name.wasm imports WASI, which the host does not give policies: $report"
    fi
    built+=("$name ($(stat -c %s "$out/$name.wasm") bytes, ${seconds}s)")
}

# --- JavaScript ----------------------------------------------------------------
build_js() {
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        apt_install nodejs npm
    fi
    local js="$sdk/js"
    if stale "$js/node_modules/.package-lock.json" "$js/package-lock.json"; then
        log "installing ComponentizeJS (npm ci in guest-sdk/js)"
        (cd "$js" && npm ci --no-audit --no-fund --loglevel=error)
    fi
    [ -f "$js/node_modules/@bytecodealliance/componentize-js/src/cli.js" ] ||
        die "ComponentizeJS is missing in $js/node_modules"
    # ComponentizeJS's command line, with its generated glue made cheaper
    # per call (guest-sdk/js/build/glue.mjs).
    local cli="$js/build/componentize.mjs"
    local dir name t0
    for dir in "$policies"/*-js; do
        [ -f "$dir/policy.js" ] || continue
        name=$(basename "$dir")
        if ! stale "$out/$name.wasm" "$dir" "$js/src" "$js/build" "$wit" "$js/package-lock.json"; then
            fresh=$((fresh + 1))
            continue
        fi
        t0=$(date +%s)
        # Run from the repository root: ComponentizeJS maps the current folder
        # into the engine, so the policy's relative import of the SDK resolves.
        # Every feature is disabled: the component imports no WASI.
        (cd "$root" && node "$cli" "policies/$name/policy.js" -w guest-sdk/wit -n policy \
            -d stdio -d random -d clocks -d http -d fetch-event \
            -o "target/policies/$name.wasm.tmp")
        mv "$out/$name.wasm.tmp" "$out/$name.wasm"
        finish "$name" $(( $(date +%s) - t0 ))
    done
}

# --- Python --------------------------------------------------------------------
build_py() {
    local venv="$work/python-venv" requirements="$sdk/python/requirements.txt"
    if [ ! -x "$venv/bin/python" ]; then
        command -v python3 >/dev/null || apt_install python3 python3-venv
        python3 -m venv "$venv" 2>/dev/null || { apt_install python3-venv; python3 -m venv "$venv"; }
    fi
    if stale "$venv/.requirements-installed" "$requirements"; then
        log "installing componentize-py (pip, $requirements)"
        "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements"
        touch "$venv/.requirements-installed"
    fi
    local cpy="$venv/bin/componentize-py" dir name t0
    for dir in "$policies"/*-py; do
        [ -f "$dir/app.py" ] || continue
        name=$(basename "$dir")
        if ! stale "$out/$name.wasm" "$dir" "$sdk/python/inlay_policy" "$wit" "$venv/.requirements-installed"; then
            fresh=$((fresh + 1))
            continue
        fi
        t0=$(date +%s)
        # --stub-wasi: WASI imports become trapping stubs (the host gives none).
        "$cpy" -d "$wit" -w policy componentize --stub-wasi \
            -p "$dir" -p "$sdk/python" app -o "$out/$name.wasm.tmp" >/dev/null
        mv "$out/$name.wasm.tmp" "$out/$name.wasm"
        finish "$name" $(( $(date +%s) - t0 ))
    done
}

# --- C ---------------------------------------------------------------------------
build_c() {
    local packages=(clang-19 lld-19 wasi-libc libclang-rt-19-dev-wasm32) missing=()
    local p
    for p in "${packages[@]}"; do
        dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ "${#missing[@]}" -eq 0 ] || apt_install "${missing[@]}"
    command -v "$CLANG" >/dev/null || die "$CLANG is not on PATH after installing ${packages[*]}"

    # What `wit-bindgen c "$wit" -w policy` writes, from the tool built above.
    local gen="$work/c/gen"
    if stale "$gen/policy_component_type.o" "$wit" "$tool"; then
        rm -rf "$gen"
        "$tool" c-bindings "$wit" --world policy --out-dir "$gen" >/dev/null \
            || die "generating the C bindings of $wit failed"
    fi
    local dir name t0 core
    for dir in "$policies"/*-c; do
        [ -f "$dir/policy.c" ] || continue
        name=$(basename "$dir")
        if ! stale "$out/$name.wasm" "$dir" "$sdk/c" "$gen" "$tool"; then
            fresh=$((fresh + 1))
            continue
        fi
        t0=$(date +%s)
        core="$work/c/$name.core.wasm"
        # wasi-libc gives malloc and string functions, which import nothing;
        # the component-type object carries the world for wit-component.
        "$CLANG" --target=wasm32-wasi -O2 -mexec-model=reactor -std=c11 \
            -Wall -Wextra -Werror -Wl,--strip-debug \
            -I "$gen" -I "$sdk/c/include" \
            "$dir"/*.c "$sdk/c/src/inlay_policy.c" "$gen/policy.c" \
            "$gen/policy_component_type.o" -o "$core"
        "$tool" encode "$core" -o "$out/$name.wasm" >/dev/null
        finish "$name" $(( $(date +%s) - t0 ))
    done
}

# --- Go ----------------------------------------------------------------------------
# The Go policies are modules of their own (go.mod: the SDK by a replace
# directive); a reactor (c-shared) build exports _initialize, which the
# component runs at instantiation. -checklinkname=0: the bindings' runtime
# package reaches runtime.sbrk through go:linkname, for cabi_realloc calls
# made before the Go runtime is initialised.
GO_MIN=1.25
build_go() {
    if ! command -v go >/dev/null; then
        $go_asked && die "go not found: install Go $GO_MIN or later"
        log "go not found: skipping the Go policies (Go $GO_MIN or later builds them)"
        local kept=() lang
        for lang in "${langs[@]}"; do
            [ "$lang" = go ] || kept+=("$lang")
        done
        langs=("${kept[@]}")
        return
    fi
    local version
    version=$(go env GOVERSION)
    version=${version#go}
    if [ "$(printf '%s\n' "$GO_MIN" "$version" | sort -V | head -1)" != "$GO_MIN" ]; then
        die "Go $version is too old: the Go policies need Go $GO_MIN or later (go:wasmexport, runtime.AddCleanup)"
    fi
    local gosdk="$sdk/go" dir name t0 core
    mkdir -p "$work/go"
    for dir in "$policies"/*-go; do
        [ -f "$dir/go.mod" ] || continue
        name=$(basename "$dir")
        if ! stale "$out/$name.wasm" "$dir" "$gosdk" "$wit" "$tool" "$(command -v go)"; then
            fresh=$((fresh + 1))
            continue
        fi
        t0=$(date +%s)
        core="$work/go/$name.core.wasm"
        # GOTOOLCHAIN=local: never fetch another Go; -s -w: no symbol or DWARF
        # tables (the name section stays, for the host's trap messages).
        (cd "$dir" && GOOS=wasip1 GOARCH=wasm GOTOOLCHAIN=local GOFLAGS=-buildvcs=false \
            go build -buildmode=c-shared -trimpath -ldflags='-checklinkname=0 -s -w' -o "$core" .)
        "$tool" encode --wit "$wit" "$core" -o "$out/$name.wasm" >/dev/null
        finish "$name" $(( $(date +%s) - t0 ))
    done
}

for lang in js py c go; do
    if wants "$lang"; then
        "build_$lang"
    fi
done

for line in "${built[@]}"; do
    log "built $line"
done
log "${#built[@]} built, $fresh up to date, in $(( $(date +%s) - started ))s -> $out"

# --- tests -------------------------------------------------------------------------
if $run_tests && wants py; then
    # The Python SDK and ports natively, on the generated bindings.
    bindings="$work/python-bindings"
    if stale "$bindings/wit_world/__init__.py" "$wit" "$work/python-venv/.requirements-installed"; then
        rm -rf "$bindings"
        "$work/python-venv/bin/componentize-py" -d "$wit" -w policy bindings "$bindings" >/dev/null
    fi
    log "python unit tests"
    PYTHONPATH="$bindings:$sdk/python" "$work/python-venv/bin/python" -m unittest discover \
        -s "$sdk/python/tests"
fi
if $run_tests && wants go; then
    # The committed bindings are those of the WIT; the SDK and the ports
    # natively, on policytest's in-memory host.
    bash "$sdk/go/bindgen.sh" --check
    log "go unit tests"
    unformatted=$(gofmt -l "$sdk/go" "$policies"/*-go)
    [ -z "$unformatted" ] || die "not gofmt-formatted: $unformatted"
    (cd "$sdk/go" && GOTOOLCHAIN=local go vet ./policy ./policytest &&
        GOTOOLCHAIN=local GOOS=wasip1 GOARCH=wasm go vet ./policy &&
        GOTOOLCHAIN=local go test ./...)
    for dir in "$policies"/*-go; do
        [ -f "$dir/go.mod" ] || continue
        (cd "$dir" && GOTOOLCHAIN=local go vet . && GOTOOLCHAIN=local go test .)
    done
fi
if $run_tests; then
    flags=()
    # Python components use extended constant expressions: node 20 needs the flag.
    if node --experimental-wasm-extended-const -e 0 2>/dev/null; then
        flags+=(--experimental-wasm-extended-const)
    fi
    suffixes=",$(printf -- '-%s,' "${langs[@]}")"
    log "conformance tests: headers and ab-test, suffixes [${suffixes%,}]"
    (cd "$sdk/js" && INLAY_POLICY_SUFFIXES="${suffixes%,}" \
        node "${flags[@]}" --import ./testing/register.mjs --test test/)
fi
