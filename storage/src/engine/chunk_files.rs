//! Body chunks in files of their own, with only a small pointer in sled.
//!
//! sled 0.34 keeps roughly what it has read or written in memory, whatever
//! `cache_capacity` says (its own docs: the capacity counts on-disk bytes,
//! not the nodes it materialises), and replays its whole log at open. With
//! 32 KiB chunks inline, a 1 GiB disk tier meant well over 1 GiB of
//! resident memory and seconds of recovery after a crash. Here the `chunks`
//! tree maps each chunk key to a [`Pointer`] and the bytes go to
//! `<dir>/chunks/<xx>/<file id>`: sled stays small, the kernel's page cache
//! holds the bodies, and memory no longer grows with the disk tier.
//!
//! Order of a write: the file is written completely, then the pointer is
//! inserted; a replaced or removed pointer's file is unlinked after the
//! pointer is gone. A crash between the two leaves a file no pointer names;
//! [`ChunkFiles::open`] deletes those. A pointer whose file is missing or
//! has the wrong length reads as corruption (the layout above then drops
//! the object), never as data.
//!
//! Chunk files are not fsynced: after a kill -9 the kernel still has them;
//! after a power loss a record may name bytes that never reached the disk,
//! which fail the body's CRC and are dropped, never served.

use std::collections::HashSet;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::StoreError;
use crate::error::from_io;

const POINTER_MAGIC: u8 = 0xC5;
const POINTER_LEN: usize = 1 + 8 + 4;

/// What the `chunks` tree stores for a chunk: its file id and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Pointer {
    pub(crate) file: u64,
    pub(crate) len: u32,
}

impl Pointer {
    pub(crate) fn encode(self) -> [u8; POINTER_LEN] {
        let mut b = [0u8; POINTER_LEN];
        b[0] = POINTER_MAGIC;
        b[1..9].copy_from_slice(&self.file.to_be_bytes());
        b[9..].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Result<Pointer, StoreError> {
        if b.len() != POINTER_LEN || b[0] != POINTER_MAGIC {
            return Err(StoreError::Corrupt("bad chunk pointer".into()));
        }
        let mut file = [0u8; 8];
        file.copy_from_slice(&b[1..9]);
        let mut len = [0u8; 4];
        len.copy_from_slice(&b[9..]);
        Ok(Pointer {
            file: u64::from_be_bytes(file),
            len: u32::from_be_bytes(len),
        })
    }
}

/// The directory of chunk files.
pub(crate) struct ChunkFiles {
    dir: PathBuf,
    /// Bytes of chunk files (for `size_on_disk`).
    bytes: AtomicU64,
}

impl ChunkFiles {
    /// Opens (creating) `<db_dir>/chunks` and deletes every file whose id is
    /// not in `live` (left by a crash between a file and its pointer).
    pub(crate) fn open(db_dir: &Path, live: &HashSet<u64>) -> Result<ChunkFiles, StoreError> {
        let dir = db_dir.join("chunks");
        for fan in 0..=0xffu64 {
            fs::create_dir_all(dir.join(fan_out(fan))).map_err(from_io)?;
        }
        let mut bytes = 0;
        let mut orphans = 0u64;
        for sub in fs::read_dir(&dir).map_err(from_io)? {
            let sub = sub.map_err(from_io)?.path();
            if !sub.is_dir() {
                continue;
            }
            for f in fs::read_dir(&sub).map_err(from_io)? {
                let f = f.map_err(from_io)?;
                let id = f
                    .file_name()
                    .to_str()
                    .and_then(|n| u64::from_str_radix(n, 16).ok());
                if id.is_some_and(|id| live.contains(&id)) {
                    bytes += f.metadata().map(|m| m.len()).unwrap_or(0);
                } else {
                    orphans += 1;
                    if let Err(e) = fs::remove_file(f.path()) {
                        tracing::warn!(path = %f.path().display(), error = %e, "could not delete an orphaned chunk file");
                    }
                }
            }
        }
        if orphans > 0 {
            tracing::info!(
                files = orphans,
                "deleted chunk files no record points to (writes a crash interrupted)"
            );
        }
        Ok(ChunkFiles {
            dir,
            bytes: AtomicU64::new(bytes),
        })
    }

    fn path(&self, file: u64) -> PathBuf {
        self.dir.join(fan_out(file)).join(format!("{file:016x}"))
    }

    /// Writes a new file `file` holding `data`. A failed write leaves no file.
    pub(crate) fn write(&self, file: u64, data: &[u8]) -> Result<(), StoreError> {
        let path = self.path(file);
        let written = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .and_then(|mut f| f.write_all(data));
        match written {
            Ok(()) => {
                self.bytes.fetch_add(data.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                let _ = fs::remove_file(&path);
                Err(from_io(e))
            }
        }
    }

    /// The bytes `p` points to; a missing or short file is corruption.
    pub(crate) fn read(&self, p: Pointer) -> Result<Vec<u8>, StoreError> {
        let mut f = match fs::File::open(self.path(p.file)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(StoreError::Corrupt(format!(
                    "chunk file {:016x} is missing",
                    p.file
                )));
            }
            Err(e) => return Err(from_io(e)),
        };
        let mut buf = Vec::with_capacity(p.len as usize);
        // One byte more than expected tells a long file from a right one.
        Read::by_ref(&mut f)
            .take(u64::from(p.len) + 1)
            .read_to_end(&mut buf)
            .map_err(from_io)?;
        if buf.len() != p.len as usize {
            return Err(StoreError::Corrupt(format!(
                "chunk file {:016x} has {} bytes, its pointer says {}",
                p.file,
                buf.len(),
                p.len
            )));
        }
        Ok(buf)
    }

    /// Deletes the file `p` points to (already gone is fine).
    pub(crate) fn remove(&self, p: Pointer) {
        match fs::remove_file(self.path(p.file)) {
            Ok(()) => {
                let _ = self
                    .bytes
                    .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                        Some(b.saturating_sub(u64::from(p.len)))
                    });
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => {
                // Left for the next open's orphan sweep.
                tracing::warn!(file = p.file, error = %e, "could not delete a chunk file");
            }
        }
    }

    /// Bytes of chunk files.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// The subdirectory of a file: its id's low byte, so no directory holds
/// more than a 256th of the files.
fn fan_out(file: u64) -> String {
    format!("{:02x}", file & 0xff)
}
