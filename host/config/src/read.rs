//! The reader every section's parsing shares: typed values with their key
//! paths, every problem collected (not only the first), and the known keys
//! of each table derived from the keys its section reads.

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use super::ConfigIssue;

/// Longest duration accepted for any key: beyond it, `Instant::now() + d`
/// may overflow (and panic) at run time, and no timeout or TTL means it.
const MAX_DURATION: Duration = Duration::from_secs(100 * 365 * 86_400);

/// An IPv4 or IPv6 network in CIDR notation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: std::net::IpAddr,
    prefix: u8,
}

impl IpNet {
    /// Parse `addr/prefix` or a bare address (a /32 or /128).
    pub fn parse(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: std::net::IpAddr = addr
            .trim()
            .parse()
            .map_err(|_| format!("not an IP address: {addr:?}"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(p) => p
                .trim()
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix must be 0..={max}: {p:?}"))?,
            None => max,
        };
        Ok(Self { addr, prefix })
    }

    /// Whether `ip` lies in this network (IPv4-mapped IPv6 addresses match IPv4 nets).
    pub fn contains(&self, ip: std::net::IpAddr) -> bool {
        use std::net::IpAddr::*;
        let ip = match ip {
            V6(v6) => v6.to_ipv4_mapped().map(V4).unwrap_or(V6(v6)),
            v4 => v4,
        };
        match (self.addr, ip) {
            (V4(net), V4(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            (V6(net), V6(ip)) => mask_eq(&net.octets(), &ip.octets(), self.prefix),
            _ => false,
        }
    }
}

fn mask_eq(a: &[u8], b: &[u8], prefix: u8) -> bool {
    let full = usize::from(prefix / 8);
    if a[..full] != b[..full] {
        return false;
    }
    let rem = prefix % 8;
    if rem == 0 {
        return true;
    }
    let mask = 0xffu8 << (8 - rem);
    (a[full] & mask) == (b[full] & mask)
}

impl fmt::Display for IpNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

pub(super) fn issue(path: &str, message: impl Into<String>) -> ConfigIssue {
    ConfigIssue {
        path: path.to_owned(),
        message: message.into(),
    }
}

/// A listen address: `IP:PORT`, or varnishd's `:PORT` for all interfaces.
pub(super) fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    // Accept varnishd's `:6081` shorthand for all interfaces.
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse()
        .map_err(|_| format!("not an address like 127.0.0.1:6081: {s:?}"))
}

/// Parse a size: an integer of bytes, or a string like `64KiB`, `256MiB`, `1GiB`, `10MB`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("not a size like 64MiB: {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "kb" => 1000,
        "m" | "mib" => 1 << 20,
        "mb" => 1_000_000,
        "g" | "gib" => 1 << 30,
        "gb" => 1_000_000_000,
        "t" | "tib" => 1 << 40,
        "tb" => 1_000_000_000_000,
        _ => return Err(format!("unknown size unit in {s:?} (use B, KiB, MiB, GiB)")),
    };
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("size out of range: {s:?}"));
    }
    Ok(v as u64)
}

/// Collects issues while reading the TOML tree.
#[derive(Default)]
pub(super) struct Reader {
    pub(super) issues: Vec<ConfigIssue>,
    /// The keys read from each table so far, by the table's key path: a
    /// section's known keys are the keys its code reads (one list, not a
    /// second copy to keep in step).
    asked: HashMap<String, Vec<String>>,
}

pub(super) type Table = toml::Table;
pub(super) type Value = toml::Value;

pub(super) fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_owned()
    } else {
        format!("{prefix}.{key}")
    }
}

impl Reader {
    pub(super) fn err(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.issues.push(ConfigIssue {
            path: path.into(),
            message: message.into(),
        });
    }

