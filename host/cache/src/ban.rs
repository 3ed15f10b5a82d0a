//! Bans, as Varnish has them: an expression on the URL, the host and the
//! stored response ([`BanExpression`]), which removes every object cached
//! before it that matches.
//!
//! A ban is checked lazily: an object found at lookup is tested against
//! every ban at least as new as the object (`ObjectMeta::created_ms`,
//! which neither `Age` nor a 304 refresh moves), and a match removes it
//! (the lookup is a miss). The ban lurker ([`lurker`]) walks the stored
//! objects in the background, removes the banned ones, and then drops the
//! bans it has tested every older object against, so the list shrinks and
//! hits stop paying for old bans.
//!
//! Bans are persisted with the disk tier (written and flushed before
//! [`HttpCache::ban`](crate::HttpCache::ban) returns, loaded when the
//! cache is built), so a restart, even after a crash, never brings a banned
//! object back. A memory-only cache keeps them in memory.

mod expr;
pub mod lurker;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use inlay_storage::BanRecord;
use parking_lot::{Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use expr::{BanExpression, BanSubject, MAX_BAN_CONDITIONS, MAX_BAN_EXPRESSION_LEN};

/// Most bans kept at once; more are refused until the lurker drops some.
pub const MAX_BANS: usize = 100_000;

/// The default bound on the memory of the bans in effect together
/// ([`CacheRules::ban_memory`](crate::CacheRules::ban_memory)).
pub const DEFAULT_BAN_MEMORY: usize = 64 << 20;

/// Why a ban was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BanError {
    /// The expression has no condition.
    #[error("the ban expression is empty")]
    Empty,
    /// The expression is longer than [`MAX_BAN_EXPRESSION_LEN`].
    #[error("the ban expression is {len} bytes; at most {limit} are accepted")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        limit: usize,
    },
    /// The expression does not parse; `pos` is the byte where it fails.
    #[error("ban expression, at byte {pos}: {msg}")]
    Syntax {
        /// Byte offset of the offending token.
        pos: usize,
        /// What is wrong.
        msg: String,
    },
    /// [`MAX_BANS`] bans are kept already.
    #[error("{limit} bans are active; refusing more until the ban lurker has dropped some")]
    TooMany {
        /// The limit.
        limit: usize,
    },
    /// The bans in effect and this one would take more memory than the
    /// budget ([`CacheRules::ban_memory`](crate::CacheRules::ban_memory)).
    #[error(
        "the bans in effect take {used} bytes and this one {needed} more, past the ban memory budget of {limit} bytes (cache.ban_memory); refusing it until the ban lurker has dropped some (simpler regexes take less: a long repetition such as x{{700}} compiles to tens of KiB)"
    )]
    OverBudget {
        /// The memory of the bans in effect, bytes.
        used: usize,
        /// This ban's ([`BanExpression::memory`]).
        needed: usize,
        /// The budget.
        limit: usize,
    },
    /// The ban could not be persisted; it is not in effect.
    #[error("the ban could not be written to the cache's disk tier: {0}")]
    Store(String),
}

/// A ban as the admin API shows it (and its client reads back).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanInfo {
    /// Its id: increasing, in the order bans were added.
    pub id: u64,
    /// The expression as given.
    pub expression: String,
    /// When it was added (unix ms); it applies to objects cached before.
    pub created_ms: u64,
}

/// Counters of bans, cheap to read (atomics) for metrics.
#[derive(Debug, Default)]
pub struct BanStats {
    /// Bans added since start.
    pub added: AtomicU64,
    /// Bans dropped from the list by the lurker since start.
    pub dropped: AtomicU64,
    /// Tests of an object against a ban (at lookup and by the lurker).
    pub tests: AtomicU64,
    /// Objects removed at lookup because a ban matched.
    pub removed_at_lookup: AtomicU64,
    /// Objects removed by the lurker because a ban matched.
    pub removed_by_lurker: AtomicU64,
    /// Walks of the whole store the lurker finished.
    pub lurker_walks: AtomicU64,
}

