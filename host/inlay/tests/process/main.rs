//! Process-level behaviour: the real `inlay` binary, for what only a
//! process shows (signals, kill -9, a full disk, the command line, the
//! memory of the whole process, what it writes on stderr). Every other
//! behaviour is tested in process: `tests/server/<area>.rs` with
//! `common::Harness`. The layout rule: `docs/ARCHITECTURE.md`.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod cli;
mod cluster_fanout;
mod cluster_rollout;
mod cluster_shard;
mod components;
mod diagnostics;
mod disk;
mod memory;
mod open_files;
mod persistence;
mod probes;
mod reload;
mod signals;
mod tls;
