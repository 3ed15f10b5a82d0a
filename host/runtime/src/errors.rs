//! Every way loading or running a policy can fail, and the one place that
//! decides which HTTP status a client sees for it.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use http::StatusCode;

/// A phase of the policy's life in which a failure happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hook {
    /// Creating the request's instance (runs the guest's start code).
    Instantiate,
    /// The `on-request` hook.
    OnRequest,
    /// The `on-backend-response` hook.
    OnBackendResponse,
    /// The `on-deliver` hook.
    OnDeliver,
}

impl Hook {
    /// The hook's name as the WIT world spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Hook::Instantiate => "instantiate",
            Hook::OnRequest => "on-request",
            Hook::OnBackendResponse => "on-backend-response",
            Hook::OnDeliver => "on-deliver",
        }
    }
}

impl fmt::Display for Hook {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a policy could not be loaded or could not finish a request.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The policy file could not be read.
    #[error("cannot read policy {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The file is not WebAssembly, or could not be turned into a component
    /// or compiled.
    #[error("cannot compile policy {path}: {message}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// What went wrong, with the toolchain's details.
        message: String,
    },
    /// The component does not implement the `inlay:policy/policy` world
    /// (missing export, wrong signature, or an import the host does not give).
    #[error("policy {path} does not match the inlay:policy@0.1.0 world: {message}")]
    WorldMismatch {
        /// The file.
        path: PathBuf,
        /// Which import or export does not fit.
        message: String,
    },
    /// The limits in the config are invalid.
    #[error("invalid policy limits: {0}")]
    InvalidLimits(String),
    /// The engine and its pool of `max_instances` could not be made (the
    /// address space the pool reserves is not available, or a thread could
    /// not start).
    #[error("cannot make a pool of {max_instances} policy instances: {message}")]
    Engine {
        /// The pool size asked for.
        max_instances: u32,
        /// What the engine or the system said.
        message: String,
    },
    /// A store or instance could not be created (for example the pool of
    /// concurrent instances is exhausted), or the guest's start code failed.
    #[error("cannot instantiate policy: {message}")]
    Instantiate {
        /// The engine's explanation.
        message: String,
    },
    /// Every instance of the pool stayed in use for as long as a request
    /// may wait for one (`instance_wait_ms`).
    #[error("no policy instance free after waiting {waited:?}: all {max_instances} are in use")]
    PoolExhausted {
        /// How long the request waited.
        waited: Duration,
        /// The size of the pool.
        max_instances: u32,
    },
    /// The guest trapped (a panic, `unreachable`, a bad memory access, or a
    /// host function refused an invalid call).
    #[error("policy trapped in {hook}: {message}")]
    Trap {
        /// Where it trapped.
        hook: Hook,
        /// The trap and the guest backtrace.
        message: String,
    },
    /// The hook used up its CPU budget (epoch deadline).
    #[error("policy exceeded its CPU time of {budget:?} in {hook}")]
    Timeout {
        /// Where it ran out.
        hook: Hook,
        /// The budget per hook call.
        budget: Duration,
    },
    /// The guest tried to grow its memory past the cap and then failed.
    #[error("policy ran out of memory ({limit} bytes) in {hook}")]
    OutOfMemory {
        /// Where it ran out.
        hook: Hook,
        /// The memory cap in bytes.
        limit: u64,
    },
    /// The guest made more host calls than allowed, through a function that
    /// has no `limit-exceeded` error variant, so the host trapped it.
    #[error("policy exceeded its limit of {limit} {what} in {hook}")]
    LimitExceeded {
        /// Where it happened.
        hook: Hook,
        /// Which limit (for example "host calls").
        what: &'static str,
        /// The limit.
        limit: u32,
    },
    /// The hook returned a value the host cannot use (a synthetic response
    /// with an invalid status or header).
    #[error("policy returned an invalid result from {hook}: {message}")]
    InvalidResult {
        /// The hook.
        hook: Hook,
        /// What is wrong with it.
        message: String,
    },
    /// An earlier hook of this request failed (or was cancelled) and the
    /// instance can no longer be entered.
    #[error("policy instance unusable in {hook}: an earlier hook failed")]
    AlreadyFailed {
        /// The hook that was refused.
        hook: Hook,
    },
}

impl From<PolicyError> for inlay_core::ProxyError {
    fn from(e: PolicyError) -> Self {
        Self::Policy {
            status: e.client_status(),
            message: e.to_string(),
        }
    }
}

impl PolicyError {
    /// Whether the guest ran into one of its limits (CPU time, memory, host
    /// calls, subrequests): what the machine or the request did, not a
    /// fault of the code, so the same code may pass the next time.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::Timeout { .. } | Self::OutOfMemory { .. } | Self::LimitExceeded { .. }
        )
    }

    /// The status the client gets when a request fails with this error.
    ///
    /// A misbehaving policy is the server's fault, never the client's, so
    /// every case is a 5xx: 503 where retrying may help (the CPU deadline,
    /// a full instance pool), 500 for everything that will fail again (a
    /// trap, out of memory, a cap, a policy that does not load).
    pub fn client_status(&self) -> StatusCode {
        match self {
            PolicyError::Timeout { .. }
            | PolicyError::Instantiate { .. }
            | PolicyError::PoolExhausted { .. } => StatusCode::SERVICE_UNAVAILABLE,
            PolicyError::Io { .. }
            | PolicyError::Compile { .. }
            | PolicyError::WorldMismatch { .. }
            | PolicyError::InvalidLimits(_)
            | PolicyError::Engine { .. }
            | PolicyError::Trap { .. }
            | PolicyError::OutOfMemory { .. }
            | PolicyError::LimitExceeded { .. }
            | PolicyError::InvalidResult { .. }
            | PolicyError::AlreadyFailed { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The hook the failure happened in, for request-time errors.
    pub fn hook(&self) -> Option<Hook> {
        match self {
            PolicyError::Trap { hook, .. }
            | PolicyError::Timeout { hook, .. }
            | PolicyError::OutOfMemory { hook, .. }
            | PolicyError::LimitExceeded { hook, .. }
            | PolicyError::InvalidResult { hook, .. }
            | PolicyError::AlreadyFailed { hook } => Some(*hook),
            PolicyError::Instantiate { .. } | PolicyError::PoolExhausted { .. } => {
                Some(Hook::Instantiate)
            }
            PolicyError::Io { .. }
            | PolicyError::Compile { .. }
            | PolicyError::WorldMismatch { .. }
            | PolicyError::InvalidLimits(_)
            | PolicyError::Engine { .. } => None,
        }
    }
}

/// A trap raised by a host function when a per-request cap is reached and
/// the WIT function has no error variant to report it.
#[derive(Debug, thiserror::Error)]
#[error("limit of {limit} {what} reached")]
pub(crate) struct HostLimitTrap {
    pub(crate) what: &'static str,
    pub(crate) limit: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_say_whose_fault_and_whether_to_retry() {
        let timeout = PolicyError::Timeout {
            hook: Hook::OnRequest,
            budget: Duration::from_millis(50),
        };
        assert_eq!(timeout.client_status(), StatusCode::SERVICE_UNAVAILABLE);
        let trap = PolicyError::Trap {
            hook: Hook::OnDeliver,
            message: "unreachable".into(),
        };
        assert_eq!(trap.client_status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(trap.hook(), Some(Hook::OnDeliver));
        assert_eq!(
            trap.to_string(),
            "policy trapped in on-deliver: unreachable"
        );
        let oom = PolicyError::OutOfMemory {
            hook: Hook::OnRequest,
            limit: 1,
        };
        assert_eq!(oom.client_status(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
