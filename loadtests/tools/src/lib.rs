//! Shared parts of Inlay's load tools (`inlay-hostile`, `inlay-scale`):
//! latency percentiles, `/proc` memory readings and a small deterministic
//! random source.
//!
//! The binaries are described in `loadtests/README.md`.

use std::time::Duration;

/// Percentiles of a set of latencies, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Percentiles {
    /// Number of samples.
    pub count: usize,
    /// Median.
    pub p50_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Largest sample.
    pub max_us: f64,
}

impl Percentiles {
    /// Percentiles of `samples` (nearest rank; all zero when empty).
    pub fn of(samples: &[Duration]) -> Percentiles {
        if samples.is_empty() {
            return Percentiles::default();
        }
        let mut us: Vec<f64> = samples
            .iter()
            .map(|d| d.as_nanos() as f64 / 1000.0)
            .collect();
        us.sort_by(f64::total_cmp);
        let rank = |q: f64| {
            let i = ((q * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1;
            us[i]
        };
        Percentiles {
            count: us.len(),
            p50_us: rank(0.50),
            p99_us: rank(0.99),
            p999_us: rank(0.999),
            max_us: us[us.len() - 1],
        }
    }

    /// The hostile test's latency check: `attack`'s p99 is at most `factor`
    /// times `self`'s (the quiet figure). No samples on either side fails:
    /// a client that could not send anything did not keep its latency.
    pub fn p99_within(&self, attack: &Percentiles, factor: f64) -> bool {
        self.count > 0 && attack.count > 0 && attack.p99_us <= factor * self.p99_us
    }

    /// As JSON, for the reports.
    pub fn to_json(self) -> serde_json::Value {
        serde_json::json!({
            "count": self.count,
            "p50_us": round1(self.p50_us),
            "p99_us": round1(self.p99_us),
            "p999_us": round1(self.p999_us),
            "max_us": round1(self.max_us),
        })
    }
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

/// Memory figures of a process from `/proc/PID/status`, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProcMemory {
    /// Resident set size now (`VmRSS`).
    pub rss_kib: u64,
    /// Peak resident set size (`VmHWM`).
    pub hwm_kib: u64,
    /// Threads (`Threads`).
    pub threads: u64,
}

impl ProcMemory {
    /// Parses the text of `/proc/PID/status`; missing fields read as 0.
    pub fn parse(status: &str) -> ProcMemory {
        let mut m = ProcMemory::default();
        for line in status.lines() {
            let Some((name, rest)) = line.split_once(':') else {
                continue;
            };
            let value = rest
                .split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            match name {
                "VmRSS" => m.rss_kib = value,
                "VmHWM" => m.hwm_kib = value,
                "Threads" => m.threads = value,
                _ => {}
            }
        }
        m
    }

    /// Reads `/proc/PID/status` (`self` for this process).
    pub fn read(pid: &str) -> std::io::Result<ProcMemory> {
        Ok(ProcMemory::parse(&std::fs::read_to_string(format!(
            "/proc/{pid}/status"
        ))?))
    }
}

/// Open file descriptors of a process (entries of `/proc/PID/fd`).
pub fn open_fds(pid: &str) -> std::io::Result<usize> {
    Ok(std::fs::read_dir(format!("/proc/{pid}/fd"))?.count())
}

/// SplitMix64: a tiny deterministic generator for traffic shapes and
/// garbage bytes (nothing here needs a cryptographic source).
#[derive(Debug, Clone)]
pub struct SplitMix(u64);

impl SplitMix {
    /// A generator from a seed.
    pub fn new(seed: u64) -> SplitMix {
        SplitMix(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let r = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_use_nearest_rank() {
        let samples: Vec<Duration> = (1..=1000).map(Duration::from_micros).collect();
        let p = Percentiles::of(&samples);
        assert_eq!(p.count, 1000);
        assert_eq!(p.p50_us, 500.0);
        assert_eq!(p.p99_us, 990.0);
        assert_eq!(p.p999_us, 999.0);
        assert_eq!(p.max_us, 1000.0);
        assert_eq!(Percentiles::of(&[]), Percentiles::default());
    }

    #[test]
    fn p99_check_is_twice_quiet_and_fails_without_samples() {
        let quiet = Percentiles::of(&[Duration::from_micros(100); 100]);
        let ok = Percentiles::of(&[Duration::from_micros(200); 100]);
        let slow = Percentiles::of(&[Duration::from_micros(201); 100]);
        assert!(quiet.p99_within(&ok, 2.0));
        assert!(!quiet.p99_within(&slow, 2.0));
        assert!(!quiet.p99_within(&Percentiles::default(), 2.0));
        assert!(!Percentiles::default().p99_within(&ok, 2.0));
    }

    #[test]
    fn proc_status_fields_are_read() {
        let text = "Name:\tinlay\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\nThreads:\t9\nBogus\n";
        let m = ProcMemory::parse(text);
        assert_eq!(
            m,
            ProcMemory {
                rss_kib: 102_400,
                hwm_kib: 204_800,
                threads: 9
            }
        );
        assert_eq!(ProcMemory::parse(""), ProcMemory::default());
        assert!(ProcMemory::read("self").unwrap().rss_kib > 0);
    }

    #[test]
    fn splitmix_is_deterministic_and_fills_odd_lengths() {
        let mut a = SplitMix::new(7);
        let mut b = SplitMix::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let mut buf = [0u8; 13];
        a.fill(&mut buf);
        assert!(buf.iter().any(|&x| x != 0));
        assert!(a.below(10) < 10);
    }
}
