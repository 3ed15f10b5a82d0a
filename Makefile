# Inlay: the two commands of the README are `make demo` and `make test`.
# Both install what is missing (Rust toolchain fallbacks, Debian packages).

SHELL := /bin/bash
CARGO ?= cargo
DEMO_ORIGIN ?= 127.0.0.1:8080
DEMO_LISTEN ?= 127.0.0.1:6081
DEMO_POLICY ?= headers

.PHONY: demo test build lint unit-tests bench bench-quick deps clean-policies vendor-check

include Makefile.policies

# Tools the build needs that a fresh machine of this kind may lack.
deps:
	@bash loadtests/scripts/ensure-deps.sh build

build:
	$(CARGO) build --release -p inlay -p inlay-origin

# The main job: the demo origin, and inlay in front of it on the embedded
# default config with a Wasm policy; ESI pages assembled in parallel.
demo: deps build policies
	@bash loadtests/scripts/demo.sh "$(DEMO_ORIGIN)" "$(DEMO_LISTEN)" "target/policies/$(DEMO_POLICY).wasm"

# Every test: the vendored crate against its release and patches, formatting,
# lints, unit and integration tests (host, storage, origin, SDK), and the
# policies' native tests.
test: deps vendor-check policies
	$(CARGO) fmt --all -- --check
	$(CARGO) build --workspace --bins
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace
	bash policies/build.sh --test
	bash policies/build-lang.sh --test

# vendor/wasmtime must be its crates.io release plus the patches in
# vendor/wasmtime-patches (README.md there); about a second, and needs
# crates.io unless cargo's cache has the release.
vendor-check:
	@bash vendor/check.sh

bench: deps build policies
	bash loadtests/bench/run.sh full

bench-quick: deps build policies
	bash loadtests/bench/run.sh quick
