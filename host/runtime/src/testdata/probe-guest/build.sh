#!/usr/bin/env bash
# Rebuilds ../probe.core.wasm from this crate (run after editing src/ or the WIT).
# Needs Debian's rustc (rust-src for -Zbuild-std): `rustup target add` is not
# available here, so std is built from source for wasm32-unknown-unknown.
set -euo pipefail
cd "$(dirname "$0")"
# rust-lld ships with the rustup toolchain, not with Debian's rustc.
SYSROOT="$(rustc --print sysroot)"
export RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/work/targets/runtime}/probe-guest"
export RUSTFLAGS="-C linker=$SYSROOT/lib/rustlib/x86_64-unknown-linux-gnu/bin/rust-lld"
/usr/bin/cargo build --release --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort
cp "$CARGO_TARGET_DIR/wasm32-unknown-unknown/release/inlay_runtime_probe.wasm" ../probe.core.wasm
ls -l ../probe.core.wasm
