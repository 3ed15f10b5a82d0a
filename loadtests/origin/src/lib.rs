//! `inlay-origin` as a library: the test origin behind Inlay's tests,
//! benchmarks and k6 scenarios, served on a listener of the caller's.
//! Endpoints and knobs are documented in `loadtests/README.md`.
//!
//! A test serves it in its own runtime, on a port of its own:
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let addr = listener.local_addr()?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let origin = tokio::spawn(inlay_origin::serve(listener, async {
//!     let _ = stopped.await;
//! }));
//! // ... requests to http://{addr} ...
//! # let _ = addr;
//! let _ = stop.send(());
//! let _ = origin.await;
//! # Ok(())
//! # }
//! ```

mod body;
mod counters;
mod esi;
mod knobs;
mod query;
mod routes;
mod server;
mod ws;

pub use server::{SHUTDOWN_GRACE, serve};
