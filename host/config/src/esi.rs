//! `[esi]`: Edge Side Includes limits.

use std::time::Duration;

use super::read::{Reader, Table};

/// `[esi]`.
#[derive(Debug, Clone)]
pub struct EsiConfig {
    /// Deepest nesting of includes.
    pub max_depth: u32,
    /// Most includes in one page, nested ones counted.
    pub max_includes: usize,
    /// Concurrent include fetches per page; 1 is serial ESI, as Varnish does.
    pub max_concurrency: usize,
    /// Time allowed for one include.
    pub include_timeout: Duration,
    /// Time allowed for the whole page.
    pub page_deadline: Duration,
    /// Client request headers forwarded to include requests (lower-case).
    pub forward_headers: Vec<String>,
    /// A failed include nothing handles is left out (`"omit"`) or ends the
    /// page (`"fail"`, ESI 1.0).
    pub on_include_error: inlay_esi::OnIncludeError,
    /// Include output held per page before its turn (and `esi:attempt`
    /// content); a fragment that is ahead waits for room.
    pub max_buffered_bytes: usize,
}

impl Reader {
    pub(super) fn esi(&mut self, t: &Table) -> EsiConfig {
        let p = "esi";
        let max_buffered_bytes = self.size(t, p, "max_buffered_bytes", 16 << 20);
        if max_buffered_bytes < 64 << 10 {
            self.err(
                "esi.max_buffered_bytes",
                format!("must be at least 64KiB, got {max_buffered_bytes}"),
            );
        }
        let forward_headers = self
            .strings(t, p, "forward_headers")
            .unwrap_or_else(|| {
                ["accept-language", "user-agent", "accept"]
                    .map(String::from)
                    .to_vec()
            })
            .into_iter()
            .map(|h| h.to_ascii_lowercase())
            .collect();
        let on_include_error = match self.string(t, p, "on_include_error").as_deref() {
            None | Some("omit") => inlay_esi::OnIncludeError::Omit,
            Some("fail") => inlay_esi::OnIncludeError::Fail,
            Some(other) => {
                self.err(
                    "esi.on_include_error",
                    format!("expected \"omit\" or \"fail\", got {other:?}"),
                );
                inlay_esi::OnIncludeError::Omit
            }
        };
        let section = EsiConfig {
            max_depth: self.uint(t, p, "max_depth", 5, 0, 64) as u32,
            max_includes: self.uint(t, p, "max_includes", 256, 1, 100_000) as usize,
            max_concurrency: self.uint(t, p, "max_concurrency", 64, 1, 10_000) as usize,
            include_timeout: self.duration(t, p, "include_timeout", Duration::from_secs(10)),
            page_deadline: self.duration(t, p, "page_deadline", Duration::from_secs(30)),
            forward_headers,
            on_include_error,
            max_buffered_bytes: usize::try_from(max_buffered_bytes).unwrap_or(usize::MAX),
        };
        self.unknown_keys(t, p);
        section
    }
}
