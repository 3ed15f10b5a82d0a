//! The metadata record of one object: its binary codec, with a magic, a
//! version and a CRC of its own, so a torn or foreign value is never taken
//! for an object.

use crate::codec::{Reader, Writer};
use crate::{ObjectMeta, StoreError};

const RECORD_MAGIC: [u8; 2] = *b"IR";
const RECORD_VERSION: u8 = 1;
/// Bytes before the metadata in a record: magic, version, crc, id, seq, chunk size.
const RECORD_HEADER: usize = 2 + 1 + 4 + 8 + 8 + 4;

/// The metadata record of one object on disk.
#[derive(Debug)]
pub(crate) struct Record {
    /// Chunk set id: a fresh engine id per put, so an overwrite never mixes
    /// old and new chunks.
    pub(crate) id: u64,
    /// Position in the FIFO eviction order.
    pub(crate) seq: u64,
    pub(crate) chunk_size: u32,
    pub(crate) meta: ObjectMeta,
}

impl Record {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let meta = self.meta.encode();
        let mut w = Writer::with_capacity(RECORD_HEADER + meta.len());
        w.buf.extend_from_slice(&RECORD_MAGIC);
        w.u8(RECORD_VERSION);
        w.u32(0); // crc placeholder
        w.u64(self.id);
        w.u64(self.seq);
        w.u32(self.chunk_size);
        w.buf.extend_from_slice(&meta);
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
        if version != RECORD_VERSION {
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
        let chunk_size = r.u32("chunk size")?;
        if chunk_size == 0 {
            return Err(StoreError::Corrupt("zero chunk size".into()));
        }
        let meta = ObjectMeta::decode(r.take(r.remaining(), "metadata")?)?;
        Ok(Record {
            id,
            seq,
            chunk_size,
            meta,
        })
    }

    pub(super) fn chunk_count(&self) -> u64 {
        self.meta.body_len.div_ceil(u64::from(self.chunk_size))
    }
}
