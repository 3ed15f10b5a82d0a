#!/usr/bin/env bash
# Install what a fresh machine lacks. `build`: a Rust toolchain with cargo,
# and nats-server for the cluster tests. `pgo`: what the profile-guided
# release build needs (loadtests/scripts/pgo-build.sh): the llvm-profdata
# of rustc's own LLVM (Debian's llvm-N), wrk, h2load, openssl and curl.
# `bench`: also wrk, varnish, nginx, h2load (nghttp2-client) and k6. `package`: cargo-deb and dpkg-deb.
# `conformance`: h2spec (with go install), openssl, node and python3.
# Idempotent; quiet when all is present.
set -euo pipefail
what="${1:-build}"

apt_updated=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    echo "ensure-deps: need root to apt-get install $*" >&2
    return 1
  fi
  if [ "$apt_updated" = 0 ]; then
    apt-get update -qq
    apt_updated=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    echo "ensure-deps: cargo is in ~/.cargo/bin; add it to PATH" >&2
  else
    echo "ensure-deps: installing Debian's Rust toolchain" >&2
    apt_install rustc-web cargo-web rust-web-src
  fi
fi

# The cluster tests (host/inlay/tests/cluster*.rs) start nats-server with
# JetStream; without it they say so and are skipped.
if [ "$what" = build ] && ! command -v nats-server >/dev/null 2>&1 && [ ! -x /usr/sbin/nats-server ]; then
  echo "ensure-deps: installing nats-server (Debian) for the cluster tests" >&2
  apt_install nats-server || echo "ensure-deps: nats-server could not be installed: the cluster tests will be SKIPPED" >&2
fi

if [ "$what" = pgo ]; then
  llvm=$(rustc -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
  if ! command -v "llvm-profdata-$llvm" >/dev/null 2>&1; then
    echo "ensure-deps: installing llvm-$llvm (Debian) for its llvm-profdata, rustc's LLVM being $llvm" >&2
    apt_install "llvm-$llvm" || {
      echo "ensure-deps: no llvm-profdata-$llvm: \`make build PGO=off\` builds without profile guidance" >&2
      exit 1
    }
  fi
  command -v wrk >/dev/null 2>&1 || apt_install wrk
  command -v h2load >/dev/null 2>&1 || apt_install nghttp2-client
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  command -v curl >/dev/null 2>&1 || apt_install curl
fi

if [ "$what" = package ]; then
  command -v dpkg-deb >/dev/null 2>&1 || apt_install dpkg
  # Pinned: the package test builds from the debug profile, which later
  # cargo-deb releases say they will refuse. 3.8.0 needs Rust 1.85; its
  # install compiled in 35 s (58 s of CPU) on the 2-core machine.
  cargo_deb_version=3.8.0
  if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $cargo_deb_version" ]; then
    echo "ensure-deps: installing cargo-deb $cargo_deb_version (about a minute)" >&2
    cargo install --locked --quiet cargo-deb --version "$cargo_deb_version"
  fi
fi

# Builds the Go tool $1 with `go install $2` (taking $3) unless it is on
# PATH or in ~/go/bin; Go itself on PATH or in /usr/local/go.
go_tool() {
  command -v "$1" >/dev/null 2>&1 || [ -x "$HOME/go/bin/$1" ] && return 0
  local gobin
  gobin="$(command -v go || true)"
  [ -n "$gobin" ] || [ ! -x /usr/local/go/bin/go ] || gobin=/usr/local/go/bin/go
  if [ -z "$gobin" ]; then
    echo "ensure-deps: $1 is missing and so is Go (https://go.dev/dl)" >&2
    exit 1
  fi
  echo "ensure-deps: building $2 with go install ($3)" >&2
  "$gobin" install "$2"
}

if [ "$what" = conformance ]; then
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  command -v python3 >/dev/null 2>&1 || apt_install python3
  command -v node >/dev/null 2>&1 || apt_install nodejs npm
  go_tool h2spec github.com/summerwind/h2spec/cmd/h2spec@v2.2.1+incompatible "about a minute"
fi

if [ "$what" = bench ]; then
  command -v wrk >/dev/null 2>&1 || apt_install wrk
  command -v varnishd >/dev/null 2>&1 || [ -x /usr/sbin/varnishd ] || apt_install varnish
  command -v python3 >/dev/null 2>&1 || apt_install python3
  # The tls section: nginx (its package's service is not used: the harness runs its own),
  # h2load and the openssl CLI (certificates, s_time).
  command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || apt_install nginx
  # The compression section: nginx's brotli filter beside its gzip.
  [ -f /usr/lib/nginx/modules/ngx_http_brotli_filter_module.so ] || apt_install libnginx-mod-http-brotli-filter
  command -v h2load >/dev/null 2>&1 || apt_install nghttp2-client
  command -v openssl >/dev/null 2>&1 || apt_install openssl
  # k6 v1.8.1 needs a recent Go.
  GOFLAGS=-mod=mod go_tool k6 go.k6.io/k6@v1.8.1 "a few minutes"
fi
