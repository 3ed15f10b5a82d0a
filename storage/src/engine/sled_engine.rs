//! The sled 0.34 engine, and opening it without ever failing on a corrupt
//! database: one that will not open is moved aside and replaced.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::chunk_files::{ChunkFiles, Pointer};
use super::{DiskEngine, Entries, TreeId, Value, Wait};
use crate::error::from_io;
use crate::{StoreConfig, StoreError};

/// How many moved-aside databases are kept next to the live one; older ones
/// are deleted so repeated corruption cannot fill the disk.
const KEEP_CORRUPT_COPIES: usize = 2;

/// sled's log segment size. Items over a quarter of it become blob files;
/// 4 MiB keeps every node of 32 KiB chunks inline (see [`crate::MAX_CHUNK_SIZE`]).
/// sled stores it in the database: changing it makes old databases fail to
/// open (they are then moved aside).
const SEGMENT_SIZE: usize = 4 * 1024 * 1024;

pub(crate) struct SledEngine {
    db: sled::Db,
    trees: Vec<sled::Tree>,
    /// The bytes of the `chunks` tree (which holds [`Pointer`]s).
    chunks: ChunkFiles,
    /// Tests hold the orphan sweep here until they release it.
    #[cfg(test)]
    sweep_gate: parking_lot::Mutex<Option<std::sync::mpsc::Receiver<()>>>,
}

/// An opened engine and, if the old database was unusable, where it went.
pub(crate) struct OpenedSled {
    pub(crate) engine: SledEngine,
    pub(crate) moved_aside: Option<PathBuf>,
}

fn map_sled(e: sled::Error) -> StoreError {
    match e {
        sled::Error::Io(io) => from_io(io),
        sled::Error::Corruption { at, .. } => {
            StoreError::Corrupt(format!("sled reported corruption at {at:?}"))
        }
        other => StoreError::Engine(other.to_string()),
    }
}

enum OpenFailure {
    /// Another process (or store) holds the directory: never move it aside.
    Locked,
    /// No space to open it: the database is fine, moving it would not help.
    NoSpace,
    /// The system refused (permissions, file descriptors, memory, a file
    /// in the way...): the database may be fine, so it is left untouched.
    System(std::io::Error),
    /// The database is unusable.
    Broken(String),
}

/// Whether an I/O error while opening says something about the system
/// (permissions, limits, the path) rather than about the database's bytes.
/// Only the latter may move a database aside: a cache directory that is
/// merely unreadable, or a path that names some other file, must be left
/// as it is and the start must fail.
fn is_system_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    if matches!(
        e.kind(),
        K::PermissionDenied
            | K::ReadOnlyFilesystem
            | K::NotADirectory
            | K::IsADirectory
            | K::AlreadyExists
            | K::OutOfMemory
            | K::ResourceBusy
            | K::StorageFull
            | K::QuotaExceeded
            | K::InvalidFilename
            | K::Interrupted
            | K::WouldBlock
    ) {
        return true;
    }
    matches!(
        e.raw_os_error(),
        Some(
            libc::EACCES
                | libc::EPERM
                | libc::EMFILE
                | libc::ENFILE
                | libc::ENOMEM
                | libc::EIO
                | libc::ENOSPC
                | libc::EDQUOT
                | libc::EROFS
                | libc::ENOTDIR
                | libc::EEXIST
                | libc::ELOOP
        )
    )
}

