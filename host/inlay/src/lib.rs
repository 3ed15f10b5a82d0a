//! Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
//!
//! One `inlay` process sits in front of origin servers, as Varnish does.
//! This crate is the process: the command line ([`cli`]), the config
//! ([`config`]), the accept loop and connection limits ([`server`]), TLS on the
//! listeners ([`tls`]) and the PROXY protocol in front of them
//! ([`proxy_protocol`]), the
//! request's path through the host ([`pipeline`], one phase per file), the
//! backends ([`backend`]), the access log ([`access_log`]), config
//! reloads ([`reload`]), the admin API ([`admin`]) and the Prometheus
//! counters ([`metrics`]), and this node's side of the NATS cluster several
//! nodes share (`cluster`). The HTTP
//! model, the cache, ESI, the policy runtime and the cluster are crates of
//! their own (`inlay-core`, `inlay-cache`, `inlay-esi`, `inlay-runtime`,
//! `inlay-cluster`); see `docs/ARCHITECTURE.md`.

pub mod access_log;
pub mod admin;
pub mod backend;
pub mod body;
pub mod cli;
mod cluster;
pub mod codec;
pub mod config;
pub mod manpage;
pub mod metrics;
pub mod open_files;
pub mod pipeline;
pub mod policy_services;
pub mod proxy_protocol;
pub mod reload;
pub mod request_id;
pub mod server;
pub mod server_timing;
pub mod tls;
