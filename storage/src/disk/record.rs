//! The metadata record of one object: its binary codec, with a magic, a
//! version and a CRC of its own, so a torn or foreign value is never taken
//! for an object.
//!
//! Two versions, both read:
//! * 1: the body is in chunks (`magic, 1, crc, id, seq, chunk size,
//!   metadata`); written for bodies over the inline limit, as before
//!   version 2 existed, so stores written by earlier code read as they are;
//! * 2: the body is inline, after the metadata (`magic, 2, crc, id, seq,
//!   metadata length, metadata, body`): one engine read per hit, and a small
//!   body no longer costs a file and a file-system block. The record's CRC
//!   covers the body, and the body's own CRC (in the metadata) is checked
//!   too, as for chunks.

use crate::codec::{Reader, Writer};
use crate::{ObjectMeta, StoreError};

const RECORD_MAGIC: [u8; 2] = *b"IR";
/// Version of a record whose body is in chunks.
const CHUNKED_VERSION: u8 = 1;
/// Version of a record whose body follows its metadata.
const INLINE_VERSION: u8 = 2;
/// Bytes before the metadata in a record: magic, version, crc, id, seq, and
/// the chunk size (version 1) or the metadata length (version 2).
const RECORD_HEADER: usize = 2 + 1 + 4 + 8 + 8 + 4;

/// Where the body of an object is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyAt {
    /// In the `chunks` tree under the record's id, in chunks of this size.
    Chunks { chunk_size: u32 },
    /// In the record, from this offset of its encoded bytes to their end
    /// (0 in a record not yet encoded).
    Inline { at: usize },
}

/// The metadata record of one object on disk.
#[derive(Debug)]
pub(crate) struct Record {
    /// Chunk set id: a fresh engine id per put, so an overwrite never mixes
    /// old and new chunks.
    pub(crate) id: u64,
    /// Position in the FIFO eviction order.
    pub(crate) seq: u64,
    pub(crate) body: BodyAt,
    pub(crate) meta: ObjectMeta,
}

impl Record {
    /// The record's bytes; `inline` is the body of an inline record (and
    /// must be `None` for a chunked one).
    pub(crate) fn encode(&self, inline: Option<&[u8]>) -> Vec<u8> {
        let meta = self.meta.encode();
        let body = inline.unwrap_or_default();
        let mut w = Writer::with_capacity(RECORD_HEADER + meta.len() + body.len());
        w.buf.extend_from_slice(&RECORD_MAGIC);
        match self.body {
            BodyAt::Chunks { .. } => w.u8(CHUNKED_VERSION),
            BodyAt::Inline { .. } => w.u8(INLINE_VERSION),
        }
        w.u32(0); // crc placeholder
        w.u64(self.id);
        w.u64(self.seq);
        match self.body {
            BodyAt::Chunks { chunk_size } => w.u32(chunk_size),
            // Metadata is bounded by MAX_META_LEN, far below u32::MAX.
            BodyAt::Inline { .. } => w.u32(u32::try_from(meta.len()).unwrap_or(u32::MAX)),
        }
        w.buf.extend_from_slice(&meta);
        w.buf.extend_from_slice(body);
        let crc = crc32fast::hash(&w.buf[7..]);
        w.buf[3..7].copy_from_slice(&crc.to_be_bytes());
        w.buf
    }

    pub(crate) fn decode(buf: &[u8]) -> Result<Record, StoreError> {
        let mut r = Reader::new(buf);
        if r.take(2, "magic")? != RECORD_MAGIC {
            return Err(StoreError::Corrupt("bad record magic".into()));
        }
        let version = r.u8("record version")?;
        if version != CHUNKED_VERSION && version != INLINE_VERSION {
            return Err(StoreError::Corrupt(format!(
                "unknown record version {version}"
            )));
        }
        let crc = r.u32("record crc")?;
        if crc32fast::hash(&buf[7..]) != crc {
            return Err(StoreError::Corrupt("record checksum mismatch".into()));
        }
        let id = r.u64("chunk id")?;
        let seq = r.u64("seq")?;
        let (body, meta) = if version == CHUNKED_VERSION {
            let chunk_size = r.u32("chunk size")?;
            if chunk_size == 0 {
                return Err(StoreError::Corrupt("zero chunk size".into()));
            }
            let meta = ObjectMeta::decode(r.take(r.remaining(), "metadata")?)?;
            (BodyAt::Chunks { chunk_size }, meta)
        } else {
            let meta_len = r.u32("metadata length")?;
            let meta_len = usize::try_from(meta_len).unwrap_or(usize::MAX);
            let meta = ObjectMeta::decode(r.take(meta_len, "metadata")?)?;
            let at = buf.len() - r.remaining();
            if meta.body_len != r.remaining() as u64 {
                return Err(StoreError::Corrupt(format!(
                    "inline body has {} bytes, the metadata says {}",
                    r.remaining(),
                    meta.body_len
                )));
            }
            (BodyAt::Inline { at }, meta)
        };
        Ok(Record {
            id,
            seq,
            body,
            meta,
        })
    }

