//! The connections' millisecond clock: the kernel's coarse monotonic
//! clock (`CLOCK_MONOTONIC_COARSE`), the time of the last scheduler tick.
//!
//! A connection reads its clock several times a request (each read and
//! write on its socket, each response's start and body chunk), for
//! timeouts counted in hundreds of milliseconds and more. The coarse clock
//! is read from the vDSO without the TSC: 2.6 ns a read on these machines
//! against 20 ns for `Instant::now`, whose precision the timeouts do not
//! need; its resolution is one kernel tick (4 ms here, at most 10 ms).

/// Milliseconds on the coarse monotonic clock (since boot; 0 if the clock
/// cannot be read, which Linux does not do).
#[allow(unsafe_code)]
pub(crate) fn now_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which lives on our stack.
    let ok = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } == 0;
    if !ok {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let millis = u64::try_from(ts.tv_nsec).unwrap_or(0) / 1_000_000;
    secs.saturating_mul(1000).saturating_add(millis)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::now_ms;

    #[test]
    fn it_follows_the_fine_clock_within_a_tick() {
        let (fine, coarse) = (Instant::now(), now_ms());
        assert!(coarse > 0);
        std::thread::sleep(Duration::from_millis(120));
        let fine = fine.elapsed().as_millis() as u64;
        let coarse = now_ms() - coarse;
        // A kernel tick is at most 10 ms (HZ 100); one at each end.
        assert!(
            coarse.abs_diff(fine) <= 20,
            "coarse {coarse} ms, fine {fine} ms"
        );
    }
}
