//! Inlay: a WebAssembly edge-worker runtime for HTTP caching and page assembly.
//!
//! One `inlay` process sits in front of origin servers, as Varnish does.
//! This crate is the process, in layers (`docs/ARCHITECTURE.md` draws
//! them; no module imports one above it):
//!
//! - [`cli`] parses the command line and hands each subcommand to the
//!   module that runs it; [`startup`] wires the process (the only module
//!   that sees everything); `reload` builds the next generation from the
//!   config source.
//! - [`admin`] is the admin API; [`listeners`] the client listeners' glue
//!   to `inlay-listener`.
//! - `pipeline` is the request's way through the host, one phase per
//!   file; `backend` the origins it fetches from; `policy_services` what
//!   policies reach of the host; `access_log` its log lines; `tunnels` the
//!   WebSockets open (their count, figures and the copy both ways).
//! - [`config`] is the typed configuration, data only; [`metrics`] a
//!   passive registry; `diagnostics` the diagnostic log.
//!
//! The HTTP model, the config, the cache, ESI, the policy runtime, the
//! listeners and the cluster are crates of their own (`inlay-core`,
//! `inlay-config`, `inlay-cache`, `inlay-esi`, `inlay-runtime`,
//! `inlay-listener`, `inlay-cluster`).

mod access_log;
pub mod admin;
use inlay_backend as backend;
pub mod cli;
/// The typed configuration (crate `inlay-config`).
pub use inlay_config as config;
mod diagnostics;
pub mod listeners;
/// The Prometheus metrics (crate `inlay-metrics`).
pub use inlay_metrics as metrics;
mod pipeline;
mod policy_services;
mod reload;
/// Request ids; public for the `request_id` benchmark.
pub mod request_id;
mod resolve;
pub mod startup;
mod tunnels;
