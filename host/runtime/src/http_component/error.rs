//! How loading or running a component backend fails, and what a request
//! that failed becomes: the component is the origin, so its failures are
//! the origin's (a 502, 503 or 504, as a socket origin's would be).

use std::path::PathBuf;
use std::time::Duration;

use inlay_core::ProxyError;

/// Why a component could not be loaded or could not answer a request.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ComponentError {
    /// The file is not a component wasmtime can compile.
    #[error("cannot compile component {path}: {message}")]
    Compile {
        /// The file.
        path: PathBuf,
        /// What the compiler said.
        message: String,
    },
    /// The component exports neither `wasi:http/incoming-handler@0.2` nor
    /// `wasi:http/handler@0.3`, or
    /// imports something the host does not give.
    #[error(
        "component {path} is not a wasi:http/proxy 0.2 or wasi:http/service 0.3 component the host can run: {message}"
    )]
    WorldMismatch {
        /// The file.
        path: PathBuf,
        /// The linker's explanation.
        message: String,
    },
    /// Instance reuse asked of a `wasi:http/proxy` 0.2 component.
    #[error(
        "component {path} is a wasi:http/proxy 0.2 component, which gets a fresh instance for \
         every request: requests_per_instance and concurrent_requests_per_instance are for \
         wasi:http/service 0.3 components"
    )]
    NoReuse {
        /// The file.
        path: PathBuf,
    },
    /// The engine and its pool of `max_instances` could not be made.
    #[error("cannot make a pool of {max_instances} component instances: {message}")]
    Engine {
        /// The pool size asked for.
        max_instances: u32,
        /// What the engine or the system said.
        message: String,
    },
    /// Every instance stayed in use for `instance_wait`.
    #[error("no component instance free after waiting {waited:?}: all {max_instances} are in use")]
    PoolExhausted {
        /// How long the request waited.
        waited: Duration,
        /// The pool's size.
        max_instances: u32,
    },
    /// The guest trapped (a panic, `unreachable`, a bad memory access), in
    /// its start code or in `handle`.
    #[error("component trapped: {message}")]
    Trap {
        /// The trap and the guest's backtrace.
        message: String,
    },
    /// The request used up its CPU time.
    #[error("component used up its CPU time of {budget:?}")]
    CpuTime {
        /// The budget per request.
        budget: Duration,
    },
    /// The guest tried to grow its memory past the cap and then failed.
    #[error("component ran out of memory ({limit} bytes)")]
    OutOfMemory {
        /// The cap in bytes.
        limit: u64,
    },
    /// The request kept its instance past `request_timeout`.
    #[error("component still running after {timeout:?} (request_timeout)")]
    RequestTimeout {
        /// The setting.
        timeout: Duration,
    },
    /// No response head within the backend's `first_byte_timeout` of the
    /// request being handed to the component (waiting for an instance
    /// included), as an origin's.
    #[error("component gave no response head within {timeout:?} (first_byte_timeout)")]
    FirstByteTimeout {
        /// The backend's setting.
        timeout: Duration,
    },
    /// `handle` returned without setting a response, or set an error.
    #[error("component gave no response: {message}")]
    NoResponse {
        /// What it gave instead.
        message: String,
    },
    /// The request could not be handed to the guest (a header or URI the
    /// component model's types cannot carry).
    #[error("request cannot be given to the component: {message}")]
    BadRequest {
        /// Why.
        message: String,
    },
    /// The instance's worker was stopped before the request finished: the
    /// server is shutting down.
    #[error("component instance stopped: the server is shutting down")]
    Stopped,
}

impl ComponentError {
    /// Whether the failure is one of the request's limits (CPU time,
    /// memory, the wall-clock cap) rather than the code's fault.
    pub fn is_limit(&self) -> bool {
        matches!(
            self,
            Self::CpuTime { .. } | Self::OutOfMemory { .. } | Self::RequestTimeout { .. }
        )
    }

    /// The error the pipeline sees for a request to backend `backend` that
    /// failed with this: a full pool is a busy backend (503), anything
    /// else a failed origin (502) whose reason says which limit or trap.
    pub fn into_proxy_error(self, backend: &str) -> ProxyError {
        let backend = backend.to_owned();
        match self {
            Self::PoolExhausted { .. } => ProxyError::BackendBusy { backend },
            Self::FirstByteTimeout { timeout } => ProxyError::BackendTimeout { backend, timeout },
            Self::BadRequest { message } => ProxyError::BadRequest(message),
            other => ProxyError::BackendProtocol {
                backend,
                reason: other.to_string(),
            },
        }
    }
}
