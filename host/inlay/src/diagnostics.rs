//! The diagnostic log (stderr): its filter from `log.level` or `INLAY_LOG`,
//! with the libraries a client can make talk kept quiet, and replaced by a
//! reload.

/// Libraries whose warnings a client triggers at will, kept at error level
/// unless `log.level` names them: h2 warns once per connection that resets
/// too many streams (rapid reset), and an attacker reconnects at will;
/// rustls warns per handshake about what a client sent (an IP address as
/// SNI, as wrk does). The filter (`log.level` or `INLAY_LOG`) keeps them
/// when it names them. Inlay's own line for such a connection is
/// rate-limited (inlay-listener).
const QUIET_LIBRARIES: &[(&str, &str)] = &[("h2", "h2=error"), ("rustls", "rustls=error")];

/// `log.level` (or `INLAY_LOG`) with [`QUIET_LIBRARIES`] added where it does not set them.
fn log_directives(level: &str) -> String {
    let mut directives = level.to_string();
    for (target, directive) in QUIET_LIBRARIES {
        let named = level
            .split(',')
            .any(|d| d.trim().split(['=', '[']).next() == Some(*target));
        if !named {
            directives.push(',');
            directives.push_str(directive);
        }
    }
    directives
}

/// The diagnostic log's filter, replaceable by a reload (`log.level`).
type LogFilter =
    tracing_subscriber::reload::Handle<tracing_subscriber::EnvFilter, tracing_subscriber::Registry>;

/// Set by [`init_tracing`]; `None` inside: `INLAY_LOG` chose the filter.
static LOG_FILTER: std::sync::OnceLock<Option<LogFilter>> = std::sync::OnceLock::new();

/// Install the diagnostic log with `level` (unless `INLAY_LOG` is set and
/// valid); a second call keeps the first one's.
pub fn init_tracing(level: &str) {
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    // INLAY_LOG, when set and valid, replaces `log.level`.
    let from_env = std::env::var("INLAY_LOG")
        .ok()
        .and_then(|env| EnvFilter::try_new(log_directives(&env)).ok());
    let (filter, from_env) = match from_env {
        Some(f) => (f, true),
        None => (
            EnvFilter::try_new(log_directives(level)).unwrap_or_else(|_| EnvFilter::new("info")),
            false,
        ),
    };
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let installed = tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                .with_target(false),
        )
        .try_init()
        .is_ok();
    if installed {
        let _ = LOG_FILTER.set((!from_env).then_some(handle));
    }
}

/// Apply a new `log.level` to the diagnostic log; `Err` says why it was
/// not (`INLAY_LOG` is set, or no log of ours is installed).
pub fn set_log_level(level: &str) -> Result<(), String> {
    match LOG_FILTER.get() {
        Some(Some(handle)) => {
            let filter = tracing_subscriber::EnvFilter::try_new(log_directives(level))
                .map_err(|e| format!("log.level: {e}"))?;
            handle
                .reload(filter)
                .map_err(|e| format!("log.level: cannot apply it: {e}"))
        }
        Some(None) => Err("log.level changed: INLAY_LOG is set and chooses the filter".into()),
        None => Err("log.level changed: the diagnostic log is not inlay's own".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::log_directives;

    #[test]
    fn client_triggered_library_warnings_are_quiet_unless_the_level_names_the_library() {
        assert_eq!(log_directives("info"), "info,h2=error,rustls=error");
        assert_eq!(
            log_directives("warn,inlay=debug"),
            "warn,inlay=debug,h2=error,rustls=error"
        );
        // An operator who asks for h2's lines gets them.
        assert_eq!(
            log_directives("info,h2=debug"),
            "info,h2=debug,rustls=error"
        );
        assert_eq!(
            log_directives("h2[conn]=trace,rustls=warn"),
            "h2[conn]=trace,rustls=warn"
        );
        // A target that only starts with "h2" does not count.
        assert_eq!(log_directives("h2x=info"), "h2x=info,h2=error,rustls=error");
    }
}
