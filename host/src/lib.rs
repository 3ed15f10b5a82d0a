//! Inlay host library.
