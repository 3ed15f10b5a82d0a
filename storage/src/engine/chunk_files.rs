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
//! [`ChunkFiles::sweep_orphans`] deletes those, in the background after
//! the open. A pointer whose file is missing or
//! has the wrong length reads as corruption (the layout above then drops
//! the object), never as data.
//!
//! Chunk files are not fsynced: after a kill -9 the kernel still has them;
//! after a power loss a record may name bytes that never reached the disk,
//! which fail the body's CRC and are dropped, never served.

use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::{Value, Wait};
use crate::StoreError;
use crate::error::from_io;

const POINTER_MAGIC: u8 = 0xC5;
const POINTER_LEN: usize = 1 + 8 + 4;

/// What the `chunks` tree stores for a chunk: its file id and length.
#[derive(Debug, Clone, Copy)]
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
    /// Bytes of chunk files (for `size_on_disk`); until the orphan sweep
    /// has counted the files of earlier sessions, only this session's.
    bytes: AtomicU64,
    /// Every file id below this was handed out by an earlier session (sled
    /// ids grow across restarts, crashes included): no write of this
    /// session can be in flight on such a file, so the sweep may judge it
    /// by the pointers alone.
    first_id: u64,
    /// Whether the orphan sweep has finished.
    swept: AtomicBool,
}

impl ChunkFiles {
    /// Opens (creating) `<db_dir>/chunks`. Files of ids below `first_id`
    /// that no pointer names (a crash between a file and its pointer) are
    /// left to [`ChunkFiles::sweep_orphans`], which runs after the open:
    /// with a million objects, listing them took most of a minute.
    pub(crate) fn open(db_dir: &Path, first_id: u64) -> Result<ChunkFiles, StoreError> {
        let dir = db_dir.join("chunks");
        for fan in 0..=0xffu64 {
            fs::create_dir_all(dir.join(fan_out(fan))).map_err(from_io)?;
        }
        Ok(ChunkFiles {
            dir,
            bytes: AtomicU64::new(0),
            first_id,
            swept: AtomicBool::new(false),
        })
    }

