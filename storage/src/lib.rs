//! Inlay storage.
