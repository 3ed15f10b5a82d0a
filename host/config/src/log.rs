//! `[log]`: the diagnostic log's level and the access log.

use std::path::PathBuf;

use super::read::{Reader, Table};

/// Access-log line format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessLogFormat {
    /// NCSA combined log format, as Apache and varnishncsa write it.
    Combined,
    /// One JSON object per line.
    Json,
}

/// Where the access log goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AccessLogTarget {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
    /// Appended to a file.
    File(PathBuf),
    /// No access log.
    Off,
}

/// `[log]`.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// `tracing` filter for the diagnostic log (stderr), e.g. `info` or `inlay=debug`.
    pub level: String,
    /// Where access-log lines go.
    pub access_log: AccessLogTarget,
    /// The access-log line format.
    pub access_log_format: AccessLogFormat,
}

impl Reader {
    pub(super) fn log(&mut self, t: &Table) -> LogConfig {
        let p = "log";
        let level = self.string(t, p, "level").unwrap_or_else(|| "info".into());
        if tracing_subscriber::EnvFilter::try_new(&level).is_err() {
            self.err(
                "log.level",
                format!("not a log filter like \"info\" or \"inlay=debug\": {level:?}"),
            );
        }
        let access_log = match self.string(t, p, "access_log").as_deref() {
            None | Some("stdout") => AccessLogTarget::Stdout,
            Some("stderr") => AccessLogTarget::Stderr,
            Some("off") | Some("") => AccessLogTarget::Off,
            Some(path) => AccessLogTarget::File(PathBuf::from(path)),
        };
        let access_log_format = match self.string(t, p, "access_log_format").as_deref() {
            None | Some("combined") => AccessLogFormat::Combined,
            Some("json") => AccessLogFormat::Json,
            Some(other) => {
                self.err(
                    "log.access_log_format",
                    format!("expected \"combined\" or \"json\", got {other:?}"),
                );
                AccessLogFormat::Combined
            }
        };
        let section = LogConfig {
            level,
            access_log,
            access_log_format,
        };
        self.unknown_keys(t, p);
        section
    }
}