fn try_open(dir: &Path, config: &StoreConfig) -> Result<SledEngine, OpenFailure> {
    let sled_config = sled::Config::new()
        .path(dir)
        .cache_capacity(config.sled_cache_bytes())
        .flush_every_ms(Some(config.flush_every_ms))
        .segment_size(SEGMENT_SIZE)
        .mode(sled::Mode::LowSpace);
    // sled 0.34 has been seen to panic, not only fail, on some damaged files.
    let opened = catch_unwind(AssertUnwindSafe(|| {
        let db = sled_config.open()?;
        let trees = TreeId::ALL
            .iter()
            .map(|t| db.open_tree(t.name()))
            .collect::<Result<Vec<_>, _>>()?;
        // Every chunk file so far has a smaller id: the orphan sweep after
        // the open judges only those (see `ChunkFiles`).
        let first_id = db.generate_id()?;
        Ok::<_, sled::Error>((db, trees, first_id))
    }));
    match opened {
        Ok(Ok((db, trees, first_id))) => match ChunkFiles::open(dir, first_id) {
            Ok(chunks) => Ok(SledEngine {
                db,
                trees,
                chunks,
                #[cfg(test)]
                sweep_gate: parking_lot::Mutex::new(None),
            }),
            Err(StoreError::Full) => Err(OpenFailure::NoSpace),
            Err(StoreError::Io(e)) if is_system_error(&e) => Err(OpenFailure::System(e)),
            Err(e) => Err(OpenFailure::Broken(format!("chunk files: {e}"))),
        },
        Ok(Err(sled::Error::Io(e))) if e.to_string().contains("could not acquire lock") => {
            Err(OpenFailure::Locked)
        }
        Ok(Err(sled::Error::Io(e)))
            if matches!(
                e.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ) =>
        {
            Err(OpenFailure::NoSpace)
        }
        Ok(Err(sled::Error::Io(e))) if is_system_error(&e) => Err(OpenFailure::System(e)),
        Ok(Err(e)) => Err(OpenFailure::Broken(e.to_string())),
        Err(panic) => {
            let what = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".to_string());
            Err(OpenFailure::Broken(format!(
                "sled panicked while opening: {what}"
            )))
        }
    }
}

/// How long an open waits for a lock that is being released.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// [`try_open`], waiting up to [`LOCK_WAIT`] while the database is locked.
/// sled releases its file lock only when its background flusher exits,
/// a moment after the last handle is dropped: a store closed and opened
/// again in one process (tests did, one run in forty under load) or a
/// restart overlapping the old process's exit would otherwise be refused.
fn try_open_waiting(dir: &Path, config: &StoreConfig) -> Result<SledEngine, OpenFailure> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match try_open(dir, config) {
            Err(OpenFailure::Locked) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            other => return other,
        }
    }
}

/// Opens sled in `dir`; a corrupt database is renamed to
/// `<dir>.corrupt-<unix_ts>` and a fresh one is created in its place. A
/// lock, a full disk or an error of the system (permissions, file
/// descriptors, a file in the way) fails the open and touches nothing.
pub(crate) fn open_sled(dir: &Path, config: &StoreConfig) -> Result<OpenedSled, StoreError> {
    match try_open_waiting(dir, config) {
        Ok(engine) => Ok(OpenedSled {
            engine,
            moved_aside: None,
        }),
        Err(OpenFailure::Locked) => Err(StoreError::Locked(dir.to_path_buf())),
        Err(OpenFailure::System(e)) => Err(StoreError::Open {
            dir: dir.to_path_buf(),
            error: e,
        }),
        Err(OpenFailure::NoSpace) => {
            tracing::error!(dir = %dir.display(), "no space left to open the cache database");
            Err(StoreError::Full)
        }
        Err(OpenFailure::Broken(why)) => {
            let aside = move_aside(dir)?;
            tracing::error!(
                dir = %dir.display(),
                moved_to = %aside.display(),
                error = %why,
                "cache database could not be opened; moved it aside and starting empty"
            );
            prune_corrupt_copies(dir);
            match try_open(dir, config) {
                Ok(engine) => Ok(OpenedSled {
                    engine,
                    moved_aside: Some(aside),
                }),
                Err(OpenFailure::Locked) => Err(StoreError::Locked(dir.to_path_buf())),
                Err(OpenFailure::NoSpace) => Err(StoreError::Full),
                Err(OpenFailure::System(e)) => Err(StoreError::Open {
                    dir: dir.to_path_buf(),
                    error: e,
                }),
                Err(OpenFailure::Broken(why)) => Err(StoreError::Engine(format!(
                    "a fresh database could not be created in {}: {why}",
                    dir.display()
                ))),
            }
        }
    }
}

