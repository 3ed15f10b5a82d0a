//! `inlay admin`: the admin API's command-line client, as varnishadm is
//! Varnish's. The address and token come from the config's `[admin]`
//! (the embedded default config without `--config`); it prints the JSON
//! answer and exits 0 on a 2xx answer, 1 on an error answer (its message
//! on stderr), 2 on a usage or connection error.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http::{HeaderValue, Method, Request, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};

use super::AdminToken;
use crate::config::Config;

/// Flags of `inlay admin`.
#[derive(Debug, Clone, clap::Args)]
pub struct AdminArgs {
    /// The config whose `[admin]` names the address and the token file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The admin API's address (instead of `admin.listen`).
    #[arg(long, value_name = "ADDR")]
    pub address: Option<String>,
    /// The file holding the bearer token (instead of `admin.token_file`).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// What to ask.
    #[command(subcommand)]
    pub command: AdminCommand,
}

/// What `inlay admin` asks the admin API.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AdminCommand {
    /// Store stats per tier, the policy, uptime and version (`GET /stats`).
    Stats,
    /// Whether the process lives (`GET /healthz`).
    Health,
    /// Whether it takes traffic (`GET /readyz`).
    Ready,
    /// Purge every variant of a URL (`POST /purge`).
    Purge {
        /// `http://host/path?query`, or `/path?query` with `--host`.
        url: String,
        /// Mark stale (served in grace while refreshed) instead of removing.
        #[arg(long)]
        soft: bool,
        /// The Host of a path-only URL.
        #[arg(long, value_name = "HOST")]
        host: Option<String>,
    },
    /// Purge every object tagged with one of the surrogate keys (`POST /purge`).
    PurgeKey {
        /// Surrogate keys.
        #[arg(required = true, value_name = "KEY")]
        keys: Vec<String>,
        /// Mark stale instead of removing.
        #[arg(long)]
        soft: bool,
    },
    /// Add a ban (`POST /ban`), e.g. `ban 'req.url ~ ^/products/'`.
    Ban {
        /// The ban expression; several words are joined with spaces.
        #[arg(required = true, num_args = 1.., allow_hyphen_values = true, value_name = "EXPR")]
        expression: Vec<String>,
    },
    /// The ban list (`GET /bans`).
    Bans,
    /// Reload the config (`POST /reload`).
    Reload,
    /// The running config, secrets redacted (`GET /config`).
    Config,
    /// The Prometheus metrics (`GET /metrics`).
    Metrics,
    /// The cluster's policy rollout (`[cluster]`).
    Policy {
        /// What to do.
        #[command(subcommand)]
        action: PolicyAction,
    },
}

/// `inlay admin policy ...`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PolicyAction {
    /// Store a component as the cluster's new policy version; every node
    /// loads it (`POST /policy/push`).
    Push {
        /// The `.wasm` component.
        file: PathBuf,
        /// Roll out the file of this component backend instead of the
        /// policy (`?component=NAME`).
        #[arg(long, value_name = "NAME")]
        component: Option<String>,
    },
    /// Return every node to the version pushed before the current one
    /// (`POST /policy/rollback`).
    Rollback {
        /// This component backend's file instead of the policy.
        #[arg(long, value_name = "NAME")]
        component: Option<String>,
    },
    /// The version this node runs and the cluster's current one (`GET /policy`).
    Status {
        /// This component backend's file instead of the policy.
        #[arg(long, value_name = "NAME")]
        component: Option<String>,
    },
}

/// `path`, with `?component=NAME` when a component backend is named.
fn for_component(path: &str, component: &Option<String>) -> String {
    match component {
        Some(name) => format!("{path}?component={name}"),
        None => path.to_owned(),
    }
}

impl AdminCommand {
    /// The method, path and JSON body of the request.
    fn request(&self) -> (Method, String, Option<Value>) {
        let (method, path, body) = match self {
            Self::Stats => (Method::GET, "/stats", None),
            Self::Health => (Method::GET, "/healthz", None),
            Self::Ready => (Method::GET, "/readyz", None),
            Self::Purge { url, soft, host } => {
                let mut body = json!({ "url": url, "soft": soft });
                if let Some(h) = host {
                    body["host"] = json!(h);
                }
                (Method::POST, "/purge", Some(body))
            }
            Self::PurgeKey { keys, soft } => (
                Method::POST,
                "/purge",
                Some(json!({ "surrogate_keys": keys, "soft": soft })),
            ),
            Self::Ban { expression } => (
                Method::POST,
                "/ban",
                Some(json!({ "expression": expression.join(" ") })),
            ),
            Self::Bans => (Method::GET, "/bans", None),
            Self::Reload => (Method::POST, "/reload", None),
            Self::Config => (Method::GET, "/config", None),
            Self::Metrics => (Method::GET, "/metrics", None),
            // The component is the body, read in `main`.
            Self::Policy { action } => {
                return match action {
                    PolicyAction::Push { component, .. } => {
                        (Method::POST, for_component("/policy/push", component), None)
                    }
                    PolicyAction::Rollback { component } => (
                        Method::POST,
                        for_component("/policy/rollback", component),
                        None,
                    ),
                    PolicyAction::Status { component } => {
                        (Method::GET, for_component("/policy", component), None)
                    }
                };
            }
        };
        (method, path.to_owned(), body)
    }
}

