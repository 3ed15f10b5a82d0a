//! SDK