impl BanStats {
    pub(crate) fn bump(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Adds `other`'s counts to these (a cache that takes over another's
    /// bans counts on from its figures).
    fn carry_from(&self, other: &BanStats) {
        let pairs = [
            (&self.added, &other.added),
            (&self.dropped, &other.dropped),
            (&self.tests, &other.tests),
            (&self.removed_at_lookup, &other.removed_at_lookup),
            (&self.removed_by_lurker, &other.removed_by_lurker),
            (&self.lurker_walks, &other.lurker_walks),
        ];
        for (mine, theirs) in pairs {
            Self::bump(mine, theirs.load(Ordering::Relaxed));
        }
    }

    /// The counters now, with `active` bans in effect taking `memory` bytes.
    pub fn snapshot(&self, active: u64, memory: u64) -> BanCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BanCounts {
            active,
            memory,
            added: get(&self.added),
            dropped: get(&self.dropped),
            tests: get(&self.tests),
            removed_at_lookup: get(&self.removed_at_lookup),
            removed_by_lurker: get(&self.removed_by_lurker),
            lurker_walks: get(&self.lurker_walks),
        }
    }
}

/// A snapshot of [`BanStats`] (for `GET /stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BanCounts {
    /// Bans in effect now.
    pub active: u64,
    /// The memory they take, bytes ([`BanExpression::memory`]), which
    /// [`CacheRules::ban_memory`](crate::CacheRules::ban_memory) bounds.
    #[serde(default)]
    pub memory: u64,
    /// Bans added since start.
    pub added: u64,
    /// Bans dropped by the lurker since start.
    pub dropped: u64,
    /// Tests of an object against a ban.
    pub tests: u64,
    /// Objects removed at lookup.
    pub removed_at_lookup: u64,
    /// Objects removed by the lurker.
    pub removed_by_lurker: u64,
    /// Walks the lurker finished.
    pub lurker_walks: u64,
}

/// One ban in the list.
#[derive(Debug)]
pub(crate) struct Ban {
    pub(crate) id: u64,
    pub(crate) created_ms: u64,
    pub(crate) expr: BanExpression,
}

impl Ban {
    fn info(&self) -> BanInfo {
        BanInfo {
            id: self.id,
            expression: self.expr.as_str().to_owned(),
            created_ms: self.created_ms,
        }
    }

    /// Whether `other` is the same ban (time and expression), whatever its id.
    fn same_as(&self, other: &Ban) -> bool {
        self.created_ms == other.created_ms && self.expr.as_str() == other.expr.as_str()
    }

    /// The persisted form: creation time, then the expression.
    pub(crate) fn record(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + self.expr.as_str().len());
        v.extend_from_slice(&self.created_ms.to_be_bytes());
        v.extend_from_slice(self.expr.as_str().as_bytes());
        v
    }

    /// A ban read back from the store. One that cannot be read bans
    /// everything cached before the restart: losing it could serve objects
    /// it covered.
    fn from_record(rec: &BanRecord, now_ms: u64) -> Ban {
        let parsed = rec.data.as_ref().and_then(|d| {
            let created = u64::from_be_bytes(d.get(..8)?.try_into().ok()?);
            let text = std::str::from_utf8(d.get(8..)?).ok()?;
            Some((created, BanExpression::parse(text).ok()?))
        });
        match parsed {
            Some((created_ms, expr)) => Ban {
                id: rec.id,
                created_ms,
                expr,
            },
            None => {
                tracing::error!(
                    id = rec.id,
                    "a persisted ban could not be read; banning every object cached before now instead"
                );
                Ban {
                    id: rec.id,
                    created_ms: now_ms,
                    expr: BanExpression::everything(),
                }
            }
        }
    }
}

/// The bans in effect, oldest first (ids and creation times both grow).
#[derive(Debug, Default)]
pub(crate) struct BanList {
    bans: RwLock<Vec<Arc<Ban>>>,
    /// Creation time of the newest ban (0: none), read without the lock so
    /// a hit on an object newer than every ban costs one atomic load.
    newest_ms: AtomicU64,
    /// The memory of the bans in the list ([`BanExpression::memory`]).
    memory: AtomicUsize,
    /// The next id to hand out.
    next_id: AtomicU64,
    /// One ban is added at a time (its id and time, then the write).
    pub(crate) adding: tokio::sync::Mutex<()>,
    pub(crate) stats: BanStats,
}

/// The bans of a cache moving to another store
/// ([`BanList::carried_to`]), and the records that store must get.
pub(crate) struct CarriedBans {
    /// The bans in effect on the new store.
    pub(crate) list: BanList,
    /// Records to write (id, data), before `remove`.
    pub(crate) write: Vec<(u64, Vec<u8>)>,
    /// Records of the new store replaced by renumbered ones.
    pub(crate) remove: Vec<u64>,
}

