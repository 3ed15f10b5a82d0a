//! The PROXY protocol (HAProxy's, v1 text and v2 binary) in front of a
//! client connection (`Limits::proxy_protocol`): the load balancer that
//! accepted the client says who the client is before anything else is sent.
//!
//! The header is parsed by the `ppp` crate; this module reads it with a
//! bounded buffer and hands back the bytes read past it (the start of the
//! TLS handshake or HTTP request), so that nothing is lost and nothing
//! is read twice.

use std::net::SocketAddr;

use bytes::Bytes;
use ppp::{HeaderResult, PartialResult as _, v1, v2};
use tokio::io::{AsyncRead, AsyncReadExt as _};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::CLIENT_WARNINGS;
use crate::limits::Limits;

/// Most bytes read while looking for the header: a v1 header is at most
/// 107 bytes; a v2 header is 16 bytes and its addresses and TLVs, which
/// load balancers keep to a few hundred bytes. A v2 header longer than
/// this is refused.
pub const MAX_HEADER: usize = 4096;

/// Why a connection's PROXY header was refused.
#[derive(Debug, thiserror::Error)]
pub enum HeaderError {
    /// The client closed the connection before the header was complete.
    #[error("connection closed before a complete PROXY header")]
    Closed,
    /// Reading failed.
    #[error("reading the PROXY header: {0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a PROXY header (v1 or v2).
    #[error("not a PROXY protocol header: {0}")]
    Invalid(String),
    /// A v2 header longer than [`MAX_HEADER`].
    #[error("PROXY header longer than {MAX_HEADER} bytes")]
    TooLong,
}

/// A PROXY header read from a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    /// The client's address, or `None` when the header says the connection
    /// is the proxy's own (v2 `LOCAL`, a health check; v1 `UNKNOWN`; a Unix
    /// socket): the connection's own peer address stands then.
    pub source: Option<SocketAddr>,
    /// Bytes read past the header: the start of what the client sent.
    pub rest: Bytes,
}