fn move_aside(dir: &Path) -> Result<PathBuf, StoreError> {
    let ts = crate::now_ms() / 1000;
    let base = format!("{}.corrupt-{ts}", dir.display());
    let mut target = PathBuf::from(&base);
    let mut n = 1;
    while target.exists() {
        target = PathBuf::from(format!("{base}-{n}"));
        n += 1;
    }
    std::fs::rename(dir, &target).map_err(from_io)?;
    // Pruning keeps the newest copies by modification time; a rename does
    // not change it, so mark the move.
    let touched =
        std::fs::File::open(&target).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    if let Err(e) = touched {
        tracing::debug!(error = %e, "could not update the mtime of a moved-aside database");
    }
    Ok(target)
}

/// Deletes all but the newest [`KEEP_CORRUPT_COPIES`] moved-aside copies.
fn prune_corrupt_copies(dir: &Path) {
    let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
        return;
    };
    let prefix = format!("{}.corrupt-", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    }) else {
        return;
    };
    let mut copies: Vec<(std::time::SystemTime, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    copies.sort();
    let excess = copies.len().saturating_sub(KEEP_CORRUPT_COPIES);
    for (_, path) in copies.into_iter().take(excess) {
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        match removed {
            Ok(()) => {
                tracing::info!(path = %path.display(), "deleted an old moved-aside cache database")
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "could not delete an old moved-aside cache database")
            }
        }
    }
}

/// Adapts a sled iterator. It ends after the first error: a failing sled
/// iterator can return the same error forever.
fn entries(iter: sled::Iter) -> Entries<'static> {
    let mut failed = false;
    Box::new(iter.map_while(move |r| {
        if failed {
            return None;
        }
        failed = r.is_err();
        Some(
            r.map(|(k, v)| (Value::Sled(k), Value::Sled(v)))
                .map_err(map_sled),
        )
    }))
}

impl SledEngine {
    fn tree(&self, t: TreeId) -> &sled::Tree {
        &self.trees[t.index()]
    }

    /// Makes the next orphan sweep wait, once it has begun, until the
    /// returned sender sends or is dropped.
    #[cfg(test)]
    pub(crate) fn hold_orphan_sweep(&self) -> std::sync::mpsc::Sender<()> {
        let (tx, rx) = std::sync::mpsc::channel();
        *self.sweep_gate.lock() = Some(rx);
        tx
    }

    /// Whether the orphan sweep after open has finished.
    #[cfg(test)]
    pub(crate) fn orphans_swept(&self) -> bool {
        self.chunks.swept()
    }

    /// The bytes behind a chunk pointer. In a scan, a pointer that does not
    /// decode or names a missing or short file yields an empty value: the
    /// layout's length check then calls the body corrupt, and cleanups that
    /// only want the keys still see them.
    fn chunk_value(&self, ptr: &[u8], wait: Wait) -> Result<Value, StoreError> {
        let Ok(p) = Pointer::decode(ptr) else {
            return Ok(Value::Owned(Vec::new()));
        };
        match self.chunks.read(p, wait) {
            Ok(v) => Ok(v),
            Err(StoreError::Corrupt(_)) => Ok(Value::Owned(Vec::new())),
            Err(e) => Err(e),
        }
    }

    fn chunk_entries<'a>(&'a self, inner: Entries<'a>, wait: Wait) -> Entries<'a> {
        Box::new(inner.map(move |r| {
            let (k, ptr) = r?;
            Ok((k, self.chunk_value(&ptr, wait)?))
        }))
    }

    /// Deletes the file of a pointer taken out of the `chunks` tree.
    fn drop_chunk(&self, old: Option<sled::IVec>) {
        if let Some(p) = old.and_then(|v| Pointer::decode(&v).ok()) {
            self.chunks.remove(p);
        }
    }
}

impl DiskEngine for SledEngine {
    fn get(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        let v = self.tree(tree).get(key).map_err(map_sled)?;
        match (tree, v) {
            (TreeId::Chunks, Some(ptr)) => {
                let p = Pointer::decode(&ptr)?;
                Ok(Some(self.chunks.read(p, Wait::Block)?))
            }
            (_, v) => Ok(v.map(Value::Sled)),
        }
    }