impl BanList {
    /// The list persisted records describe.
    pub(crate) fn from_records(records: &[BanRecord], now_ms: u64) -> BanList {
        let mut bans: Vec<Arc<Ban>> = records
            .iter()
            .map(|r| Arc::new(Ban::from_record(r, now_ms)))
            .collect();
        bans.sort_by_key(|b| b.id);
        // Keep creation times non-decreasing with ids (a clock step
        // backwards between two bans).
        for i in 1..bans.len() {
            if bans[i].created_ms < bans[i - 1].created_ms {
                let b = &bans[i];
                bans[i] = Arc::new(Ban {
                    id: b.id,
                    created_ms: bans[i - 1].created_ms,
                    expr: b.expr.clone(),
                });
            }
        }
        BanList::from_bans(bans)
    }

    /// This list's bans, with their times, on a store that holds
    /// `records`: a store without bans gets ours with their ids; one with
    /// bans of its own keeps them, and the union (a ban in both counted
    /// once) is numbered anew after every id either side used, so that no
    /// record overwrites another and ids still grow with time. The
    /// counters go on from ours.
    pub(crate) fn carried_to(&self, records: &[BanRecord], now_ms: u64) -> CarriedBans {
        let held = BanList::from_records(records, now_ms).bans.into_inner();
        let ours = self.bans.read().clone();
        let extra: Vec<Arc<Ban>> = ours
            .iter()
            .filter(|b| !held.iter().any(|h| h.same_as(b)))
            .cloned()
            .collect();
        let (bans, write, remove) = if held.is_empty() {
            let write = ours.iter().map(|b| (b.id, b.record())).collect();
            (ours, write, Vec::new())
        } else if extra.is_empty() {
            (held, Vec::new(), Vec::new())
        } else {
            let first_id = held.iter().chain(&ours).map(|b| b.id).max().unwrap_or(0) + 1;
            let remove = held.iter().map(|b| b.id).collect();
            let mut merged: Vec<Arc<Ban>> = held.into_iter().chain(extra).collect();
            // Stable: at one time, the store's own ban comes first.
            merged.sort_by_key(|b| b.created_ms);
            let merged: Vec<Arc<Ban>> = merged
                .iter()
                .zip(first_id..)
                .map(|(b, id)| {
                    Arc::new(Ban {
                        id,
                        created_ms: b.created_ms,
                        expr: b.expr.clone(),
                    })
                })
                .collect();
            let write = merged.iter().map(|b| (b.id, b.record())).collect();
            (merged, write, remove)
        };
        let list = BanList::from_bans(bans);
        list.stats.carry_from(&self.stats);
        CarriedBans {
            list,
            write,
            remove,
        }
    }

    /// A list of `bans`, in id order with non-decreasing times.
    fn from_bans(bans: Vec<Arc<Ban>>) -> BanList {
        let list = BanList::default();
        list.next_id
            .store(bans.last().map_or(1, |b| b.id + 1), Ordering::Relaxed);
        list.newest_ms
            .store(bans.last().map_or(0, |b| b.created_ms), Ordering::Relaxed);
        list.memory.store(
            bans.iter().map(|b| b.expr.memory()).sum(),
            Ordering::Relaxed,
        );
        *list.bans.write() = bans;
        list
    }

    /// The id and creation time of the next ban (the caller holds
    /// `adding`), if the list has room for it: fewer than [`MAX_BANS`],
    /// and its memory with theirs within `budget` bytes.
    pub(crate) fn next(
        &self,
        expr: BanExpression,
        now_ms: u64,
        budget: usize,
    ) -> Result<Ban, BanError> {
        let bans = self.bans.read();
        if bans.len() >= MAX_BANS {
            return Err(BanError::TooMany { limit: MAX_BANS });
        }
        let used = self.memory();
        if used.saturating_add(expr.memory()) > budget {
            return Err(BanError::OverBudget {
                used,
                needed: expr.memory(),
                limit: budget,
            });
        }
        let created_ms = bans.last().map_or(now_ms, |b| b.created_ms.max(now_ms));
        Ok(Ban {
            // Ids start at 1.
            id: self.next_id.load(Ordering::Relaxed).max(1),
            created_ms,
            expr,
        })
    }

