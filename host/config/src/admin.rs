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

/// `[admin] allowed_origins` and `allowed_hosts`: which requests made by
/// web browsers the admin API serves. A web page can send a simple POST
/// to any address its browser reaches without asking (no preflight), and
/// a page whose name is rebound to 127.0.0.1 reads the answers; so the
/// admin API refuses a request with an `Origin` field unless its origin
/// is listed, and serves only Host values that are IP addresses,
/// `localhost` or listed names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdminAccess {
    /// Origins whose requests are served, as browsers write them
    /// (`https://ops.example`, `http://127.0.0.1:8080`): lower-case, no
    /// default port, no path. Default: none.
    pub allowed_origins: Vec<String>,
    /// Host names (lower-case, no port) served besides IP addresses and
    /// `localhost`. Default: none.
    pub allowed_hosts: Vec<String>,
}

impl AdminAccess {
    /// Whether a request carrying `Origin: origin` is served.
    pub fn admits_origin(&self, origin: &[u8]) -> bool {
        let Ok(origin) = std::str::from_utf8(origin) else {
            return false;
        };
        let origin = origin.trim();
        self.allowed_origins
            .iter()
            .any(|o| o.eq_ignore_ascii_case(origin))
    }

    /// Whether a request for `host` (a Host value or an authority, with or
    /// without its port) is served: an IP address, `localhost` or a listed
    /// name.
    pub fn admits_host(&self, host: &str) -> bool {
        if !inlay_core::headers::is_host(host.as_bytes()) {
            return false;
        }
        if inlay_core::headers::is_ip_host(host) {
            return true;
        }
        let name = inlay_core::headers::host_without_port(host);
        let name = name.strip_suffix('.').unwrap_or(name);
        name.eq_ignore_ascii_case("localhost")
            || self
                .allowed_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(name))
    }
}

/// An origin as browsers write it in `Origin`: `scheme://host[:port]`,
/// lower-case, without the scheme's default port; why not, for the error.
fn origin_of(text: &str) -> Result<String, String> {
    let uri: http::Uri = text
        .parse()
        .map_err(|_| format!("{text:?} is not an origin like \"https://ops.example\""))?;
    let scheme = match uri.scheme_str().map(str::to_ascii_lowercase).as_deref() {
        Some(s @ ("http" | "https")) => s.to_owned(),
        _ => {
            return Err(format!(
                "{text:?}: an origin starts with http:// or https://"
            ));
        }
    };
    let Some(authority) = uri.authority() else {
        return Err(format!("{text:?} names no host"));
    };
    if authority.as_str().contains('@')
        || !inlay_core::headers::is_host(authority.as_str().as_bytes())
    {
        return Err(format!(
            "{text:?}: an origin is a scheme and a host, with no user"
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("{text:?}: an origin has no path or query"));
    }
    let default_port = if scheme == "https" { 443 } else { 80 };
    let host = authority.host().to_ascii_lowercase();
    Ok(match authority.port_u16() {
        Some(port) if port != default_port => format!("{scheme}://{host}:{port}"),
        _ => format!("{scheme}://{host}"),
    })
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
    /// `[admin]`: the listen address, the token file and who may send
    /// requests from a browser.
    pub(super) fn admin(
        &mut self,
        root: &Table,
    ) -> (Option<SocketAddr>, Option<PathBuf>, AdminAccess) {
        let Some(t) = self.table(root, "", "admin") else {
            return (None, None, AdminAccess::default());
        };
        let p = "admin";
        let token_file = self.string(t, p, "token_file").map(PathBuf::from);
        let access = self.admin_access(t);
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
        (listen, token_file, access)
    }

    /// `admin.allowed_origins` and `admin.allowed_hosts`.
    fn admin_access(&mut self, t: &Table) -> AdminAccess {
        let mut access = AdminAccess::default();
        let origins = self
            .strings(t, "admin", "allowed_origins")
            .unwrap_or_default();
        for (i, o) in origins.iter().enumerate() {
            match origin_of(o) {
                Ok(o) => access.allowed_origins.push(o),
                Err(m) => self.err(format!("admin.allowed_origins[{i}]"), m),
            }
        }
        let hosts = self
            .strings(t, "admin", "allowed_hosts")
            .unwrap_or_default();
        for (i, h) in hosts.iter().enumerate() {
            let path = format!("admin.allowed_hosts[{i}]");
            if h.contains(':') || h.starts_with('[') {
                self.err(
                    path,
                    format!(
                        "{h:?}: give a host name without a port (IP addresses are always served)"
                    ),
                );
            } else if h.is_empty() || !inlay_core::headers::is_host(h.as_bytes()) {
                self.err(path, format!("{h:?} is not a host name"));
            } else {
                access.allowed_hosts.push(h.to_ascii_lowercase());
            }
        }
        access
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
