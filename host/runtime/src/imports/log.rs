//! `inlay:policy/log`: the policy's log lines, written by the host's
//! `tracing` subscriber under the target `inlay::policy`.

use crate::bindings::inlay::policy::log::{Host, Level};
use crate::limits::Admit;
use crate::policy::state::StoreState;

/// Cuts `line` to at most `max` bytes on a character boundary.
fn truncate(line: &str, max: usize) -> &str {
    if line.len() <= max {
        return line;
    }
    let mut end = max;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    &line[..end]
}

impl Host for StoreState {
    fn write(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        // Replayed requests write the line too: it is the policy's output.
        self.call("log.write", move |s| {
            // A policy must not flood the log with many lines or huge ones.
            let admit = s.log_lines.admit();
            let policy = s.policy().name.as_str();
            let hook = s.hook.as_str();
            match admit {
                Admit::Write => {}
                Admit::DropFirst => {
                    let max = s.policy().limits.log_max_lines;
                    tracing::warn!(target: "inlay::policy", policy, hook, "log line limit ({max} per request) reached; dropping this request's further lines");
                    return Ok(());
                }
                Admit::Drop => return Ok(()),
            }
            let message = truncate(&message, s.policy().limits.log_max_line);
            match level {
                Level::Trace => tracing::trace!(target: "inlay::policy", policy, hook, "{message}"),
                Level::Debug => tracing::debug!(target: "inlay::policy", policy, hook, "{message}"),
                Level::Info => tracing::info!(target: "inlay::policy", policy, hook, "{message}"),
                Level::Warn => tracing::warn!(target: "inlay::policy", policy, hook, "{message}"),
                Level::Error => tracing::error!(target: "inlay::policy", policy, hook, "{message}"),
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(super::truncate("héllo", 2), "h");
        assert_eq!(super::truncate("héllo", 3), "hé");
        assert_eq!(super::truncate("abc", 10), "abc");
    }
}
