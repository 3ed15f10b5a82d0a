//! A budget of log lines per time window, for warnings whose cause someone
//! else controls (a client that misbehaves, an origin that fails): a flood
//! of them must not turn into a flood of lines, each costing CPU and disk.
//! The next line written says how many were left out.
//!
//! One type for every such line in the host: the listener's client
//! warnings (20 a second), a director's retries (one a second), the access
//! log's drops (one every 10 s).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// At most `lines` log lines per `window`; lock-free, usable in a `static`.
///
/// Windows are aligned on the wall clock (whole seconds since the Unix
/// epoch for a window of a second), so two lines may come close together
/// across a window's edge, never more than `lines` within one window.
#[derive(Debug)]
pub struct LogLimit {
    lines: u64,
    window_ms: u64,
    /// The current window (its number since the epoch) and the lines
    /// written in it, packed as `window << 16 | count`.
    current: AtomicU64,
    /// Lines left out since the last one written.
    suppressed: AtomicU64,
}

impl LogLimit {
    /// At most `lines` (1 to 65,535) lines per `window` (at least 1 ms).
    pub const fn new(lines: u16, window: Duration) -> Self {
        let window_ms = window.as_millis() as u64;
        Self {
            lines: if lines == 0 { 1 } else { lines as u64 },
            window_ms: if window_ms == 0 { 1 } else { window_ms },
            current: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
        }
    }

    /// At most `lines` a second.
    pub const fn per_second(lines: u16) -> Self {
        Self::new(lines, Duration::from_secs(1))
    }

    /// `Some(lines left out before this one)` when a line may be written
    /// now; `None` (and the line is counted as left out) otherwise.
    pub fn admit(&self) -> Option<u64> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.admit_at(now)
    }

    /// [`admit`](Self::admit) at `now_ms` milliseconds since the Unix
    /// epoch (for a caller with a clock of its own, and tests).
    pub fn admit_at(&self, now_ms: u64) -> Option<u64> {
        let window = now_ms / self.window_ms;
        let admitted = self
            .current
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                if w >> 16 != window {
                    Some(window << 16 | 1)
                } else if w & 0xffff < self.lines {
                    Some(w + 1)
                } else {
                    None
                }
            })
            .is_ok();
        if admitted {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for LogLimit {
    /// One line a second.
    fn default() -> Self {
        Self::per_second(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_is_cut_to_the_budget_and_the_next_line_counts_what_was_left_out() {
        let limit = LogLimit::per_second(20);
        let second = 1_700_000_000_000;
        let written: Vec<u64> = (0..1000)
            .filter_map(|i| limit.admit_at(second + i % 1000))
            .collect();
        assert_eq!(written.len(), 20);
        assert!(written.iter().all(|n| *n == 0), "{written:?}");
        // The next second's first line says how many the last one left out.
        assert_eq!(limit.admit_at(second + 1000), Some(980));
        assert_eq!(limit.admit_at(second + 1001), Some(0));
    }

    #[test]
    fn a_window_longer_than_a_second_holds_its_lines_for_all_of_it() {
        let limit = LogLimit::new(1, Duration::from_secs(10));
        let start = 1_700_000_000_000;
        assert_eq!(limit.admit_at(start), Some(0));
        assert_eq!(limit.admit_at(start + 5_000), None);
        assert_eq!(limit.admit_at(start + 9_999), None);
        assert_eq!(limit.admit_at(start + 10_000), Some(2));
    }

    #[test]
    fn the_real_clock_admits_the_first_line() {
        static LIMIT: LogLimit = LogLimit::per_second(1);
        assert_eq!(LIMIT.admit(), Some(0));
    }
}
