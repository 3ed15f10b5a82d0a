//! The access log: one line per request, NCSA combined (as varnishncsa
//! writes it) or JSON, written when the response body is finished.

use std::io::Write;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::config::{AccessLogFormat, AccessLogTarget, LogConfig};

/// What the log phase knows about a finished request.
#[derive(Debug, Clone, Default)]
pub struct AccessRecord {
    /// Client address.
    pub client: Option<IpAddr>,
    /// Request method.
    pub method: String,
    /// Path and query as received.
    pub url: String,
    /// `HTTP/1.1`, `HTTP/2.0`.
    pub protocol: String,
    /// Status sent.
    pub status: u16,
    /// Body bytes sent.
    pub bytes: u64,
    /// Referer header.
    pub referer: Option<String>,
    /// User-Agent header.
    pub user_agent: Option<String>,
    /// Host header.
    pub host: Option<String>,
    /// Cache outcome: hit, miss, pass, stale, synth, error.
    pub cache: &'static str,
    /// Backend that served it, if any.
    pub backend: Option<String>,
    /// Time from request head to last body byte.
    pub duration: Duration,
    /// Why the request failed, if it did.
    pub error: Option<String>,
}

/// Writes access-log lines.
#[derive(Clone)]
pub struct AccessLog {
    format: AccessLogFormat,
    sink: Option<Arc<Mutex<Box<dyn Write + Send>>>>,
}

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog")
            .field("format", &self.format)
            .finish()
    }
}

impl AccessLog {
    /// Open the configured target.
    pub fn open(cfg: &LogConfig) -> std::io::Result<Self> {
        let sink: Option<Box<dyn Write + Send>> = match &cfg.access_log {
            AccessLogTarget::Off => None,
            AccessLogTarget::Stdout => Some(Box::new(std::io::stdout())),
            AccessLogTarget::Stderr => Some(Box::new(std::io::stderr())),
            AccessLogTarget::File(p) => Some(Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)?,
            )),
        };
        Ok(Self {
            format: cfg.access_log_format,
            sink: sink.map(|s| Arc::new(Mutex::new(s))),
        })
    }

    /// Write one line. Failures to write are ignored: logging must not fail requests.
    pub fn write(&self, r: &AccessRecord) {
        let Some(sink) = &self.sink else { return };
        let line = match self.format {
            AccessLogFormat::Combined => combined(r),
            AccessLogFormat::Json => json(r),
        };
        let mut w = sink.lock();
        let _ = w.write_all(line.as_bytes());
        let _ = w.flush();
    }
}

fn combined(r: &AccessRecord) -> String {
    let now = httpdate_ncsa();
    format!(
        "{} - - [{}] \"{} {} {}\" {} {} \"{}\" \"{}\"\n",
        r.client
            .map(|c| c.to_string())
            .unwrap_or_else(|| "-".into()),
        now,
        r.method,
        r.url,
        r.protocol,
        r.status,
        if r.bytes == 0 {
            "-".to_string()
        } else {
            r.bytes.to_string()
        },
        r.referer.as_deref().unwrap_or("-").replace('"', "\\\""),
        r.user_agent.as_deref().unwrap_or("-").replace('"', "\\\""),
    )
}

fn json(r: &AccessRecord) -> String {
    let v = serde_json::json!({
        "time": httpdate::fmt_http_date(std::time::SystemTime::now()),
        "client": r.client.map(|c| c.to_string()),
        "method": r.method,
        "url": r.url,
        "protocol": r.protocol,
        "host": r.host,
        "status": r.status,
        "bytes": r.bytes,
        "referer": r.referer,
        "user_agent": r.user_agent,
        "cache": r.cache,
        "backend": r.backend,
        "duration_ms": r.duration.as_secs_f64() * 1000.0,
        "error": r.error,
    });
    format!("{v}\n")
}

/// The NCSA time format, `10/Oct/2000:13:55:36 +0000`, always in UTC.
fn httpdate_ncsa() -> String {
    // httpdate gives "Tue, 10 Oct 2000 13:55:36 GMT"; rearrange it.
    let s = httpdate::fmt_http_date(std::time::SystemTime::now());
    let parts: Vec<&str> = s.split(' ').collect();
    if parts.len() == 6 {
        format!("{}/{}/{}:{} +0000", parts[1], parts[2], parts[3], parts[4])
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_line_has_the_ncsa_fields() {
        let r = AccessRecord {
            client: Some("127.0.0.1".parse().unwrap()),
            method: "GET".into(),
            url: "/a?b".into(),
            protocol: "HTTP/1.1".into(),
            status: 200,
            bytes: 12,
            user_agent: Some("curl/8".into()),
            ..Default::default()
        };
        let line = combined(&r);
        assert!(line.starts_with("127.0.0.1 - - ["), "{line}");
        assert!(
            line.contains("] \"GET /a?b HTTP/1.1\" 200 12 \"-\" \"curl/8\"\n"),
            "{line}"
        );
        let j: serde_json::Value = serde_json::from_str(&json(&r)).unwrap();
        assert_eq!(j["status"], 200);
    }
}
