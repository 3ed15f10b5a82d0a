//! `[admin]` (the admin listener and its token) and `[metrics]`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::read::{Reader, Table, parse_listen};

/// `[metrics]`.
#[derive(Debug, Clone)]
pub struct MetricsConfig {
    /// Count requests for `GET /metrics` (default true; false counts nothing).
    pub enabled: bool,
}

/// Why the admin API may not listen on `addr` as configured: anyone who
/// can reach a non-loopback address could purge, ban and reload without a
/// token.
pub fn unguarded_admin(addr: SocketAddr, token_file: Option<&Path>) -> Option<String> {
    (token_file.is_none() && !addr.ip().is_loopback()).then(|| {
        format!(
            "{addr} is not a loopback address: set admin.token_file so that the admin API asks for a bearer token"
        )
    })
}

impl Reader {
    /// `[admin]`: the listen address and the token file.
    pub(super) fn admin(&mut self, root: &Table) -> (Option<SocketAddr>, Option<PathBuf>) {
        let Some(t) = self.table(root, "", "admin") else {
            return (None, None);
        };
        let p = "admin";
        let token_file = self.string(t, p, "token_file").map(PathBuf::from);
        let listen = self
            .string(t, p, "listen")
            .and_then(|s| match parse_listen(&s) {
                Ok(a) => Some(a),
                Err(m) => {
                    self.err("admin.listen", m);
                    None
                }
            });
        self.unknown_keys(t, p);
        if let Some(m) = listen.and_then(|a| unguarded_admin(a, token_file.as_deref())) {
            self.err("admin.listen", m);
        }
        if token_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            self.err("admin.token_file", "must name a file");
        }
        (listen, token_file)
    }

    /// `[metrics]`.
    pub(super) fn metrics(&mut self, t: &Table) -> MetricsConfig {
        let metrics = MetricsConfig {
            enabled: self.boolean(t, "metrics", "enabled", true),
        };
        self.unknown_keys(t, "metrics");
        metrics
    }
}