/// Read the PROXY header at the start of `io`, whose first bytes `read`
/// the caller has read already. The caller bounds the time.
pub async fn read_header<R: AsyncRead + Unpin>(
    read: &[u8],
    io: &mut R,
) -> Result<ProxyHeader, HeaderError> {
    let mut buf = Vec::with_capacity(read.len().max(256));
    buf.extend_from_slice(read);
    loop {
        let parsed = HeaderResult::parse(&buf);
        if parsed.is_complete() {
            let (len, source) = match parsed {
                HeaderResult::V1(Ok(h)) => (h.header.len(), v1_source(&h.addresses)),
                HeaderResult::V2(Ok(h)) => (h.len(), v2_source(&h)),
                HeaderResult::V1(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
                HeaderResult::V2(Err(e)) => return Err(HeaderError::Invalid(e.to_string())),
            };
            let rest = Bytes::copy_from_slice(&buf[len..]);
            return Ok(ProxyHeader { source, rest });
        }
        if buf.len() >= MAX_HEADER {
            return Err(HeaderError::TooLong);
        }
        let want = (MAX_HEADER - buf.len()).min(1024);
        let start = buf.len();
        buf.resize(start + want, 0);
        let n = io.read(&mut buf[start..]).await?;
        buf.truncate(start + n);
        if n == 0 {
            return Err(HeaderError::Closed);
        }
    }
}

fn v1_source(a: &v1::Addresses) -> Option<SocketAddr> {
    match a {
        v1::Addresses::Tcp4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Tcp6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v1::Addresses::Unknown => None,
    }
}

fn v2_source(h: &v2::Header<'_>) -> Option<SocketAddr> {
    if h.command == v2::Command::Local {
        return None;
    }
    match &h.addresses {
        v2::Addresses::IPv4(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::IPv6(a) => Some(SocketAddr::from((a.source_address, a.source_port))),
        v2::Addresses::Unspecified | v2::Addresses::Unix(_) => None,
    }
}

/// The PROXY protocol header of a connection, within
/// `header_read_timeout`; `None` (the connection closed, a rate-limited
/// warning logged) when it is missing, malformed, too long, late, or the
/// server stops.
pub(crate) async fn proxy_header(
    first: Bytes,
    stream: &mut TcpStream,
    peer: SocketAddr,
    limits: &Limits,
    stop: &CancellationToken,
) -> Option<ProxyHeader> {
    let read = tokio::time::timeout(limits.header_read_timeout, read_header(&first, stream));
    let result = tokio::select! {
        r = read => r,
        () = stop.cancelled() => return None,
    };
    match result {
        Ok(Ok(header)) => Some(header),
        Ok(Err(HeaderError::Closed)) => {
            debug!(%peer, "connection closed before its PROXY header");
            None
        }
        Ok(Err(e)) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                let prefix = limits.setting_prefix;
                warn!(%peer, error = %e, suppressed = more, "no valid PROXY protocol header ({prefix}proxy_protocol); connection closed");
            }
            None
        }
        Err(_) => {
            if let Some(more) = CLIENT_WARNINGS.admit() {
                warn!(%peer, suppressed = more, "no PROXY protocol header within header_read_timeout; connection closed");
            }
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn parse(bytes: &[u8]) -> Result<ProxyHeader, HeaderError> {
        read_header(b"", &mut &bytes[..]).await
    }

    fn v2(command: v2::Command, addresses: impl Into<v2::Addresses>) -> Vec<u8> {
        v2::Builder::with_addresses(v2::Version::Two | command, v2::Protocol::Stream, addresses)
            .build()
            .unwrap()
    }

    #[tokio::test]
    async fn bytes_read_already_start_the_header() {
        let mut socket = &b"192.0.2.1 5555 443\r\nGET"[..];
        let h = read_header(b"PROXY TCP4 203.0.113.7 ", &mut socket)
            .await
            .unwrap();
        assert_eq!(h.source, Some("203.0.113.7:5555".parse().unwrap()));
        assert_eq!(&h.rest[..], b"GET");
        // All of it read already: the socket is not read.
        let mut empty = &b""[..];
        let h = read_header(b"PROXY UNKNOWN\r\nGET / HTTP/1.1\r\n", &mut empty)
            .await
            .unwrap();
        assert_eq!((h.source, &h.rest[..]), (None, &b"GET / HTTP/1.1\r\n"[..]));
    }

    #[tokio::test]
    async fn v1_gives_the_source_and_keeps_what_follows() {
        let h = parse(b"PROXY TCP4 203.0.113.7 192.0.2.1 5555 443\r\nGET / HTTP/1.1\r\n")
            .await
            .unwrap();
        assert_eq!(h.source, Some("203.0.113.7:5555".parse().unwrap()));
        assert_eq!(&h.rest[..], b"GET / HTTP/1.1\r\n");
        let h = parse(b"PROXY TCP6 2001:db8::1 2001:db8::2 1 2\r\n")
            .await
            .unwrap();
        assert_eq!(h.source, Some("[2001:db8::1]:1".parse().unwrap()));
        let h = parse(b"PROXY UNKNOWN\r\n\x16\x03\x01").await.unwrap();
        assert_eq!((h.source, &h.rest[..]), (None, &b"\x16\x03\x01"[..]));
    }

    #[tokio::test]
    async fn v2_gives_the_source_and_local_gives_none() {
        let addrs = (
            "[2001:db8::7]:4000".parse::<SocketAddr>().unwrap(),
            "[2001:db8::1]:443".parse::<SocketAddr>().unwrap(),
        );
        let mut bytes = v2(v2::Command::Proxy, addrs);
        bytes.extend_from_slice(b"\x16\x03\x01");
        let h = parse(&bytes).await.unwrap();
        assert_eq!(h.source, Some(addrs.0));
        assert_eq!(&h.rest[..], b"\x16\x03\x01");
        let local = v2(v2::Command::Local, v2::Addresses::Unspecified);
        assert_eq!(parse(&local).await.unwrap().source, None);
    }

    #[tokio::test]
    async fn missing_garbage_cut_and_oversized_headers_are_refused() {
        for bad in [
            &b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"[..],
            b"PROXY TCP4 300.1.1.1 1.1.1.1 1 2\r\n",
            b"PROXY GARBAGE\r\n",
            b"\x16\x03\x01\x02\x00\x01\x00",
            &[0xff; 200],
        ] {
            assert!(
                matches!(parse(bad).await, Err(HeaderError::Invalid(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            parse(b"PROXY TCP4 203.0.113.7 ").await,
            Err(HeaderError::Closed)
        ));
        assert!(matches!(
            parse(&[b'P'; 4 * MAX_HEADER]).await,
            Err(HeaderError::Invalid(_))
        ));
        // A v2 header whose length field says 60000 bytes.
        let mut long = v2(
            v2::Command::Proxy,
            (
                "192.0.2.1:1".parse::<SocketAddr>().unwrap(),
                "192.0.2.2:2".parse::<SocketAddr>().unwrap(),
            ),
        );
        long[14..16].copy_from_slice(&60000u16.to_be_bytes());
        long.resize(70000, 0);
        assert!(matches!(parse(&long).await, Err(HeaderError::TooLong)));
    }
}
