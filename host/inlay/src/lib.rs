//! Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
//!
//! One `inlay` process sits in front of origin servers, as Varnish does.
//! This crate is the process: the command line ([`cli`]), the config
//! ([`config`]), the client listeners' glue to `inlay-listener` ([`listeners`]), the
//! request's path through the host ([`pipeline`], one phase per file), the
//! backends ([`backend`]), the access log ([`access_log`]), config
//! reloads ([`reload`]), the admin API ([`admin`]) and the Prometheus
//! counters ([`metrics`]), and the NATS cluster several nodes share
//! ([`cluster`]). The HTTP
//! model, the cache, ESI, the policy runtime and the listeners (accept,
//! limits, TLS, HTTP serving) are crates of their own (`inlay-core`,
//! `inlay-cache`, `inlay-esi`, `inlay-runtime`, `inlay-listener`); see
//! `docs/ARCHITECTURE.md`.

pub mod access_log;
pub mod admin;
pub mod backend;
pub mod body;
pub mod cli;
pub mod cluster;
pub mod codec;
pub mod config;
pub mod listeners;
pub mod manpage;
pub mod metrics;
pub mod pipeline;
pub mod policy_services;
pub mod reload;
pub mod request_id;
pub mod server_timing;
