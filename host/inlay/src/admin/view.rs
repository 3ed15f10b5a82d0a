//! What the admin API shows of the process: the running config with its
//! secrets redacted, and the store's stats per tier.

use std::time::Duration;

use inlay_storage::StoreStats;
use serde_json::{Map, Value, json};

use crate::config::{AccessLogFormat, AccessLogTarget, Config};

/// A TLS file of a backend, as configured.
fn tls_path(
    b: &crate::config::BackendConfig,
    field: impl Fn(&crate::config::TlsSettings) -> &Option<std::path::PathBuf>,
) -> Option<String> {
    let tls = b.tls.as_ref()?;
    field(tls).as_ref().map(|p| p.display().to_string())
}

/// What a redacted value reads.
pub const REDACTED: &str = "<redacted>";

/// The config as JSON, in the shape of the TOML file (durations as
/// `"30s"`, sizes in bytes). `[policy.config]` values, the user part of
/// backend URLs, and every value whose key names a token, secret,
/// password or key are replaced by `"<redacted>"`.
pub fn config_json(cfg: &Config) -> Value {
    let s = &cfg.server;
    let server = json!({
        "listen": s.listen.iter().map(|a| a.to_string())
            .chain(s.listen_tls.iter().map(|a| format!("https://{a}")))
            .chain(s.listen_h2c.iter().map(|a| format!("h2c://{a}")))
            .chain(s.listen_quic.iter().map(|a| format!("quic://{a}")))
            .collect::<Vec<_>>(),
        "tls": s.tls.iter().map(|t| json!({
            "cert": t.cert.display().to_string(),
            "names": t.names,
        })).collect::<Vec<_>>(),
        "tls_handshake_timeout": duration(s.tls_handshake_timeout),
        "proxy_protocol": s.proxy_protocol,
        "max_connections": s.max_connections,
        "max_connections_per_client": s.max_connections_per_client,
        "tarpit_max": s.tarpit_max,
        "header_read_timeout": duration(s.header_read_timeout),
        "idle_timeout": duration(s.idle_timeout),
        "busy_idle_timeout": duration(s.busy_idle_timeout),
        "send_timeout": duration(s.send_timeout),
        "idle_send_timeout": duration(s.idle_send_timeout),
        "tcp_notsent_lowat": s.tcp_notsent_lowat,
        "max_header_size": s.max_header_size,
        "h2_max_concurrent_streams": s.h2_max_concurrent_streams,
        "h2_max_header_list_size": s.h2_max_header_list_size,
        "h2_max_pending_accept_reset_streams": s.h2_max_pending_accept_reset_streams,
        "h2_max_local_error_reset_streams": s.h2_max_local_error_reset_streams,
        "h2_keep_alive_interval": duration(s.h2_keep_alive_interval),
        "h2_keep_alive_timeout": duration(s.h2_keep_alive_timeout),
        "max_request_body": s.max_request_body,
        "shutdown_timeout": duration(s.shutdown_timeout),
    });
    let backends: Map<String, Value> = cfg
        .backends
        .iter()
        .map(|(name, b)| {
            (
                name.clone(),
                json!({
                    "address": without_userinfo(&b.address.to_string()),
                    "host_header": b.host_header,
                    "connect_timeout": duration(b.connect_timeout),
                    "first_byte_timeout": duration(b.first_byte_timeout),
                    "between_bytes_timeout": duration(b.between_bytes_timeout),
                    "max_connections": b.max_connections,
                    "keepalive_timeout": duration(b.keepalive_timeout),
                    "max_idle_connections": b.max_idle_connections,
                    "http2": b.http2,
                    "ca_file": tls_path(b, |t| &t.ca_file),
                    "client_cert": tls_path(b, |t| &t.client_cert),
                    "client_key": tls_path(b, |t| &t.client_key),
                    "probe": b.probe.as_ref().map(|p| json!({
                        "url": p.url.as_str(),
                        "interval": duration(p.interval),
                        "timeout": duration(p.timeout),
                        "window": p.window,
                        "threshold": p.threshold,
                        "initial": p.initial,
                        "expected_status": p.expected_status,
                    })),
                }),
            )
        })
        .collect();
    let log = json!({
        "level": cfg.log.level,
        "access_log": match &cfg.log.access_log {
            AccessLogTarget::Stdout => "stdout".to_owned(),
            AccessLogTarget::Stderr => "stderr".to_owned(),
            AccessLogTarget::Off => "off".to_owned(),
            AccessLogTarget::File(p) => p.display().to_string(),
        },
        "access_log_format": match cfg.log.access_log_format {
            AccessLogFormat::Combined => "combined",
            AccessLogFormat::Json => "json",
        },
    });
    let c = &cfg.cache;
    let cache = json!({
        "dir": c.dir.as_ref().map(|d| d.display().to_string()),
        "memory_size": c.memory_size,
        "disk_size": c.disk_size,
        "default_ttl": duration(c.default_ttl),
        "default_grace": duration(c.default_grace),
        "default_keep": duration(c.default_keep),
        "max_object_size": c.max_object_size,
        "purge_allow": c.purge_allow.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
        "invalidate_on_unsafe": c.invalidate_on_unsafe,
        "ban_memory": c.ban_memory,
        "accept_encoding": c.accept_encoding,
        "strip_request_headers": c.strip_request_headers.iter().map(|h| h.as_str()).collect::<Vec<_>>(),
    });
    let e = &cfg.esi;
    let esi = json!({
        "max_depth": e.max_depth,
        "max_includes": e.max_includes,
        "max_concurrency": e.max_concurrency,
        "include_timeout": duration(e.include_timeout),
        "page_deadline": duration(e.page_deadline),
        "forward_headers": e.forward_headers,
        "on_include_error": match e.on_include_error {
            inlay_esi::OnIncludeError::Omit => "omit",
            inlay_esi::OnIncludeError::Fail => "fail",
        },
        "max_buffered_bytes": e.max_buffered_bytes,
    });
    let policy = cfg.policy.as_ref().map(|p| {
        json!({
            "path": p.path.display().to_string(),
            // The policy's settings are where its API keys live.
            "config": p.config.keys().map(|k| (k.clone(), json!(REDACTED))).collect::<Map<_, _>>(),
            "cpu_time": duration(p.cpu_time),
            "memory": p.memory,
            "max_host_calls": p.max_host_calls,
            "max_subrequests": p.max_subrequests,
            "max_subrequest_bytes": p.max_subrequest_bytes,
            "max_instances": p.max_instances,
            "instance_wait": duration(p.instance_wait),
            "host_wait": duration(p.host_wait),
            "prewarm": p.prewarm,
            "pre_instantiate": p.pre_instantiate,
            "memo_size": p.memo_size,
            "replay_always": p.replay_always,
        })
    });
    let admin = json!({
        "listen": cfg.admin.map(|a| a.to_string()),
        "token_file": cfg.admin_token_file.as_ref().map(|p| p.display().to_string()),
        "allowed_origins": cfg.admin_access.allowed_origins,
        "allowed_hosts": cfg.admin_access.allowed_hosts,
    });
    let mut v = json!({
        "server": server,
        "backends": backends,
        "default_backend": cfg.default_backend,
        "directors": cfg.directors.iter().map(|(name, d)| {
            let members: Vec<Value> = d.backends.iter().map(|m| json!({
                "backend": m.backend,
                "weight": m.weight,
            })).collect();
            (name.clone(), json!({ "type": d.kind.as_str(), "backends": members }))
        }).collect::<Map<String, Value>>(),
        "log": log,
        "cache": cache,
        "esi": esi,
        "policy": policy,
        "admin": admin,
    });
    redact(&mut v);
    v
}

