//! The resolve step: the files a valid config names, read and checked
//! before a generation is built from it (the config itself is data only).
//! A start, a reload and `inlay check` resolve alike; every problem is
//! reported, each with its key path, as the config's own are.
//!
//! What it reads: the TLS listeners' certificates and keys
//! (`[[server.tls]]`), the TLS files of `https://` backends (`ca_file`,
//! `client_cert`, `client_key`) and the admin API's `token_file`. The
//! cluster's credentials are read when it connects, and the policy when
//! it loads.

use std::sync::Arc;

use crate::admin::AdminToken;
use crate::backend::tls::{self, BackendTlsSet};
use crate::config::{Config, ConfigError, ConfigIssue, unguarded_admin};
use crate::listeners::load_certificates;
use inlay_listener::CertificateSet;

/// A config with the files it names read: what a generation is built from.
#[derive(Debug)]
pub struct Resolved {
    /// The validated config.
    pub config: Arc<Config>,
    /// The TLS of each `https://` backend.
    pub backend_tls: BackendTlsSet,
    /// The admin API's bearer token, when `admin.token_file` is set.
    pub admin_token: Option<AdminToken>,
    /// The TLS listeners' certificates, by SNI name (none without
    /// `[[server.tls]]`).
    pub certificates: CertificateSet,
}

/// Read and check the files `config` names; every problem, with its key
/// path, when one does not load.
pub fn resolve(config: Config) -> Result<Resolved, ConfigError> {
    let mut issues = Vec::new();
    let backend_tls = tls::load_all(&config).unwrap_or_else(|found| {
        issues.extend(found);
        BackendTlsSet::new()
    });
    let admin_token = admin_token(&config).unwrap_or_else(|issue| {
        issues.push(issue);
        None
    });
    let certificates = load_certificates(&config.server.tls).unwrap_or_else(|found| {
        issues.extend(found);
        CertificateSet::default()
    });
    match issues.is_empty() {
        true => Ok(Resolved {
            config: Arc::new(config),
            backend_tls,
            admin_token,
            certificates,
        }),
        false => Err(ConfigError::Invalid(issues)),
    }
}

/// The admin API's token as `cfg` has it, read from `admin.token_file`
/// now (at start, and at a reload so that a rotated token takes effect).
/// At a reload the admin listener is the running one (a reload does not
/// move it): a token file removed while it listens beyond loopback refuses
/// the reload, as it refuses a start.
fn admin_token(cfg: &Config) -> Result<Option<AdminToken>, ConfigIssue> {
    let issue = |message: String| ConfigIssue {
        path: "admin.token_file".into(),
        message,
    };
    if let Some(listen) = cfg.admin
        && let Some(m) = unguarded_admin(listen, cfg.admin_token_file.as_deref())
    {
        return Err(issue(m));
    }
    let Some(path) = cfg.admin_token_file.as_deref() else {
        return Ok(None);
    };
    AdminToken::read(path)
        .map(Some)
        .map_err(|e| issue(format!("{e:#}")))
}
