# Inlay: the two commands of the README are `make demo` and `make test`.
# Both install what is missing (Rust toolchain fallbacks, Debian packages).

SHELL := /bin/bash
CARGO ?= cargo
DEMO_ORIGIN ?= 127.0.0.1:8080
DEMO_LISTEN ?= 127.0.0.1:6081
DEMO_POLICY ?= headers

# The binaries the demo and the benchmarks run, and the tool that turns
# policies into components, in one cargo run so they share dependencies (on
# its own the tool compiles wasmparser and wit-component again, with other
# features).
BINARIES := -p inlay -p inlay-origin -p inlay-componentize

# `make demo` builds into target/demo with a profile made for building fast:
# no LTO (thin LTO of inlay alone took half of the release build's time),
# opt-level 1 (a sixth less CPU than 3; the demo serves as it should). The
# benchmarks keep [profile.release].
DEMO_PROFILE := --profile demo --config 'profile.demo.inherits="release"' \
	--config 'profile.demo.lto="off"' --config profile.demo.opt-level=1 \
	--config profile.demo.codegen-units=16 --config profile.demo.debug=false

.PHONY: demo test build deps bench bench-quick vendor-check conformance hostile scale package cluster-demo components

include Makefile.policies

# Tools the build needs that a fresh machine of this kind may lack.
deps:
	@bash loadtests/scripts/ensure-deps.sh build

# The release binaries in target/release, inlay itself profile-guided
# (PGO): built instrumented, trained on loopback traffic (a component, hits,
# passes, ESI, a policy, TLS), built again with the profile
# (loadtests/scripts/pgo-build.sh; about 45 minutes on 2 cores from
# scratch, and it needs rustc's LLVM's llvm-profdata, which `ensure-deps.sh
# pgo` installs). Measured against the plain build (docs/performance.md,
# "This round (stop 43)"): 1.19-1.43x its cache hits and policy requests,
# 1.59-1.76x a 0.3 component's. `make build PGO=off`: the plain release
# build (whole-program LTO, about 11 minutes).
PGO ?= on
build:
ifeq ($(PGO),off)
	$(CARGO) build --release $(BINARIES)
else
	@bash loadtests/scripts/ensure-deps.sh pgo
	$(CARGO) build --release -p inlay-origin -p inlay-componentize
	bash policies/build.sh headers
	bash policies/components/build.sh rs
	bash loadtests/scripts/pgo-build.sh
endif

# The policy scripts use the inlay-componentize these targets build.
build bench bench-quick package: export INLAY_COMPONENTIZE := $(CURDIR)/target/release/inlay-componentize
demo: export INLAY_COMPONENTIZE := $(CURDIR)/target/demo/inlay-componentize
test: export INLAY_COMPONENTIZE := $(CURDIR)/target/debug/inlay-componentize
components: export INLAY_COMPONENTIZE := $(CURDIR)/target/debug/inlay-componentize

# The main job: the demo origin, and inlay in front of it on the embedded
# default config with a Wasm policy; ESI pages assembled in parallel. It
# builds only what it runs: the two binaries and the policy it serves.
demo: deps
	$(CARGO) build $(DEMO_PROFILE) $(BINARIES)
	bash policies/build.sh $(DEMO_POLICY)
	@bash loadtests/scripts/demo.sh "$(DEMO_ORIGIN)" "$(DEMO_LISTEN)" "target/policies/$(DEMO_POLICY).wasm" target/demo

# Three inlay nodes in one cluster on nats-server (docs/cluster.md); the
# demo origin behind them. Installs nats-server where it is missing.
cluster-demo: export INLAY_COMPONENTIZE := $(CURDIR)/target/demo/inlay-componentize
cluster-demo: deps
	$(CARGO) build $(DEMO_PROFILE) $(BINARIES)
	bash policies/build.sh default headers
	@bash loadtests/scripts/cluster-demo.sh target/demo

# Every test: the vendored crate against its release and patches, formatting,
# lints, the bench harness's unit tests, unit and integration tests (host,
# storage, origin, SDK), the policies' native tests and the other languages'
# tests.
# One debug build serves the tests and builds the binaries they start (and
# the componentize tool); the policies are built between it and the runs.
test: deps vendor-check
	$(CARGO) fmt --all -- --check
	python3 loadtests/scripts/check-doc-links.py
	# The bench harness's own unit tests (no servers, no load; seconds).
	python3 -m unittest discover -s loadtests/bench -p 'test_*.py'
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace --no-run
	bash policies/build.sh --test
	bash policies/build-lang.sh --test
	bash policies/components/build.sh
	$(CARGO) test --workspace
	# The policy tests again with a fresh instance per request (the
	# default reuses instances): both modes must hold. --workspace keeps
	# the features of the build above (`-p inlay-runtime` alone would
	# build wasmtime again with fewer).
	INLAY_TEST_REQUESTS_PER_INSTANCE=1 $(CARGO) test --workspace --lib
	INLAY_TEST_REQUESTS_PER_INSTANCE=1 $(CARGO) test --workspace --test server -- policies::
	bash loadtests/scripts/package-test.sh

# The Debian package, target/debian/inlay_<version>-1_amd64.deb, from the
# release build (`make build`, profile-guided unless PGO=off;
# docs/debian-package.md); the man pages come from the
# binary's clap definitions. `make test` checks the same layout built from
# the debug binary (loadtests/scripts/package-test.sh).
package: deps build
	@bash loadtests/scripts/ensure-deps.sh package
	rm -rf target/release/man && mkdir -p target/release/man
	target/release/inlay manpages target/release/man
	gzip -9n target/release/man/*.1
	# The line tables move to /usr/lib/debug/.build-id/ (zlib, which Rust's
	# backtraces read): /usr/bin/inlay is 26 MB instead of 140.
	$(CARGO) deb -p inlay --no-build --locked -o target/debian/ \
		--separate-debug-symbols --compress-debug-symbols=zlib

# The example wasi:http components (Rust, JavaScript, Python) that Inlay
# serves as backends (`inlay serve --component`), at
# target/components/<name>.wasm (docs/components.md).
components:
	$(CARGO) build -p inlay-componentize
	bash policies/components/build.sh

# vendor/wasmtime and vendor/hyper must be their crates.io releases plus the
# patches in vendor/wasmtime-patches and vendor/hyper-patches (README.md
# there); about a second each, and needs crates.io unless cargo's cache has
# the releases.
vendor-check:
	@bash vendor/check.sh

bench: deps build policies
	bash loadtests/bench/run.sh full

bench-quick: deps build policies
	bash loadtests/bench/run.sh quick

# The public HTTP cache test suite (cache-tests.fyi) run through Inlay as the
# suite runs Varnish, and h2spec over TLS and h2c (fails when an h2spec case
# does); results and score in loadtests/reports/conformance/.
conformance:
	@bash loadtests/scripts/ensure-deps.sh conformance
	bash loadtests/conformance/run.sh

# Hostile traffic on loopback beside a normal client (about 1 min 40 s;
# loadtests/README.md, "Hostile traffic"). Fails when the client's p99 under
# attack passes 2x its quiet p99 or Inlay's RSS passes the bound.
hostile: deps build
	$(CARGO) build --release -p inlay-loadtools
	bash loadtests/scripts/hostile.sh

# The disk tier with 1k and 1M small objects (loadtests/reports/scale.md);
# the 1M fill takes a quarter of an hour and 4.5 GB of /tmp.
scale:
	$(CARGO) build --release -p inlay-loadtools
	bash loadtests/scripts/scale.sh