    /// Puts a ban (from [`BanList::next`], now persisted) in effect.
    pub(crate) fn push(&self, ban: Ban) -> BanInfo {
        let info = ban.info();
        let mut bans = self.bans.write();
        self.next_id.store(ban.id + 1, Ordering::Relaxed);
        self.newest_ms.store(ban.created_ms, Ordering::Release);
        self.memory.fetch_add(ban.expr.memory(), Ordering::Relaxed);
        bans.push(Arc::new(ban));
        BanStats::bump(&self.stats.added, 1);
        info
    }

    /// Creation time of the newest ban (0: none).
    pub(crate) fn newest_ms(&self) -> u64 {
        self.newest_ms.load(Ordering::Acquire)
    }

    /// The bans in effect, oldest first.
    pub(crate) fn infos(&self) -> Vec<BanInfo> {
        self.bans.read().iter().map(|b| b.info()).collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.bans.read().len()
    }

    /// The memory of the bans in effect, bytes.
    pub(crate) fn memory(&self) -> usize {
        self.memory.load(Ordering::Relaxed)
    }

    /// The id of the newest ban.
    pub(crate) fn newest_id(&self) -> Option<u64> {
        self.bans.read().last().map(|b| b.id)
    }

    /// Whether any ban could cover an object created at `created_ms` (one
    /// atomic load: the hit path's test when no ban is that new).
    pub(crate) fn may_cover(&self, created_ms: u64) -> bool {
        created_ms <= self.newest_ms.load(Ordering::Acquire)
    }

    /// The id of a ban that covers the object `subject` describes: one
    /// created at or after the object, whose expression matches.
    pub(crate) fn check(&self, subject: &BanSubject<'_>) -> Option<u64> {
        let created = subject.meta.created_ms;
        if !self.may_cover(created) {
            return None;
        }
        let bans = self.bans.read();
        let first = bans.partition_point(|b| b.created_ms < created);
        let mut tested = 0;
        let hit = bans[first..].iter().find(|b| {
            tested += 1;
            b.expr.matches(subject)
        });
        BanStats::bump(&self.stats.tests, tested);
        hit.map(|b| b.id)
    }

    /// Drops the bans the lurker no longer needs: ids up to `up_to` (they
    /// existed when its walk started) created before `before` (every fill
    /// that started before them has ended). Returns their ids and the
    /// memory they took.
    pub(crate) fn drop_walked(&self, up_to: u64, before: u64) -> (Vec<u64>, usize) {
        let mut bans = self.bans.write();
        let mut dropped = Vec::new();
        let mut freed = 0;
        bans.retain(|b| {
            let drop = b.id <= up_to && b.created_ms < before;
            if drop {
                dropped.push(b.id);
                freed += b.expr.memory();
            }
            !drop
        });
        self.newest_ms
            .store(bans.last().map_or(0, |b| b.created_ms), Ordering::Release);
        self.memory.fetch_sub(freed, Ordering::Relaxed);
        BanStats::bump(&self.stats.dropped, dropped.len() as u64);
        (dropped, freed)
    }
}

/// Dropped bans that free at least this much give the freed heap back
/// to the system ([`give_back_freed_heap`]).
pub(crate) const GIVE_BACK_AT: usize = 1 << 20;

/// Gives the heap freed by dropped bans back to the system. glibc's malloc
/// keeps freed memory for reuse, and compiled regexes are many small
/// allocations spread over its heap, so without this the resident memory
/// of bans that went stays (23 to 260 MB for 300 heavy bans, and still
/// 260 MB once the lurker had dropped them). `malloc_trim` returns every
/// free page of every arena; it runs on the blocking pool when there is
/// one (it walks the heap), after a lurker walk that dropped at least
/// [`GIVE_BACK_AT`] bytes of bans. The `inlay` binary allocates with
/// mimalloc, which gives freed pages back by itself (10 ms after they are
/// freed); this is for glibc's heap: what C libraries allocate, and a
/// program that embeds the crate with the system allocator.
pub(crate) fn give_back_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    fn trim() {
        // SAFETY: malloc_trim takes no pointer and only releases pages of
        // the allocator's free lists; memory in use is not touched.
        unsafe {
            libc::malloc_trim(0);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    fn trim() {}
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => drop(rt.spawn_blocking(trim)),
        Err(_) => trim(),
    }
}