fn duration(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// `http://user:pass@host` → `http://<redacted>@host`.
fn without_userinfo(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{REDACTED}{}", &rest[at..]),
        None => url.to_owned(),
    }
}

/// Whether a setting's name says it holds a secret.
fn is_secret_name(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    ["token", "secret", "password", "passwd", "key"]
        .iter()
        .any(|w| k.contains(w))
}

/// Replace every non-table value whose key names a secret; tables are
/// searched, not hidden (a backend may be named `keys`).
fn redact(v: &mut Value) {
    match v {
        Value::Object(map) => {
            for (k, inner) in map.iter_mut() {
                if is_secret_name(k) && !inner.is_object() && !inner.is_null() {
                    *inner = json!(REDACTED);
                } else {
                    redact(inner);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        _ => {}
    }
}

/// The store's stats grouped by tier: `memory`, `disk`, and what concerns
/// the whole store.
pub fn store_json(stats: &StoreStats) -> Value {
    let Ok(Value::Object(flat)) = serde_json::to_value(stats) else {
        return Value::Null;
    };
    let (mut memory, mut disk, mut store) = (Map::new(), Map::new(), Map::new());
    for (k, v) in flat {
        if let Some(name) = k.strip_prefix("memory_") {
            memory.insert(name.to_owned(), v);
        } else if let Some(name) = k.strip_suffix("_memory") {
            memory.insert(name.to_owned(), v);
        } else if let Some(name) = k.strip_prefix("disk_") {
            disk.insert(name.to_owned(), v);
        } else if let Some(name) = k.strip_suffix("_disk") {
            disk.insert(name.to_owned(), v);
        } else {
            store.insert(k, v);
        }
    }
    store.insert("memory".into(), Value::Object(memory));
    store.insert("disk".into(), Value::Object(disk));
    Value::Object(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_the_rest_shown() {
        let mut cfg = Config::from_toml(
            r#"
            [backends.api_keys]
            address = "http://user:pw@10.0.0.1:8080"
            [policy]
            path = "p.wasm"
            [policy.config]
            api_key = "k-123"
            greeting = "hello-456"
            [admin]
            listen = "127.0.0.1:6082"
            token_file = "/etc/inlay/admin.token"
            "#,
        )
        .unwrap();
        cfg.server.max_connections = 77;
        let v = config_json(&cfg);
        let text = v.to_string();
        for secret in ["k-123", "hello-456", "user:pw", "/etc/inlay/admin.token"] {
            assert!(!text.contains(secret), "{secret} shown in {v:#}");
        }
        assert_eq!(v["policy"]["config"]["greeting"], REDACTED);
        assert_eq!(v["admin"]["token_file"], REDACTED);
        assert_eq!(
            v["backends"]["api_keys"]["address"],
            format!("http://{REDACTED}@10.0.0.1:8080/")
        );
        assert_eq!(v["server"]["max_connections"], 77);
        assert_eq!(v["esi"]["on_include_error"], "omit");
        assert_eq!(v["admin"]["listen"], "127.0.0.1:6082");
    }

    #[test]
    fn store_stats_are_grouped_by_tier() {
        let stats = StoreStats {
            memory_objects: 3,
            hits_disk: 2,
            disk_enabled: true,
            write_errors: 1,
            ..StoreStats::default()
        };
        let v = store_json(&stats);
        assert_eq!(v["memory"]["objects"], 3);
        assert_eq!(v["disk"]["hits"], 2);
        assert_eq!(v["disk"]["enabled"], true);
        assert_eq!(v["write_errors"], 1);
    }
}
