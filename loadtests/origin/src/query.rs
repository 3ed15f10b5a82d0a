//! The query string: every knob of every endpoint is a query parameter.

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

/// Longest wait any delay knob may ask for, so a typo cannot park a
/// connection for hours.
pub const MAX_DELAY: Duration = Duration::from_secs(300);

/// A client mistake in the request (bad number, bad header value...),
/// answered with 400 and the message as body.
#[derive(Debug)]
pub struct BadRequest(pub String);

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The decoded `name=value` pairs of a query string, in request order.
///
/// Lookups are linear scans: queries carry a handful of pairs, and a `Vec`
/// is cheaper to build than a map on every request.
#[derive(Debug, Default)]
pub struct Params<'a> {
    pairs: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

impl<'a> Params<'a> {
    /// Splits and percent-decodes `query` (`None` for a URI without `?`).
    pub fn parse(query: Option<&'a str>) -> Self {
        let Some(query) = query else {
            return Self::default();
        };
        let pairs = query
            .split('&')
            .filter(|pair| !pair.is_empty())
            .map(|pair| match pair.split_once('=') {
                Some((name, value)) => (decode(name), decode(value)),
                None => (decode(pair), Cow::Borrowed("")),
            })
            .collect();
        Self { pairs }
    }

    /// The first value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.pairs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// Every value of `name`, in request order (for repeatable knobs).
    pub fn all<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'s str> + 's {
        self.pairs
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// `name` as an unsigned integer no larger than `max`.
    pub fn u64(&self, name: &str, max: u64) -> Result<Option<u64>, BadRequest> {
        let Some(raw) = self.get(name) else {
            return Ok(None);
        };
        match raw.trim().parse::<u64>() {
            Ok(v) if v <= max => Ok(Some(v)),
            Ok(v) => Err(BadRequest(format!("{name}={v} is above the limit {max}"))),
            Err(_) => Err(BadRequest(format!(
                "{name}={raw:?} is not a non-negative integer"
            ))),
        }
    }

    /// `name` as a millisecond delay, capped at [`MAX_DELAY`].
    pub fn millis(&self, name: &str) -> Result<Option<Duration>, BadRequest> {
        Ok(self
            .u64(name, MAX_DELAY.as_millis() as u64)?
            .map(Duration::from_millis))
    }

    /// `name` as a flag: `1`/`true`/`yes` or `0`/`false`/`no`.
    pub fn flag(&self, name: &str) -> Result<Option<bool>, BadRequest> {
        match self.get(name) {
            None => Ok(None),
            Some("1" | "true" | "yes" | "on") => Ok(Some(true)),
            Some("0" | "false" | "no" | "off") => Ok(Some(false)),
            Some(other) => Err(BadRequest(format!("{name}={other:?} is not 0 or 1"))),
        }
    }

    /// `name` as a comma-separated list of millisecond delays (`100,50,200`).
    pub fn millis_list(&self, name: &str) -> Result<Vec<u64>, BadRequest> {
        let Some(raw) = self.get(name) else {
            return Ok(Vec::new());
        };
        let max = MAX_DELAY.as_millis() as u64;
        raw.split(',')
            .filter(|item| !item.trim().is_empty())
            .map(|item| match item.trim().parse::<u64>() {
                Ok(v) if v <= max => Ok(v),
                _ => Err(BadRequest(format!(
                    "{name}: {item:?} is not a delay in milliseconds up to {max}"
                ))),
            })
            .collect()
    }
}

/// Percent-decodes one query component; `+` is a space, as in HTML forms.
/// Malformed escapes are kept verbatim and invalid UTF-8 is replaced, so
/// decoding never fails.
pub fn decode(raw: &str) -> Cow<'_, str> {
    if !raw.bytes().any(|b| b == b'%' || b == b'+') {
        return Cow::Borrowed(raw);
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hi = bytes.get(i + 1).copied().and_then(hex);
                let lo = bytes.get(i + 2).copied().and_then(hex);
                if let (Some(hi), Some(lo)) = (hi, lo) {
                    out.push(hi << 4 | lo);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b => out.push(b),
        }
        i += 1;
    }
    match String::from_utf8(out) {
        Ok(s) => Cow::Owned(s),
        Err(e) => Cow::Owned(String::from_utf8_lossy(e.as_bytes()).into_owned()),
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_escapes_plus_and_keeps_malformed_ones() {
        assert_eq!(decode("a%20b+c"), "a b c");
        assert_eq!(decode("max-age%3D60%2C%20public"), "max-age=60, public");
        assert_eq!(decode("100%"), "100%");
        assert_eq!(decode("%zz%4"), "%zz%4");
        assert_eq!(decode("%C3%A9"), "é");
        assert_eq!(decode("%FF"), "\u{FFFD}");
        assert!(matches!(decode("plain"), Cow::Borrowed("plain")));
    }

    #[test]
    fn params_keep_order_and_repeats() {
        let p = Params::parse(Some("h=A:1&x&h=B%3A2&&n=5"));
        assert_eq!(p.all("h").collect::<Vec<_>>(), ["A:1", "B:2"]);
        assert_eq!(p.get("x"), Some(""));
        assert_eq!(p.u64("n", 10).ok().flatten(), Some(5));
        assert!(p.u64("n", 4).is_err());
        assert_eq!(p.get("missing"), None);
    }

    #[test]
    fn numbers_flags_and_lists_reject_garbage() {
        let p = Params::parse(Some("a=-1&b=yes&c=2&d=100,50,,200&e=1,x"));
        assert!(p.u64("a", 10).is_err());
        assert_eq!(p.flag("b").ok().flatten(), Some(true));
        assert!(p.flag("c").is_err());
        assert_eq!(p.millis_list("d").ok(), Some(vec![100, 50, 200]));
        assert!(p.millis_list("e").is_err());
        assert!(p.millis("delay").ok().flatten().is_none());
    }
}
