//! The quick flags of `inlay serve` (`-a`, `-b`, `--policy`, ...), applied
//! over the file at start and at every reload.

use std::path::PathBuf;

use super::admin::unguarded_admin;
use super::backends::parse_backend_uri;
use super::read::{issue, parse_listen};
use super::server::{parse_listener, tls_listeners_without_certificate};
use super::{BackendConfig, ComponentConfig, Config, ConfigError, PolicyConfig, TlsCertConfig};

/// Command-line settings that override the file (varnishd-style quick flags).
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    /// `-a ADDR`, repeatable.
    pub listen: Vec<String>,
    /// `-b URL`: the default backend's address.
    pub backend: Option<String>,
    /// `--component APP.wasm`: the default backend is this `wasi:http`
    /// component, served in-process.
    pub component: Option<PathBuf>,
    /// `--policy FILE.wasm`.
    pub policy: Option<PathBuf>,
    /// `--no-policy`: run without a policy even if the config names one.
    pub no_policy: bool,
    /// `--cache-dir DIR`.
    pub cache_dir: Option<PathBuf>,
    /// `--admin ADDR`.
    pub admin: Option<String>,
    /// `--tls-cert FILE`: with `tls_key`, replaces `[[server.tls]]` by one
    /// default certificate.
    pub tls_cert: Option<PathBuf>,
    /// `--tls-key FILE`.
    pub tls_key: Option<PathBuf>,
}

impl Config {
    /// Apply `-a`, `-b`, `--policy`, `--cache-dir` overrides, then validate again.
    pub fn apply_overrides(&mut self, o: &Overrides) -> Result<(), ConfigError> {
        let mut issues = Vec::new();
        if !o.listen.is_empty() {
            self.server.listen.clear();
            self.server.listen_tls.clear();
            self.server.listen_h2c.clear();
            self.server.listen_quic.clear();
            for a in &o.listen {
                match parse_listener(a) {
                    Ok((addr, scheme)) => self.server.add_listener(addr, scheme),
                    Err(m) => issues.push(issue("-a", m)),
                }
            }
        }
        match (&o.tls_cert, &o.tls_key) {
            (Some(cert), Some(key)) => {
                self.server.tls = vec![TlsCertConfig {
                    cert: cert.clone(),
                    key: key.clone(),
                    names: Vec::new(),
                    ocsp: None,
                }];
            }
            (Some(_), None) => issues.push(issue("--tls-cert", "needs --tls-key too")),
            (None, Some(_)) => issues.push(issue("--tls-key", "needs --tls-cert too")),
            (None, None) => {}
        }
        if let Some(m) = tls_listeners_without_certificate(&self.server) {
            issues.push(issue("-a", m));
        }
        if o.backend.is_some() && self.directors.contains_key(&self.default_backend) {
            issues.push(issue(
                "-b",
                format!(
                    "default_backend {:?} is a director: set its backends' addresses in the file",
                    self.default_backend
                ),
            ));
        } else if let Some(b) = &o.backend {
            match parse_backend_uri(b) {
                Ok(address) => {
                    let name = self.default_backend.clone();
                    let entry = self
                        .backends
                        .entry(name.clone())
                        .or_insert_with(|| BackendConfig::with_defaults(name, address.clone()));
                    entry.address = address;
                    entry.tls_for_scheme();
                }
                Err(m) => issues.push(issue("-b", m)),
            }
        }
        if let Some(path) = &o.component {
            if o.backend.is_some() {
                issues.push(issue(
                    "--component",
                    "the default backend is either -b URL or --component FILE, not both",
                ));
            } else if self.directors.contains_key(&self.default_backend) {
                issues.push(issue(
                    "--component",
                    format!(
                        "default_backend {:?} is a director: name the component in the file",
                        self.default_backend
                    ),
                ));
            } else {
                let name = self.default_backend.clone();
                let component = match self.backends.get(&name).and_then(|b| b.component.clone()) {
                    Some(c) => ComponentConfig {
                        path: path.clone(),
                        ..c
                    },
                    None => ComponentConfig::with_defaults(path.clone()),
                };
                self.backends
                    .insert(name.clone(), BackendConfig::component(name, component));
            }
        }
        if let Some(p) = &o.policy {
            match &mut self.policy {
                Some(pc) => pc.path = p.clone(),
                None => self.policy = Some(PolicyConfig::with_defaults(p.clone())),
            }
        }
        if o.no_policy {
            self.policy = None;
        }
        if let Some(d) = &o.cache_dir {
            self.cache.dir = Some(d.clone());
        }
        if let Some(a) = &o.admin {
            match parse_listen(a) {
                Ok(addr) => match unguarded_admin(addr, self.admin_token_file.as_deref()) {
                    Some(m) => issues.push(issue("--admin", m)),
                    None => self.admin = Some(addr),
                },
                Err(m) => issues.push(issue("--admin", m)),
            }
        }
        if issues.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::Invalid(issues))
        }
    }
}
