//! Inlay host library.

pub mod runtime;
