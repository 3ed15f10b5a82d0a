//! Small bounds-checked binary reader and writer for the on-disk records.
//!
//! Every length read from disk is checked against the bytes that remain
//! before anything is allocated, so a corrupt record can neither panic nor
//! make us allocate gigabytes.

use crate::StoreError;

/// Appends big-endian integers and length-prefixed byte strings.
pub(crate) struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Writer {
            buf: Vec::with_capacity(n),
        }
    }

    pub(crate) fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }

    pub(crate) fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    /// A u32 length then the bytes. Callers bound lengths far below 4 GiB;
    /// the saturation only keeps a bug from writing a wrong prefix silently
    /// (the decoder would then reject the record).
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.u32(u32::try_from(v.len()).unwrap_or(u32::MAX));
        self.buf.extend_from_slice(v);
    }

    pub(crate) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }

    pub(crate) fn opt_str(&mut self, v: Option<&str>) {
        match v {
            None => self.u8(0),
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
        }
    }
}

/// Reads what [`Writer`] wrote; every method fails with
/// [`StoreError::Corrupt`] instead of reading past the end.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

fn short(what: &str) -> StoreError {
    StoreError::Corrupt(format!("record truncated while reading {what}"))
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], StoreError> {
        if n > self.remaining() {
            return Err(short(what));
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], StoreError> {
        let s = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, StoreError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, StoreError> {
        Ok(u16::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, StoreError> {
        Ok(u32::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, StoreError> {
        Ok(u64::from_be_bytes(self.array(what)?))
    }

    pub(crate) fn bytes(&mut self, what: &str) -> Result<&'a [u8], StoreError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    pub(crate) fn string(&mut self, what: &str) -> Result<String, StoreError> {
        let b = self.bytes(what)?;
        String::from_utf8(b.to_vec())
            .map_err(|_| StoreError::Corrupt(format!("{what} is not UTF-8")))
    }

    pub(crate) fn opt_string(&mut self, what: &str) -> Result<Option<String>, StoreError> {
        match self.u8(what)? {
            0 => Ok(None),
            1 => Ok(Some(self.string(what)?)),
            t => Err(StoreError::Corrupt(format!("bad option tag {t} in {what}"))),
        }
    }

    /// A count of items, each at least `min_item` bytes long, checked against
    /// the remaining input so the caller can pre-allocate safely.
    pub(crate) fn count(&mut self, min_item: usize, what: &str) -> Result<usize, StoreError> {
        let n = self.u32(what)? as usize;
        if n.saturating_mul(min_item.max(1)) > self.remaining() {
            return Err(short(what));
        }
        Ok(n)
    }

    pub(crate) fn finish(&self, what: &str) -> Result<(), StoreError> {
        if self.remaining() != 0 {
            return Err(StoreError::Corrupt(format!(
                "{} trailing bytes after {what}",
                self.remaining()
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_rejects_lengths_past_the_end() {
        let mut w = Writer::with_capacity(8);
        w.u32(1000);
        w.buf.extend_from_slice(b"abc");
        let mut r = Reader::new(&w.buf);
        assert!(matches!(r.bytes("x"), Err(StoreError::Corrupt(_))));
    }

    #[test]
    fn count_is_bounded_by_remaining_input() {
        let mut w = Writer::with_capacity(8);
        w.u32(u32::MAX);
        let mut r = Reader::new(&w.buf);
        assert!(r.count(4, "headers").is_err());
    }
}
