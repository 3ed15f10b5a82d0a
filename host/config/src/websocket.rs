//! `[websocket]`: protocol upgrades tunnelled to the backend (WebSocket
//! over HTTP/1.1 `Upgrade` and over HTTP/2 extended CONNECT), and their
//! bounds.

use std::time::Duration;

use super::read::{Reader, Table, join};

/// `[websocket]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WebSocketConfig {
    /// Tunnel WebSocket upgrades to the backend; false: `Upgrade` is
    /// dropped as any hop-by-hop field and the request served as HTTP.
    pub enabled: bool,
    /// A tunnel that moves no byte either way for this long is closed.
    pub idle_timeout: Duration,
    /// Tunnels open at once; an upgrade past it gets a 503.
    pub max_tunnels: usize,
    /// Upgrade tokens besides `websocket` tunnelled the same way (HTTP/1.1
    /// only), lower case; none by default.
    pub other_protocols: Vec<String>,
}

impl Default for WebSocketConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            idle_timeout: Duration::from_secs(300),
            max_tunnels: 10_000,
            other_protocols: Vec::new(),
        }
    }
}

impl WebSocketConfig {
    /// The protocol an `Upgrade` field value asks for that is tunnelled
    /// (the first one listed that is), lower case.
    pub fn tunnelled(&self, upgrade: &str) -> Option<String> {
        if !self.enabled {
            return None;
        }
        upgrade
            .split(',')
            .map(|p| p.trim().to_ascii_lowercase())
            .find(|p| p == "websocket" || self.other_protocols.contains(p))
    }
}

/// Upgrade tokens `other_protocols` may not name: HTTP itself (Inlay serves
/// HTTP/2 and would not tunnel it as bytes) and TLS inside HTTP (RFC 2817).
const REFUSED_PROTOCOLS: [&str; 4] = ["h2c", "h2", "http", "tls"];

impl Reader {
    pub(super) fn websocket(&mut self, t: &Table) -> WebSocketConfig {
        let p = "websocket";
        let d = WebSocketConfig::default();
        let mut other_protocols = Vec::new();
        let key = join(p, "other_protocols");
        for (i, name) in self
            .strings(t, p, "other_protocols")
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let token = name.trim().to_ascii_lowercase();
            // The protocol name of an Upgrade token (RFC 9110 section 7.8),
            // without a version: the version goes with it as sent.
            let base = token.split('/').next().unwrap_or_default();
            if token.is_empty() || !token.bytes().all(is_tchar_or_slash) {
                self.err(
                    format!("{key}[{i}]"),
                    format!("not an Upgrade protocol token like \"my-protocol\": {name:?}"),
                );
            } else if base == "websocket" {
                self.err(
                    format!("{key}[{i}]"),
                    "websocket is tunnelled whenever websocket.enabled is true",
                );
            } else if REFUSED_PROTOCOLS.contains(&base) {
                self.err(
                    format!("{key}[{i}]"),
                    format!(
                        "{name:?} is not tunnelled: Inlay speaks HTTP/2 and TLS itself (h2c upgrades are answered over HTTP/1.1)"
                    ),
                );
            } else {
                other_protocols.push(token);
            }
        }
        let section = WebSocketConfig {
            enabled: self.boolean(t, p, "enabled", d.enabled),
            idle_timeout: self.positive_duration(t, p, "idle_timeout", d.idle_timeout),
            max_tunnels: self.uint(t, p, "max_tunnels", d.max_tunnels as u64, 1, 1_000_000)
                as usize,
            other_protocols,
        };
        self.unknown_keys(t, p);
        section
    }
}

/// A byte of an HTTP token (RFC 9110 section 5.6.2), or the `/` between
/// an Upgrade protocol's name and version.
fn is_tchar_or_slash(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~/".contains(&b)
}
