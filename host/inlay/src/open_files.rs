//! The process's open-file limit (`RLIMIT_NOFILE`) against what the
//! `[server]` limits may hold open at once.
//!
//! A shell's or systemd's soft limit is often 1024 while the hard limit is
//! far higher: with the soft one, `max_connections` (10,000 by default)
//! stopped at about a thousand clients, and the tarpit's refused
//! connections took descriptors that admitted clients then lacked.
//! `inlay serve` raises the soft limit to what the config needs (never past
//! the hard limit, as Go's runtime and nginx's `worker_rlimit_nofile` do)
//! and says so when even the hard limit is short. The tarpit then holds
//! only what admitted connections leave ([`tarpit_bound`]), and when an
//! accept still finds no descriptor, it closes its oldest first
//! (`server.rs`).

use std::sync::atomic::{AtomicU64, Ordering};

use tracing::info;

use crate::config::ServerConfig;

/// The soft limit [`apply`] left (unknown: no bound).
static LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Descriptors kept for everything that is not a client connection:
/// backend connections, the cache's files, the logs, the listeners.
pub const RESERVE: u64 = 1024;

/// Descriptors `server` may hold at once: every admitted connection, every
/// refused one the tarpit holds and those waiting to be closed, plus
/// [`RESERVE`].
pub fn needed(server: &ServerConfig) -> u64 {
    admitted(server) + server.tarpit_max as u64 + crate::server::CLOSER_BACKLOG as u64
}

/// Descriptors for admitted connections and the reserve.
fn admitted(server: &ServerConfig) -> u64 {
    server.max_connections as u64 + RESERVE
}

/// Refused connections the tarpit may hold: `server.tarpit_max`, or fewer
/// when the open-file limit leaves fewer beside what admitted connections
/// and the reserve need (refused connections never take a client's
/// descriptor).
pub fn tarpit_bound(server: &ServerConfig) -> usize {
    tarpit_bound_under(server, LIMIT.load(Ordering::Relaxed))
}

fn tarpit_bound_under(server: &ServerConfig, limit: u64) -> usize {
    let spare = limit.saturating_sub(admitted(server) + crate::server::CLOSER_BACKLOG as u64);
    server
        .tarpit_max
        .min(usize::try_from(spare).unwrap_or(usize::MAX))
}

/// Raise the soft open-file limit to what `server` needs, up to the hard
/// limit, at start and at every reload; the limit and a smaller tarpit are
/// logged. Returns a warning for the operator when admitted connections
/// may not fit or the limit cannot be read or set.
pub fn apply(server: &ServerConfig) -> Option<String> {
    let limit = match rlimit::increase_nofile_limit(needed(server)) {
        Ok(limit) => limit,
        Err(e) => return Some(format!("cannot read or raise the open-file limit: {e}")),
    };
    LIMIT.store(limit, Ordering::Relaxed);
    info!(limit, "open-file limit");
    match shortfall(server, limit)? {
        Shortfall::Clients(warning) => Some(warning),
        Shortfall::Tarpit(note) => {
            info!("{note}");
            None
        }
    }
}

/// What to tell the operator when `limit` is below what `server` needs:
/// a warning when admitted connections may not fit, a note when only the
/// tarpit is smaller than `server.tarpit_max`.
fn shortfall(server: &ServerConfig, limit: u64) -> Option<Shortfall> {
    let admitted = admitted(server);
    if limit < admitted {
        return Some(Shortfall::Clients(format!(
            "the open-file limit is {limit}, below the {admitted} that server.max_connections \
             ({}) needs with a reserve of {RESERVE}: past it, new clients wait (raise the hard \
             limit, e.g. LimitNOFILE= in the systemd unit, or lower server.max_connections)",
            server.max_connections
        )));
    }
    let bound = tarpit_bound_under(server, limit);
    (bound < server.tarpit_max).then(|| {
        Shortfall::Tarpit(format!(
            "the open-file limit is {limit}: the tarpit holds at most {bound} refused connections, \
             not server.tarpit_max ({}); beside server.max_connections ({}) and a reserve of \
             {RESERVE} there are no more descriptors",
            server.tarpit_max, server.max_connections
        ))
    })
}

/// What [`shortfall`] found short.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Shortfall {
    /// Admitted connections may run out of descriptors (a warning).
    Clients(String),
    /// Only the tarpit holds fewer than configured (a note).
    Tarpit(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::server::CLOSER_BACKLOG;

    fn server(extra: &str) -> ServerConfig {
        Config::from_toml(&format!(
            "[server]\n{extra}\n[backends.default]\naddress = \"http://127.0.0.1:9\"\n"
        ))
        .unwrap()
        .server
    }

    #[test]
    fn refused_connections_get_only_the_descriptors_admitted_ones_leave() {
        let s = server("max_connections = 100\ntarpit_max = 50");
        let need = 100 + 50 + CLOSER_BACKLOG as u64 + RESERVE;
        assert_eq!(needed(&s), need);
        assert_eq!(shortfall(&s, need), None);
        assert_eq!(tarpit_bound_under(&s, need), 50);
        // Ten short: the tarpit gives them up, the clients keep theirs.
        assert_eq!(tarpit_bound_under(&s, need - 10), 40);
        let Some(Shortfall::Tarpit(note)) = shortfall(&s, need - 10) else {
            panic!("a note about the tarpit");
        };
        assert!(note.contains("at most 40 refused"), "{note}");
        assert_eq!(tarpit_bound_under(&s, 100 + RESERVE), 0);
        // Short for admitted clients: a warning naming the setting.
        let Some(Shortfall::Clients(warning)) = shortfall(&s, 1000) else {
            panic!("a warning about clients");
        };
        assert!(
            warning.contains("open-file limit is 1000")
                && warning.contains("server.max_connections (100)"),
            "{warning}"
        );
    }
}
