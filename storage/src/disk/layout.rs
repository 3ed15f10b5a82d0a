//! Key encodings of the sled trees (the table is in the crate docs).
//!
//! Variable-length parts are length-prefixed, so one key's entries never
//! share a prefix with another key's and a prefix scan finds exactly them.

pub(super) fn len_prefixed(a: &[u8], extra: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + a.len() + extra);
    v.extend_from_slice(&u32::try_from(a.len()).unwrap_or(u32::MAX).to_be_bytes());
    v.extend_from_slice(a);
    v
}

pub(super) fn chunk_prefix(key: &str) -> Vec<u8> {
    len_prefixed(key.as_bytes(), 12)
}

pub(super) fn chunk_set_prefix(key: &str, id: u64) -> Vec<u8> {
    let mut v = chunk_prefix(key);
    v.extend_from_slice(&id.to_be_bytes());
    v
}

pub(super) fn chunk_key(key: &str, id: u64, index: u32) -> Vec<u8> {
    let mut v = chunk_set_prefix(key, id);
    v.extend_from_slice(&index.to_be_bytes());
    v
}

/// The chunk set id in a chunk key of `key`.
pub(super) fn chunk_id_of(chunk_key: &[u8], key: &str) -> Option<u64> {
    let start = 4 + key.len();
    let bytes = chunk_key.get(start..start + 8)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(bytes);
    Some(u64::from_be_bytes(a))
}

pub(super) fn expiry_key(at: u64, key: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + key.len());
    v.extend_from_slice(&at.to_be_bytes());
    v.extend_from_slice(key.as_bytes());
    v
}

pub(super) fn surrogate_prefix(skey: &str) -> Vec<u8> {
    len_prefixed(skey.as_bytes(), 0)
}

pub(super) fn surrogate_key(skey: &str, key: &str) -> Vec<u8> {
    let mut v = len_prefixed(skey.as_bytes(), key.len());
    v.extend_from_slice(key.as_bytes());
    v
}

pub(super) fn kv_key(ns: &str, key: &str) -> Vec<u8> {
    let mut v = len_prefixed(ns.as_bytes(), key.len());
    v.extend_from_slice(key.as_bytes());
    v
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    let mut a = [0u8; 8];
    a.copy_from_slice(b.get(..8)?);
    Some(u64::from_be_bytes(a))
}

pub(super) fn utf8(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}
