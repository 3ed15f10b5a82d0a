//! The proxy's behaviour, area by area, in the test process: each module
//! is one area of the pipeline (`cache`, `esi`, `proxy`, `websocket`,
//! `http3`, `policies`, `components`, ...), and `common::Harness` runs the
//! real config loading, policy runtime, pipeline and server on
//! `127.0.0.1:0` in front of the test origin. Process-level behaviour
//! (signals, kill -9, a full disk) is in `tests/process/`.
//!
//! One test binary, not one per area: each links all of wasmtime (about
//! 200 MB in a debug build), and twenty-one of them filled a CI machine's
//! disk. Run one area with a filter: `cargo test -p inlay --test server
//! -- cache::`. The layout rule: `docs/ARCHITECTURE.md`.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod backends;
mod cache;
mod cluster;
mod cluster_auth;
mod cluster_fanout;
mod cluster_kv;
mod cluster_rollout;
mod cluster_shard;
mod components;
mod compression;
mod esi;
mod h2_limits;
mod http3;
mod metrics;
mod policies;
mod proxy;
mod proxy_protocol;
mod reload_store;
mod tls;
mod websocket;