    /// Deletes every file of an earlier session whose id is not in `live`
    /// (sorted: the ids the `chunks` tree named when the sweep began) and
    /// counts the bytes of the others. Files of this session (ids from
    /// `first_id` on) are never touched: a write in flight has its file
    /// before its pointer. A pointer removed while the sweep runs only
    /// makes its file deleted twice (the second finds it gone). Returns
    /// how many files were deleted; stops early, without marking the
    /// sweep done, when `stop` is set.
    pub(crate) fn sweep_orphans(&self, live: &[u64], stop: &AtomicBool) -> Result<u64, StoreError> {
        let mut orphans = 0u64;
        let mut seen = 0u64;
        for fan in 0..=0xffu64 {
            let sub = self.dir.join(fan_out(fan));
            let listing = match fs::read_dir(&sub) {
                Ok(l) => l,
                Err(e) if e.kind() == ErrorKind::NotFound => continue,
                Err(e) => return Err(from_io(e)),
            };
            for f in listing {
                let f = f.map_err(from_io)?;
                seen += 1;
                if seen.is_multiple_of(1024) && stop.load(Ordering::Relaxed) {
                    return Ok(orphans);
                }
                let id = f
                    .file_name()
                    .to_str()
                    .and_then(|n| u64::from_str_radix(n, 16).ok());
                match id {
                    Some(id) if id >= self.first_id => continue,
                    Some(id) if live.binary_search(&id).is_ok() => {
                        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
                        self.bytes.fetch_add(len, Ordering::Relaxed);
                    }
                    _ => {
                        orphans += 1;
                        match fs::remove_file(f.path()) {
                            Ok(()) => {}
                            Err(e) if e.kind() == ErrorKind::NotFound => {}
                            Err(e) => {
                                tracing::warn!(path = %f.path().display(), error = %e, "could not delete an orphaned chunk file")
                            }
                        }
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
        self.swept.store(true, Ordering::Relaxed);
        Ok(orphans)
    }

    /// Whether [`ChunkFiles::sweep_orphans`] has finished.
    pub(crate) fn swept(&self) -> bool {
        self.swept.load(Ordering::Relaxed)
    }

    /// The first file id of this session (see the field).
    pub(crate) fn first_id(&self) -> u64 {
        self.first_id
    }

    pub(crate) fn path(&self, file: u64) -> PathBuf {
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

    /// The bytes `p` points to; a missing file, or one whose length is not
    /// the pointer's, is corruption. Files of [`MAP_AT_LEAST`] bytes or more
    /// are mapped rather than read (see [`map`]). With [`Wait::NoWait`], the
    /// bytes come only from the page cache ([`read_nowait`]); a file that
    /// would be mapped, or bytes the cache lacks, are
    /// [`StoreError::WouldBlock`].
    pub(crate) fn read(&self, p: Pointer, wait: Wait) -> Result<Value, StoreError> {
        let f = match fs::File::open(self.path(p.file)) {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(StoreError::Corrupt(format!(
                    "chunk file {:016x} is missing",
                    p.file
                )));
            }
            Err(e) => return Err(from_io(e)),
        };
        let len = f.metadata().map_err(from_io)?.len();
        if len != u64::from(p.len) {
            return Err(StoreError::Corrupt(format!(
                "chunk file {:016x} has {len} bytes, its pointer says {}",
                p.file, p.len
            )));
        }
        if wait == Wait::NoWait {
            // Mapping populates every page: it may wait for the disk.
            if len >= MAP_AT_LEAST {
                return Err(StoreError::WouldBlock);
            }
            return read_nowait(&f, p);
        }
        if len >= MAP_AT_LEAST {
            // Mapping fails when the process is at its map count limit
            // (`vm.max_map_count`, 65530 by default): reading still works.
            if let Ok(m) = map(&f) {
                return Ok(Value::Mapped(m));
            }
        }
        let mut buf = Vec::with_capacity(p.len as usize);
        // One byte more than expected tells a file that grew since the
        // length check from a right one.
        Read::by_ref(&mut &f)
            .take(len + 1)
            .read_to_end(&mut buf)
            .map_err(from_io)?;
        if buf.len() != p.len as usize {
            return Err(StoreError::Corrupt(format!(
                "chunk file {:016x} changed while read",
                p.file
            )));
        }
        Ok(Value::Owned(buf))
    }

    /// Deletes the file `p` points to (already gone is fine).
    pub(crate) fn remove(&self, p: Pointer) {
        match fs::remove_file(self.path(p.file)) {
            // A file of an earlier session is counted by the sweep, if
            // still there when it looks; until the sweep is done, `bytes`
            // may count one it saw and then lost (approximate meanwhile).
            Ok(()) if p.file < self.first_id && !self.swept() => {}
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

/// Chunk files this long or longer are mapped instead of read. Reading
/// copies the page cache into a fresh buffer, then the socket write copies
/// it again; a profile of 1 MiB disk-tier hits had that first copy at 22%
/// of the CPU. For small files a mapping's set-up and teardown (a TLB
/// flush on every core the process runs on) cost more than the copy; and
/// objects promoted to the memory tier keep their mapping, so the
/// threshold also bounds the number of mappings (a 4 GiB memory tier of
/// 256 KiB objects holds 16384, under Linux's default limit of 65530).
const MAP_AT_LEAST: u64 = 256 * 1024;

/// Maps a whole chunk file read-only, its pages faulted in at once (the
/// CRC check reads them all next).
///
/// A mapping stays valid when the file is unlinked (eviction, purge), and
/// this store never writes a chunk file again after creating it. What the
/// mapping cannot survive is another process truncating the file while
/// it is mapped (the read then faults with SIGBUS): the cache directory
/// belongs to Inlay while it runs, as Varnish's `file` storage does.
#[allow(unsafe_code)]
fn map(f: &fs::File) -> std::io::Result<memmap2::Mmap> {
    // SAFETY: see above; the file is never modified after it is written,
    // and its length was checked against the pointer before mapping.
    unsafe { memmap2::MmapOptions::new().populate().map(f) }
}

/// Reads a whole chunk file from the page cache only (`preadv2` with
/// `RWF_NOWAIT`): if any of its bytes would have to come from the device,
/// or the kernel or file system cannot say, the read is
/// [`StoreError::WouldBlock`] and the caller reads it where waiting is
/// fine. One byte more than the pointer's length is asked for, to tell a
/// file that grew from a right one.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn read_nowait(f: &fs::File, p: Pointer) -> Result<Value, StoreError> {
    use std::os::fd::AsRawFd;
    let want = p.len as usize + 1;
    let mut buf: Vec<u8> = Vec::with_capacity(want);
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: want,
    };
    // SAFETY: `iov` describes `buf`'s allocation of `want` bytes, which
    // stays alive and is not otherwise touched during the call; the kernel
    // writes at most `want` bytes into it.
    let n = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    let Ok(n) = usize::try_from(n) else {
        // EAGAIN (not cached), EOPNOTSUPP or EINVAL (an old kernel or a
        // file system without it): the blocking read will tell.
        return Err(StoreError::WouldBlock);
    };
    // SAFETY: the kernel initialised the first `n <= want` bytes.
    unsafe { buf.set_len(n) };
    match n.cmp(&(p.len as usize)) {
        std::cmp::Ordering::Equal => Ok(Value::Owned(buf)),
        // Part of the file is not in the page cache.
        std::cmp::Ordering::Less => Err(StoreError::WouldBlock),
        std::cmp::Ordering::Greater => Err(StoreError::Corrupt(format!(
            "chunk file {:016x} changed while read",
            p.file
        ))),
    }
}

/// Without `RWF_NOWAIT`, nothing can be read without possibly waiting.
#[cfg(not(target_os = "linux"))]
fn read_nowait(_f: &fs::File, _p: Pointer) -> Result<Value, StoreError> {
    Err(StoreError::WouldBlock)
}

/// The subdirectory of a file: its id's low byte, so no directory holds
/// more than a 256th of the files.
fn fan_out(file: u64) -> String {
    format!("{:02x}", file & 0xff)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files() -> (tempfile::TempDir, ChunkFiles) {
        let dir = tempfile::tempdir().unwrap();
        let files = ChunkFiles::open(dir.path(), 0).unwrap();
        (dir, files)
    }

    fn data(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 31 % 251) as u8).collect()
    }

    #[test]
    fn small_files_are_read_and_large_ones_mapped_with_the_same_bytes() {
        let (_dir, files) = files();
        for (file, len) in [
            (1u64, 100usize),
            (2, 256 * 1024 - 1),
            (3, 256 * 1024),
            (4, 1 << 20),
        ] {
            let want = data(len);
            files.write(file, &want).unwrap();
            let p = Pointer {
                file,
                len: len as u32,
            };
            let got = files.read(p, Wait::Block).unwrap();
            assert_eq!(
                matches!(got, Value::Mapped(_)),
                len as u64 >= MAP_AT_LEAST,
                "{len} bytes"
            );
            assert_eq!(&*got, &want[..]);
            assert_eq!(got.into_bytes(), want);
        }
    }

    #[test]
    fn a_mapped_chunk_outlives_its_file() {
        // Eviction or a purge unlinks the file while a response still
        // sends the mapped bytes.
        let (_dir, files) = files();
        let want = data(400_000);
        files.write(7, &want).unwrap();
        let p = Pointer {
            file: 7,
            len: 400_000,
        };
        let body = files.read(p, Wait::Block).unwrap().into_bytes();
        files.remove(p);
        assert!(matches!(
            files.read(p, Wait::Block),
            Err(StoreError::Corrupt(_))
        ));
        assert_eq!(body, want);
    }

    #[test]
    fn a_file_of_the_wrong_length_is_corruption_not_data() {
        let (_dir, files) = files();
        for (file, len) in [(1u64, 1000usize), (2, 400_000)] {
            files.write(file, &data(len)).unwrap();
            let path = files.path(file);
            // Cut short on disk (a crash, a full disk, a hand).
            fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(len as u64 - 1)
                .unwrap();
            let p = Pointer {
                file,
                len: len as u32,
            };
            assert!(
                matches!(files.read(p, Wait::Block), Err(StoreError::Corrupt(why)) if why.contains("pointer says")),
                "{len} bytes"
            );
            // Grown on disk.
            fs::write(&path, data(len + 1)).unwrap();
            assert!(matches!(
                files.read(p, Wait::Block),
                Err(StoreError::Corrupt(_))
            ));
        }
    }
}