    /// How many chunks hold the body (none for an inline body).
    pub(super) fn chunk_count(&self) -> u64 {
        match self.body {
            BodyAt::Chunks { chunk_size } => self.meta.body_len.div_ceil(u64::from(chunk_size)),
            BodyAt::Inline { .. } => 0,
        }
    }

    /// The inline body in `raw`, this record's encoded bytes (`None` for a
    /// chunked body).
    pub(super) fn inline_body<'a>(&self, raw: &'a [u8]) -> Option<&'a [u8]> {
        match self.body {
            BodyAt::Inline { at } => raw.get(at..),
            BodyAt::Chunks { .. } => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(body: &[u8]) -> ObjectMeta {
        ObjectMeta {
            status: 200,
            headers: vec![("content-type".into(), b"text/plain".to_vec())],
            body_len: body.len() as u64,
            checksum: crc32fast::hash(body),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn inline_record_round_trips_and_keeps_its_body() {
        let body = b"hello inline body";
        let rec = Record {
            id: 7,
            seq: 9,
            body: BodyAt::Inline { at: 0 },
            meta: meta(body),
        };
        let raw = rec.encode(Some(body));
        assert_eq!(raw[2], INLINE_VERSION);
        let back = Record::decode(&raw).unwrap();
        assert_eq!((back.id, back.seq, back.chunk_count()), (7, 9, 0));
        assert_eq!(back.inline_body(&raw), Some(&body[..]));
        assert_eq!(back.meta.headers, rec.meta.headers);
    }

    #[test]
    fn chunked_record_keeps_the_version_1_bytes() {
        let rec = Record {
            id: 1,
            seq: 2,
            body: BodyAt::Chunks { chunk_size: 4096 },
            meta: meta(&[0; 10_000]),
        };
        let raw = rec.encode(None);
        assert_eq!(raw[2], CHUNKED_VERSION);
        // Version 1 as earlier code wrote it: chunk size right after seq.
        assert_eq!(raw[23..27], 4096u32.to_be_bytes());
        let back = Record::decode(&raw).unwrap();
        assert_eq!(back.body, BodyAt::Chunks { chunk_size: 4096 });
        assert_eq!(back.chunk_count(), 3);
        assert_eq!(back.inline_body(&raw), None);
    }

    #[test]
    fn damaged_inline_records_are_rejected() {
        let body = b"0123456789";
        let rec = Record {
            id: 1,
            seq: 1,
            body: BodyAt::Inline { at: 0 },
            meta: meta(body),
        };
        let raw = rec.encode(Some(body));
        // Every single flipped byte, every truncation: an error, no panic.
        for i in 0..raw.len() {
            let mut bad = raw.clone();
            bad[i] ^= 0x40;
            assert!(Record::decode(&bad).is_err(), "flip at {i} accepted");
            assert!(Record::decode(&raw[..i]).is_err(), "cut at {i} accepted");
        }
        // A well-formed record (CRC recomputed) whose metadata length runs
        // past the end, or whose body is shorter than the metadata says.
        for (meta_len, cut) in [(u32::MAX, 0), (0, 0), (10_000, 0), (0, 3)] {
            let mut bad = raw[..raw.len() - cut].to_vec();
            if meta_len != 0 {
                bad[23..27].copy_from_slice(&meta_len.to_be_bytes());
            }
            let crc = crc32fast::hash(&bad[7..]);
            bad[3..7].copy_from_slice(&crc.to_be_bytes());
            if (meta_len, cut) == (0, 0) {
                assert!(Record::decode(&bad).is_ok());
            } else {
                assert!(Record::decode(&bad).is_err(), "{meta_len} {cut} accepted");
            }
        }
    }
}
