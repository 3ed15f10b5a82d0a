//! Request ids (`X-Request-Id`, as nginx and Heroku have them): a client's
//! sane id is kept, anything else gets a new one, minted from a random
//! per-process prefix and a counter (no system call, one small string per
//! request). The id goes to the backend and every ESI include as a request
//! field, into the access log, and back to the client on the response.

use std::sync::atomic::{AtomicU64, Ordering};

use http::{HeaderMap, HeaderName, HeaderValue};
use tracing::debug;

use crate::config::ServerConfig;

/// Longest client-sent id kept, in bytes.
pub const MAX_LEN: usize = 200;

/// Whether a client-sent id is kept: 1 to [`MAX_LEN`] bytes of visible
/// ASCII other than `"`, `\` and `,` (so that it stays one token in a log
/// line and one element of a field list).
pub fn is_sane(v: &[u8]) -> bool {
    !v.is_empty()
        && v.len() <= MAX_LEN
        && v.iter()
            .all(|b| (0x21..=0x7e).contains(b) && !matches!(b, b'"' | b'\\' | b','))
}

/// Accepts or mints the id of each request.
#[derive(Debug)]
pub struct RequestIds {
    header: Option<HeaderName>,
    trust: bool,
    /// `<16 hex digits>-`, random per process.
    prefix: String,
    counter: AtomicU64,
}

impl RequestIds {
    /// As `server.request_id_header` and `server.trust_request_id` say.
    pub fn new(cfg: &ServerConfig) -> Self {
        Self {
            header: cfg.request_id_header.clone(),
            trust: cfg.trust_request_id,
            prefix: format!("{:016x}-", rand::random::<u64>()),
            counter: AtomicU64::new(0),
        }
    }

    /// The configured field, `None` when request ids are off.
    pub fn header(&self) -> Option<&HeaderName> {
        self.header.as_ref()
    }

    /// The id of the request with these (client) `headers`: the first sane
    /// value of the field when client ids are trusted, otherwise a new id.
    /// Every value of the field in `headers` is replaced by the one id, so
    /// that the policy and the backend see exactly it. `None` when off.
    pub fn assign(&self, headers: &mut HeaderMap) -> Option<HeaderValue> {
        let name = self.header.as_ref()?;
        let mut kept = None;
        if self.trust {
            let mut values = headers.get_all(name).iter();
            kept = values.find(|v| is_sane(v.as_bytes())).cloned();
        }
        let id = match kept {
            Some(id) => id,
            None => {
                if headers.contains_key(name) && self.trust {
                    // The value itself is not logged: it is the client's,
                    // and may be anything up to the header size limit.
                    debug!(
                        field = %name,
                        "client request id replaced: not 1-{MAX_LEN} bytes of visible ASCII"
                    );
                }
                self.mint()
            }
        };
        headers.insert(name.clone(), id.clone());
        Some(id)
    }

    /// A new id: `<16 hex digits of this process>-<counter in hex>`.
    pub fn mint(&self) -> HeaderValue {
        let n = self.counter.fetch_add(1, Ordering::Relaxed);
        // Written on the stack by hand (the formatter costs more than the
        // rest of the id), copied once into the value.
        let mut buf = [0u8; 64];
        let prefix = self.prefix.as_bytes();
        let len = prefix.len().min(buf.len() - 16);
        buf[..len].copy_from_slice(&prefix[..len]);
        let digits = (16 - n.leading_zeros() as usize / 4).max(1);
        for (i, slot) in buf[len..len + digits].iter_mut().enumerate() {
            let nibble = (n >> (4 * (digits - 1 - i))) & 0xf;
            *slot = b"0123456789abcdef"[nibble as usize];
        }
        HeaderValue::from_bytes(&buf[..len + digits])
            .expect("hex digits and '-' are a valid field value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(trust: bool) -> RequestIds {
        RequestIds {
            header: Some(HeaderName::from_static("x-request-id")),
            trust,
            prefix: "0000000000000abc-".into(),
            counter: AtomicU64::new(0),
        }
    }

    fn assign(ids: &RequestIds, sent: &[&[u8]]) -> (String, HeaderMap) {
        let mut h = HeaderMap::new();
        for v in sent {
            h.append("x-request-id", HeaderValue::from_bytes(v).unwrap());
        }
        let id = ids.assign(&mut h).unwrap();
        (id.to_str().unwrap().to_owned(), h)
    }

    #[test]
    fn a_sane_id_is_kept_and_a_missing_one_minted() {
        let ids = ids(true);
        let (id, h) = assign(&ids, &[b"req-123"]);
        assert_eq!(id, "req-123");
        assert_eq!(h.get_all("x-request-id").iter().count(), 1);
        let (first, _) = assign(&ids, &[]);
        let (second, _) = assign(&ids, &[]);
        assert_eq!(first, "0000000000000abc-0");
        assert_eq!(second, "0000000000000abc-1");
        for n in [0xf, 0x10, 0xabc, u64::MAX] {
            ids.counter.store(n, Ordering::Relaxed);
            assert_eq!(ids.mint(), format!("0000000000000abc-{n:x}").as_str());
        }
    }

    #[test]
    fn hostile_ids_are_replaced_and_the_first_sane_one_wins() {
        let ids = ids(true);
        let long = vec![b'a'; MAX_LEN + 1];
        for bad in [
            &b"has space"[..],
            b"quote\"d",
            b"back\\slash",
            b"a,b",
            b"caf\xc3\xa9",
            b"tab\there",
            &long,
        ] {
            let (id, h) = assign(&ids, &[bad]);
            assert!(id.starts_with("0000000000000abc-"), "{bad:?} kept as {id}");
            assert_eq!(h.get_all("x-request-id").iter().count(), 1);
        }
        let (id, h) = assign(&ids, &[b"bad value", b"good", b"other"]);
        assert_eq!(id, "good");
        assert_eq!(
            h.get_all("x-request-id").iter().collect::<Vec<_>>(),
            ["good"],
            "the other values do not go on"
        );
        assert!(is_sane(&[b'a'; MAX_LEN]));
    }

    #[test]
    fn untrusted_ids_are_always_minted_and_off_is_off() {
        let (id, _) = assign(&ids(false), &[b"req-123"]);
        assert!(id.starts_with("0000000000000abc-"));
        let off = RequestIds {
            header: None,
            ..ids(true)
        };
        let mut h = HeaderMap::new();
        h.insert("x-request-id", HeaderValue::from_static("x y"));
        assert!(off.assign(&mut h).is_none());
        assert_eq!(h["x-request-id"], "x y", "left alone when off");
    }
}