/// The fills in progress by the time they started: a ban may be dropped
/// only once no fill that started before it is still to be stored (the
/// lurker's walk could have passed its key before it was).
///
/// Tickets and bans share one clock: a ban's time is handed out under the
/// same lock, and every ticket after it is dated at least a millisecond
/// later, so an object that arrives in the millisecond of a ban, after it,
/// is not taken for one it covers.
#[derive(Debug, Default)]
pub(crate) struct FillTickets {
    open: Mutex<Tickets>,
}

#[derive(Debug, Default)]
struct Tickets {
    /// Open tickets by time, and how many at that time.
    by_time: BTreeMap<u64, usize>,
    /// The earliest time the next ticket may have (after the last ban).
    floor: u64,
}

/// A fill in progress, from the time its response arrived until it is
/// stored or abandoned; its time is the object's `created_ms`.
#[derive(Debug)]
pub(crate) struct FillTicket {
    cache: Arc<crate::Inner>,
    pub(crate) since_ms: u64,
}

impl FillTickets {
    /// Tickets dated after the bans created up to `newest_ban_ms`.
    pub(crate) fn after(newest_ban_ms: u64) -> FillTickets {
        let tickets = FillTickets::default();
        tickets.open.lock().floor = newest_ban_ms.saturating_add(1);
        tickets
    }

    /// Opens a ticket dated now (or just after the last ban).
    pub(crate) fn open(inner: &Arc<crate::Inner>) -> FillTicket {
        let mut open = inner.tickets.open.lock();
        let since_ms = inlay_storage::now_ms().max(open.floor);
        *open.by_time.entry(since_ms).or_default() += 1;
        FillTicket {
            cache: inner.clone(),
            since_ms,
        }
    }

    /// The time of the oldest fill in progress (`u64::MAX`: none), and
    /// `f()` evaluated under the same lock, so no ticket is opened between.
    pub(crate) fn oldest_with<T>(&self, f: impl FnOnce() -> T) -> (u64, T) {
        let open = self.open.lock();
        let oldest = open.by_time.keys().next().copied().unwrap_or(u64::MAX);
        (oldest, f())
    }

    /// Dates a ban: `make` gets the time now and returns the ban, whose
    /// time later tickets stay after.
    pub(crate) fn date_ban(
        &self,
        make: impl FnOnce(u64) -> Result<Ban, BanError>,
    ) -> Result<Ban, BanError> {
        let mut open = self.open.lock();
        let ban = make(inlay_storage::now_ms())?;
        open.floor = open.floor.max(ban.created_ms.saturating_add(1));
        Ok(ban)
    }
}

impl Drop for FillTicket {
    fn drop(&mut self) {
        let mut open = self.cache.tickets.open.lock();
        if let Some(n) = open.by_time.get_mut(&self.since_ms) {
            *n -= 1;
            if *n == 0 {
                open.by_time.remove(&self.since_ms);
            }
        }
    }
}