    fn insert(&self, tree: TreeId, key: &[u8], value: &[u8]) -> Result<Option<Value>, StoreError> {
        if tree == TreeId::Chunks {
            let len = u32::try_from(value.len())
                .map_err(|_| StoreError::Engine("chunk over 4 GiB".into()))?;
            let p = Pointer {
                file: self.db.generate_id().map_err(map_sled)?,
                len,
            };
            self.chunks.write(p.file, value)?;
            match self.tree(tree).insert(key, &p.encode()[..]) {
                Ok(old) => self.drop_chunk(old),
                Err(e) => {
                    self.chunks.remove(p);
                    return Err(map_sled(e));
                }
            }
            return Ok(None);
        }
        Ok(self
            .tree(tree)
            .insert(key, value)
            .map_err(map_sled)?
            .map(Value::Sled))
    }

    fn remove(&self, tree: TreeId, key: &[u8]) -> Result<Option<Value>, StoreError> {
        if tree == TreeId::Chunks {
            let old = self.tree(tree).remove(key).map_err(map_sled)?;
            self.drop_chunk(old);
            return Ok(None);
        }
        Ok(self
            .tree(tree)
            .remove(key)
            .map_err(map_sled)?
            .map(Value::Sled))
    }

    fn compare_and_swap(
        &self,
        tree: TreeId,
        key: &[u8],
        old: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, StoreError> {
        if tree == TreeId::Chunks {
            return Err(StoreError::Engine(
                "compare-and-swap is not supported on chunks".into(),
            ));
        }
        let r = self
            .tree(tree)
            .compare_and_swap(key, old, new.map(sled::IVec::from))
            .map_err(map_sled)?;
        Ok(r.is_ok())
    }

    fn scan_prefix(&self, tree: TreeId, prefix: &[u8]) -> Entries<'_> {
        let e = entries(self.tree(tree).scan_prefix(prefix));
        match tree {
            TreeId::Chunks => self.chunk_entries(e, Wait::Block),
            _ => e,
        }
    }

    fn scan_chunks(&self, prefix: &[u8], wait: Wait) -> Entries<'_> {
        let e = entries(self.tree(TreeId::Chunks).scan_prefix(prefix));
        self.chunk_entries(e, wait)
    }

    fn range_from(&self, tree: TreeId, start: &[u8]) -> Entries<'_> {
        let e = entries(self.tree(tree).range(start.to_vec()..));
        match tree {
            TreeId::Chunks => self.chunk_entries(e, Wait::Block),
            _ => e,
        }
    }

    fn generate_id(&self) -> Result<u64, StoreError> {
        self.db.generate_id().map_err(map_sled)
    }

    fn sweep_orphans(&self, stop: &AtomicBool) -> Result<u64, StoreError> {
        #[cfg(test)]
        if let Some(gate) = self.sweep_gate.lock().take() {
            let _ = gate.recv();
        }
        // The earlier sessions' files that pointers name now. A pointer
        // to such a file can only be removed from here on, never added.
        let first_id = self.chunks.first_id();
        let mut live = Vec::new();
        for (n, item) in self.tree(TreeId::Chunks).iter().values().enumerate() {
            if n % 1024 == 0 && stop.load(Ordering::Relaxed) {
                return Ok(0);
            }
            if let Ok(p) = Pointer::decode(&item.map_err(map_sled)?)
                && p.file < first_id
            {
                live.push(p.file);
            }
        }
        live.sort_unstable();
        self.chunks.sweep_orphans(&live, stop)
    }

    fn flush(&self) -> Result<(), StoreError> {
        self.db.flush().map(|_| ()).map_err(map_sled)
    }

    fn size_on_disk(&self) -> Result<u64, StoreError> {
        Ok(self.db.size_on_disk().map_err(map_sled)? + self.chunks.bytes())
    }
}

#[cfg(test)]
mod open_tests {
    use super::*;

    #[test]
    fn errors_of_the_system_are_not_corruption() {
        for errno in [
            libc::EACCES,
            libc::EPERM,
            libc::EMFILE,
            libc::ENFILE,
            libc::ENOSPC,
            libc::EROFS,
            libc::ENOTDIR,
            libc::EIO,
        ] {
            let e = std::io::Error::from_raw_os_error(errno);
            assert!(is_system_error(&e), "{e}");
        }
        for kind in [
            std::io::ErrorKind::InvalidData,
            std::io::ErrorKind::UnexpectedEof,
            std::io::ErrorKind::Other,
        ] {
            assert!(!is_system_error(&kind.into()), "{kind:?}");
        }
    }
}