    /// The value of `key` in `t` (at `prefix`), noting that the section
    /// reads `key`: every read goes through here.
    pub(super) fn get<'t>(&mut self, t: &'t Table, prefix: &str, key: &str) -> Option<&'t Value> {
        let asked = self.asked.entry(prefix.to_owned()).or_default();
        if !asked.iter().any(|k| k == key) {
            asked.push(key.to_owned());
        }
        t.get(key)
    }

    /// Reports the keys of `t` (at `prefix`) its section did not read; call
    /// it once the section has read everything it knows.
    pub(super) fn unknown_keys(&mut self, t: &Table, prefix: &str) {
        let known = self.asked.remove(prefix).unwrap_or_default();
        for k in t.keys() {
            if !known.contains(k) {
                self.err(
                    join(prefix, k),
                    format!("unknown setting (known here: {})", known.join(", ")),
                );
            }
        }
    }

    pub(super) fn table<'a>(&mut self, t: &'a Table, prefix: &str, key: &str) -> Option<&'a Table> {
        match self.get(t, prefix, key) {
            None => None,
            Some(Value::Table(inner)) => Some(inner),
            Some(v) => {
                self.err(join(prefix, key), format!("expected a table, got {v}"));
                None
            }
        }
    }

    pub(super) fn string(&mut self, t: &Table, prefix: &str, key: &str) -> Option<String> {
        match self.get(t, prefix, key)? {
            Value::String(s) => Some(s.clone()),
            v => {
                self.err(join(prefix, key), format!("expected a string, got {v}"));
                None
            }
        }
    }

    pub(super) fn boolean(&mut self, t: &Table, prefix: &str, key: &str, default: bool) -> bool {
        match self.get(t, prefix, key) {
            None => default,
            Some(Value::Boolean(b)) => *b,
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected true or false, got {v}"),
                );
                default
            }
        }
    }

    pub(super) fn uint(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: u64,
        min: u64,
        max: u64,
    ) -> u64 {
        match self.get(t, prefix, key) {
            None => default,
            Some(Value::Integer(i)) if *i >= min as i64 && (*i as u64) <= max => *i as u64,
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected an integer in {min}..={max}, got {v}"),
                );
                default
            }
        }
    }

    pub(super) fn duration(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: Duration,
    ) -> Duration {
        let d = self.any_duration(t, prefix, key, default);
        if d > MAX_DURATION {
            self.err(
                join(prefix, key),
                format!(
                    "too long: at most \"{}d\" (100 years), got {}s",
                    MAX_DURATION.as_secs() / 86_400,
                    d.as_secs()
                ),
            );
            return default;
        }
        d
    }

    pub(super) fn any_duration(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: Duration,
    ) -> Duration {
        match self.get(t, prefix, key) {
            None => default,
            Some(Value::String(s)) => match humantime::parse_duration(s) {
                Ok(d) => d,
                Err(e) => {
                    self.err(
                        join(prefix, key),
                        format!("{e} in {s:?} (use e.g. \"500ms\", \"30s\", \"5m\")"),
                    );
                    default
                }
            },
            Some(Value::Integer(i)) if *i >= 0 => Duration::from_secs(*i as u64),
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected a duration like \"30s\", got {v}"),
                );
                default
            }
        }
    }

    /// A duration that must not be zero (a zero timeout would cut everything).
    pub(super) fn positive_duration(
        &mut self,
        t: &Table,
        prefix: &str,
        key: &str,
        default: Duration,
    ) -> Duration {
        let d = self.duration(t, prefix, key, default);
        if d.is_zero() {
            self.err(join(prefix, key), "must be more than zero".to_string());
            return default;
        }
        d
    }

    pub(super) fn size(&mut self, t: &Table, prefix: &str, key: &str, default: u64) -> u64 {
        match self.get(t, prefix, key) {
            None => default,
            Some(Value::Integer(i)) if *i >= 0 => *i as u64,
            Some(Value::String(s)) => match parse_size(s) {
                Ok(n) => n,
                Err(m) => {
                    self.err(join(prefix, key), m);
                    default
                }
            },
            Some(v) => {
                self.err(
                    join(prefix, key),
                    format!("expected a size like \"64MiB\", got {v}"),
                );
                default
            }
        }
    }

    pub(super) fn strings(&mut self, t: &Table, prefix: &str, key: &str) -> Option<Vec<String>> {
        match self.get(t, prefix, key)? {
            Value::String(s) => Some(vec![s.clone()]),
            Value::Array(items) => {
                let mut out = Vec::new();
                for (i, v) in items.iter().enumerate() {
                    match v {
                        Value::String(s) => out.push(s.clone()),
                        v => self.err(
                            format!("{}[{i}]", join(prefix, key)),
                            format!("expected a string, got {v}"),
                        ),
                    }
                }
                Some(out)
            }
            v => {
                self.err(
                    join(prefix, key),
                    format!("expected a list of strings, got {v}"),
                );
                None
            }
        }
    }

    /// A list of networks (`"10.0.0.0/8"`, `"2001:db8::1"`); none when absent.
    pub(super) fn networks(&mut self, t: &Table, prefix: &str, key: &str) -> Vec<IpNet> {
        let mut out = Vec::new();
        for (i, s) in self
            .strings(t, prefix, key)
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            match IpNet::parse(s) {
                Ok(n) => out.push(n),
                Err(m) => self.err(format!("{}[{i}]", join(prefix, key)), m),
            }
        }
        out
    }
}