/// Longest an answer may take (a reload compiles the policy).
const ANSWER_TIMEOUT: Duration = Duration::from_secs(300);
/// Largest answer read.
const MAX_ANSWER: usize = 64 << 20;

/// Run `inlay admin`; its exit status.
pub fn main(args: AdminArgs) -> ExitCode {
    let (addr, token) = match target(&args) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("inlay admin: {e:#}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("inlay admin: cannot start the async runtime: {e}");
            return ExitCode::from(2);
        }
    };
    let (method, path, body) = args.command.request();
    let body = match (&args.command, body) {
        (
            AdminCommand::Policy {
                action: PolicyAction::Push { file, .. },
            },
            _,
        ) => match std::fs::read(file) {
            Ok(bytes) => Some((Bytes::from(bytes), super::WASM_MEDIA_TYPE)),
            Err(e) => {
                eprintln!("inlay admin: cannot read {}: {e}", file.display());
                return ExitCode::from(2);
            }
        },
        (_, Some(v)) => Some((Bytes::from(v.to_string()), super::JSON_MEDIA_TYPE)),
        (_, None) => None,
    };
    match rt.block_on(call(addr, token.as_ref(), method, &path, body)) {
        Err(e) => {
            eprintln!("inlay admin: {e:#}");
            ExitCode::from(2)
        }
        Ok((status, text)) if status.is_success() => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Ok((status, text)) => {
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_owned))
                .unwrap_or_else(|| text.trim().to_owned());
            print!("{text}");
            eprintln!("inlay admin: {path}: {status}: {message}");
            // A refused reload lists every error of the file.
            let errors = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v.get("errors").and_then(|e| e.as_array()).cloned())
                .unwrap_or_default();
            for e in errors {
                eprintln!(
                    "  {}",
                    e.as_str().map_or_else(|| e.to_string(), str::to_owned)
                );
            }
            ExitCode::from(1)
        }
    }
}

/// Where to connect and the token to send: flags first, then the config.
fn target(args: &AdminArgs) -> anyhow::Result<(SocketAddr, Option<AdminToken>)> {
    let cfg = match &args.config {
        Some(p) => Config::from_file(p)?,
        None => Config::embedded_default(),
    };
    let addr = match &args.address {
        Some(a) => parse_address(a)?,
        None => cfg.admin.ok_or_else(|| {
            anyhow::anyhow!("no admin address: set admin.listen in the config or pass --address")
        })?,
    };
    let token_file = args.token_file.as_ref().or(cfg.admin_token_file.as_ref());
    let token = token_file.map(|p| AdminToken::read(p)).transpose()?;
    Ok((reachable(addr), token))
}

fn parse_address(a: &str) -> anyhow::Result<SocketAddr> {
    let a = a.strip_prefix("http://").unwrap_or(a).trim_end_matches('/');
    let full = match a.starts_with(':') {
        true => format!("127.0.0.1{a}"),
        false => a.to_owned(),
    };
    full.parse()
        .with_context(|| format!("--address: not an address like 127.0.0.1:6082: {a:?}"))
}

/// A listener on every interface is reached on loopback.
fn reachable(addr: SocketAddr) -> SocketAddr {
    match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), addr.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), addr.port())
        }
        _ => addr,
    }
}

async fn call(
    addr: SocketAddr,
    token: Option<&AdminToken>,
    method: Method,
    path: &str,
    body: Option<(Bytes, &'static str)>,
) -> anyhow::Result<(http::StatusCode, String)> {
    let stream = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| anyhow::anyhow!("cannot connect to the admin API at {addr}: timed out"))?
        .with_context(|| format!("cannot connect to the admin API at {addr}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .context("admin API handshake")?;
    tokio::spawn(conn);
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::HOST, addr.to_string());
    if let Some(t) = token {
        let mut v = b"Bearer ".to_vec();
        v.extend_from_slice(t.secret());
        let mut v = HeaderValue::from_bytes(&v).context("the token is not a header value")?;
        v.set_sensitive(true);
        req = req.header(header::AUTHORIZATION, v);
    }
    let body = match body {
        Some((bytes, content_type)) => {
            req = req.header(header::CONTENT_TYPE, content_type);
            bytes
        }
        None => Bytes::new(),
    };
    let req = req.body(Full::new(body)).context("building the request")?;
    let answer = async {
        let resp = sender
            .send_request(req)
            .await
            .context("the admin API did not answer")?;
        let status = resp.status();
        let bytes = Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| anyhow::anyhow!("reading the admin API's answer: {e}"))?
            .to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
    };
    tokio::time::timeout(ANSWER_TIMEOUT, answer)
        .await
        .map_err(|_| anyhow::anyhow!("the admin API did not answer within {ANSWER_TIMEOUT:?}"))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_on_every_interface_are_reached_on_loopback() {
        assert_eq!(
            reachable("0.0.0.0:6082".parse().unwrap()),
            "127.0.0.1:6082".parse().unwrap()
        );
        assert_eq!(
            reachable("[::]:6082".parse().unwrap()),
            "[::1]:6082".parse().unwrap()
        );
        assert_eq!(
            parse_address("http://10.0.0.1:6082/").unwrap(),
            "10.0.0.1:6082".parse().unwrap()
        );
        assert_eq!(
            parse_address(":6082").unwrap(),
            "127.0.0.1:6082".parse().unwrap()
        );
        assert!(parse_address("nowhere").is_err());
    }
}