/// The host and URL (path and query) a primary key's text holds: `host
/// \u{2} path [\u{2} policy data]`.
pub(crate) fn host_and_url(primary: &str) -> (&str, &str) {
    let mut parts = primary.splitn(3, '\u{2}');
    let host = parts.next().unwrap_or_default();
    let url = parts.next().unwrap_or_default();
    (host, url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inlay_storage::ObjectMeta;

    fn ban(list: &BanList, expr: &str, now: u64) -> BanInfo {
        let b = list
            .next(BanExpression::parse(expr).unwrap(), now, usize::MAX)
            .unwrap();
        list.push(b)
    }

    fn subject(meta: &ObjectMeta) -> BanSubject<'_> {
        BanSubject {
            url: Some("/a"),
            host: Some("h"),
            meta,
        }
    }

    #[test]
    fn only_bans_at_least_as_new_as_the_object_apply() {
        let list = BanList::default();
        ban(&list, "req.url == /a", 100);
        let old = ObjectMeta {
            created_ms: 100,
            ..ObjectMeta::default()
        };
        let new = ObjectMeta {
            created_ms: 101,
            ..ObjectMeta::default()
        };
        assert_eq!(list.check(&subject(&old)), Some(1));
        assert_eq!(list.check(&subject(&new)), None);
        assert_eq!(list.stats.tests.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn ids_and_times_grow_even_when_the_clock_steps_back() {
        let list = BanList::default();
        let a = ban(&list, "obj.status == 200", 500);
        let b = ban(&list, "obj.status == 200", 400);
        assert_eq!((a.id, b.id), (1, 2));
        assert_eq!(b.created_ms, 500);
    }

    #[test]
    fn drop_walked_keeps_newer_bans_and_those_a_fill_may_need() {
        let list = BanList::default();
        ban(&list, "obj.status == 200", 100);
        ban(&list, "obj.status == 200", 200);
        ban(&list, "obj.status == 200", 300);
        // Walk started when bans 1 and 2 existed; a fill since 200 is open.
        assert_eq!(list.drop_walked(2, 200).0, vec![1]);
        assert_eq!(
            list.infos().iter().map(|b| b.id).collect::<Vec<_>>(),
            [2, 3]
        );
        assert_eq!(list.drop_walked(3, u64::MAX).0, vec![2, 3]);
        assert_eq!(list.len(), 0);
        // An empty list costs nothing.
        let m = ObjectMeta::default();
        assert_eq!(list.check(&subject(&m)), None);
    }

    #[test]
    fn records_round_trip_and_an_unreadable_one_bans_everything_older() {
        let list = BanList::default();
        ban(&list, "req.url ~ ^/x", 1_000);
        let rec = list.bans.read()[0].record();
        let back = BanList::from_records(
            &[
                BanRecord {
                    id: 7,
                    data: Some(rec.into()),
                },
                BanRecord { id: 9, data: None },
            ],
            5_000,
        );
        let infos = back.infos();
        assert_eq!(infos[0].expression, "req.url ~ ^/x");
        assert_eq!(infos[0].created_ms, 1_000);
        assert_eq!(infos[1].created_ms, 5_000);
        let any = ObjectMeta {
            created_ms: 4_000,
            status: 500,
            ..ObjectMeta::default()
        };
        assert_eq!(back.check(&subject(&any)), Some(9));
        // The next id follows the persisted ones.
        let next = back
            .next(
                BanExpression::parse("obj.status == 1").unwrap(),
                6_000,
                usize::MAX,
            )
            .unwrap();
        assert_eq!(next.id, 10);
    }

    fn records_of(list: &BanList) -> Vec<BanRecord> {
        list.bans
            .read()
            .iter()
            .map(|b| BanRecord {
                id: b.id,
                data: Some(b.record().into()),
            })
            .collect()
    }

    #[test]
    fn carried_bans_a_store_already_holds_are_not_written_again() {
        // Moved to a store and back: it holds the same bans, same ids.
        let list = BanList::default();
        ban(&list, "req.url == /a", 1_000);
        ban(&list, "req.url == /b", 2_000);
        let carried = list.carried_to(&records_of(&list), 9_000);
        assert!(carried.write.is_empty() && carried.remove.is_empty());
        assert_eq!(carried.list.infos(), list.infos());
        assert_eq!(carried.list.stats.added.load(Ordering::Relaxed), 2);
        // One more here: every ban is numbered after the ids used, the
        // store's records are replaced, and times stay in order.
        ban(&list, "req.url == /c", 3_000);
        let older = BanList::default();
        ban(&older, "req.url == /a", 1_000);
        let carried = list.carried_to(&records_of(&older), 9_000);
        let infos = carried.list.infos();
        let ids: Vec<u64> = infos.iter().map(|b| b.id).collect();
        let times: Vec<u64> = infos.iter().map(|b| b.created_ms).collect();
        assert_eq!((ids, times), (vec![4, 5, 6], vec![1_000, 2_000, 3_000]));
        assert_eq!(carried.remove, vec![1]);
        assert_eq!(carried.write.len(), 3);
        // New bans follow on.
        let next = carried
            .list
            .next(
                BanExpression::parse("req.url == /d").unwrap(),
                4_000,
                usize::MAX,
            )
            .unwrap();
        assert_eq!(next.id, 7);
    }

    #[test]
    fn the_list_is_bounded() {
        let list = BanList::default();
        let expr = BanExpression::parse("obj.status == 200").unwrap();
        {
            let mut bans = list.bans.write();
            for id in 0..MAX_BANS as u64 {
                bans.push(Arc::new(Ban {
                    id,
                    created_ms: 1,
                    expr: expr.clone(),
                }));
            }
        }
        assert_eq!(
            list.next(expr, 2, usize::MAX).unwrap_err(),
            BanError::TooMany { limit: MAX_BANS }
        );
    }

    #[test]
    fn host_and_url_of_a_primary_key() {
        let k = crate::PrimaryKey::new("Example.com", "/a?b", &["x".into()]);
        assert_eq!(host_and_url(k.as_str()), ("example.com", "/a?b"));
    }
}
