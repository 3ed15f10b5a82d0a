//! The process's open-file limit (`RLIMIT_NOFILE`) against what the
//! listeners may hold open at once.
//!
//! A shell's or systemd's soft limit is often 1024 while the hard limit is
//! far higher: with the soft one, `max_connections` (10,000 by default in
//! Inlay) stopped at about a thousand clients, and the tarpit's refused
//! connections took descriptors that admitted clients then lacked.
//! [`raise`] lifts the soft limit to what the limits need (never past the
//! hard limit, as Go's runtime and nginx's `worker_rlimit_nofile` do) and
//! says what is short when even the hard limit is. The tarpit then holds
//! only what admitted connections leave ([`tarpit_bound`]), and when an
//! accept still finds no descriptor, it closes its oldest first.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::tarpit::CLOSER_BACKLOG;

/// The soft limit [`raise`] left (unknown: no bound).
static LIMIT: AtomicU64 = AtomicU64::new(u64::MAX);

/// Descriptors kept for everything that is not a client connection:
/// backend connections, the cache's files, the logs, the listeners.
pub const RESERVE: u64 = 1024;

/// Descriptors the listeners may hold at once with `max_connections` and
/// `tarpit_max`: every admitted connection, every refused one the tarpit
/// holds and those waiting to be closed, plus [`RESERVE`].
pub fn needed(max_connections: usize, tarpit_max: usize) -> u64 {
    admitted(max_connections) + tarpit_max as u64 + CLOSER_BACKLOG as u64
}

/// Descriptors for admitted connections and the reserve.
pub fn admitted(max_connections: usize) -> u64 {
    max_connections as u64 + RESERVE
}

/// Refused connections the tarpit may hold: `tarpit_max`, or fewer when
/// the open-file limit leaves fewer beside what admitted connections and
/// the reserve need (refused connections never take a client's
/// descriptor).
pub fn tarpit_bound(max_connections: usize, tarpit_max: usize) -> usize {
    tarpit_bound_under(max_connections, tarpit_max, LIMIT.load(Ordering::Relaxed))
}

fn tarpit_bound_under(max_connections: usize, tarpit_max: usize, limit: u64) -> usize {
    let spare = limit.saturating_sub(admitted(max_connections) + CLOSER_BACKLOG as u64);
    tarpit_max.min(usize::try_from(spare).unwrap_or(usize::MAX))
}

/// What the open-file limit leaves short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortfall {
    /// Admitted connections may run out of descriptors: the limit is below
    /// [`admitted`] (`needed`).
    Clients {
        /// Descriptors admitted connections and the reserve need.
        needed: u64,
    },
    /// Only the tarpit holds fewer than `tarpit_max`: at most `bound`.
    Tarpit {
        /// Refused connections the tarpit holds at most.
        bound: usize,
    },
}

/// Raise the soft open-file limit to what `max_connections` and
/// `tarpit_max` need, up to the hard limit, and remember it for
/// [`tarpit_bound`]. Returns the limit now and what it leaves short;
/// `Err` when the limit cannot be read or set.
pub fn raise(max_connections: usize, tarpit_max: usize) -> io::Result<(u64, Option<Shortfall>)> {
    let limit = rlimit::increase_nofile_limit(needed(max_connections, tarpit_max))?;
    LIMIT.store(limit, Ordering::Relaxed);
    Ok((limit, shortfall(max_connections, tarpit_max, limit)))
}

/// What `limit` leaves short of `max_connections` and `tarpit_max`.
fn shortfall(max_connections: usize, tarpit_max: usize, limit: u64) -> Option<Shortfall> {
    let needed = admitted(max_connections);
    if limit < needed {
        return Some(Shortfall::Clients { needed });
    }
    let bound = tarpit_bound_under(max_connections, tarpit_max, limit);
    (bound < tarpit_max).then_some(Shortfall::Tarpit { bound })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refused_connections_get_only_the_descriptors_admitted_ones_leave() {
        let need = 100 + 50 + CLOSER_BACKLOG as u64 + RESERVE;
        assert_eq!(needed(100, 50), need);
        assert_eq!(shortfall(100, 50, need), None);
        assert_eq!(tarpit_bound_under(100, 50, need), 50);
        // Ten short: the tarpit gives them up, the clients keep theirs.
        assert_eq!(tarpit_bound_under(100, 50, need - 10), 40);
        assert_eq!(
            shortfall(100, 50, need - 10),
            Some(Shortfall::Tarpit { bound: 40 })
        );
        assert_eq!(tarpit_bound_under(100, 50, 100 + RESERVE), 0);
        // Short for admitted clients.
        assert_eq!(
            shortfall(100, 50, 1000),
            Some(Shortfall::Clients {
                needed: 100 + RESERVE
            })
        );
    }
}
