//! The host side of the WIT interfaces a policy imports, one file per
//! interface; each implements that interface's `Host` trait on the
//! request's [`StoreState`](crate::state::StoreState).

mod cache;
mod clock;
mod config;
mod esi;
mod fetch;
mod kv;
mod log;
pub(crate) mod types;
