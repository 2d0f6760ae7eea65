//! Durable SQLite message commits without an fsync inside the commit.
//!
//! With `synchronous = full`, SQLite fsyncs the WAL inside every commit, on its one writer
//! thread: nothing else is written meanwhile. Herald instead commits message batches with
//! `synchronous = normal` (no fsync), and makes them durable with an fsync of the WAL file of
//! its own: on another thread while the writer goes on with the next batch, or on the
//! writer's thread when no batch waits (nothing to overlap, and a hand-off saved). Callers learn
//! their outcome only after that fsync, so `SendAck OK` still means durable (measured: a
//! sixth more rows a second).
//!
//! Why this is as safe as `full`: a commit's frames are in the WAL file (the OS's cache) when
//! the commit returns, and one fsync of the file makes everything written to it before durable,
//! header included. Frames written after it are not claimed. A checkpoint that copies frames
//! into the database fsyncs the database before the WAL can be reused, so a frame overwritten
//! by a restarted WAL was durable already.
//!
//! One difference remains, closed here too: SQLite makes a commit visible to other connections
//! as it returns, before our fsync. So every message read waits, after its query, until each
//! commit it could have seen is durable ([`WalSync::settle`]): no device is shown a message a
//! power cut could still take back. When nothing is pending that is one atomic read.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use super::{StoreError, SyncFailure};

/// How long a read waits for the commits it could see to be made durable before it fails.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// Numbers message commits and makes them durable; one per SQLite database with
/// `sqlite_synchronous = "full"`.
#[derive(Debug)]
pub struct WalSync {
    /// The database's WAL file (`<database>-wal`).
    path: PathBuf,
    /// Message commits announced so far, numbered from 1. A commit is announced *before* it is
    /// issued, so a reader that can see its rows also sees its number.
    announced: AtomicU64,
    /// The last announced commit that has returned (successfully or not); commits are
    /// made one at a time on SQLite's one writer connection, so every earlier one has too.
    returned: AtomicU64,
    /// The last commit known durable.
    durable: watch::Sender<u64>,
    /// The WAL file as the last fsync opened it; held for the length of each fsync, so one
    /// runs at a time.
    file: std::sync::Mutex<Option<Kept>>,
}

/// The open WAL file, and which file it is.
#[derive(Debug)]
struct Kept {
    file: std::fs::File,
    device: u64,
    inode: u64,
}

impl WalSync {
    /// Durability for the SQLite database at `database` (its file path).
    pub fn new(database: &std::path::Path) -> Self {
        let mut path = database.as_os_str().to_owned();
        path.push("-wal");
        Self {
            path: path.into(),
            announced: AtomicU64::new(0),
            returned: AtomicU64::new(0),
            durable: watch::Sender::new(0),
            file: std::sync::Mutex::new(None),
        }
    }

    /// Numbers the commit about to be issued. Call [`returned`](Self::returned) with the
    /// number once the commit has returned, whatever its outcome.
    pub fn announce(&self) -> u64 {
        self.announced.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// Notes that commit `number` has returned.
    pub fn returned(&self, number: u64) {
        self.returned.fetch_max(number, Ordering::SeqCst);
    }

    /// Notes that commit `number` has returned, and when it `failed`, waits until it is
    /// durable all the same: nothing of it is visible, but readers that saw its number wait
    /// for it, and no later commit may come to cover it.
    pub async fn finished(self: &Arc<Self>, number: u64, failed: bool) {
        self.returned(number);
        if failed {
            let _ = self.sync(number).await;
        }
    }

    /// Makes commit `number` (which has returned) and every one before it durable: at once if
    /// an fsync since has done so, else with one fsync of the WAL on a blocking thread,
    /// shared with every caller that arrives while it runs.
    ///
    /// # Errors
    /// [`SyncFailure::Fsync`] when the fsync fails: the commit may or may not survive a
    /// power cut, so it must not be reported durable.
    pub async fn sync(self: &Arc<Self>, number: u64) -> Result<(), SyncFailure> {
        if *self.durable.borrow() >= number {
            return Ok(());
        }
        let wal = Arc::clone(self);
        tokio::task::spawn_blocking(move || wal.sync_here(number))
            .await
            .unwrap_or_else(|stopped| Err(self.failure(std::io::Error::other(stopped))))
    }

    /// As [`sync`](Self::sync), on the caller's thread, which it may block for the length of
    /// an fsync: for a thread of its own with nothing else to do meanwhile (the commit
    /// writer's, when no batch is waiting), where handing the fsync to another thread
    /// would only add two thread switches.
    ///
    /// # Errors
    /// As [`sync`](Self::sync).
    pub fn sync_here(&self, number: u64) -> Result<(), SyncFailure> {
        if *self.durable.borrow() >= number {
            return Ok(());
        }
        // One fsync at a time: a caller that arrives during one waits and shares the next.
        let mut file = self.file.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *self.durable.borrow() >= number {
            return Ok(()); // the fsync we waited behind covered it
        }
        // Only commits that have returned have all their frames in the file.
        let covered = self.returned.load(Ordering::SeqCst);
        self.fsync(&mut file).map_err(|source| self.failure(source))?;
        self.durable.send_if_modified(|durable| {
            let moved = covered > *durable;
            *durable = (*durable).max(covered);
            moved
        });
        Ok(())
    }

    /// An fsync of the WAL file through the file kept open from the last one, unless the
    /// path now names another file: SQLite deletes the WAL when its last connection closes
    /// and starts a new one later, and an fsync of the deleted one would make nothing durable.
    /// A `stat` of the path costs one system call where opening and closing the file cost two.
    fn fsync(&self, kept: &mut Option<Kept>) -> std::io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let current = std::fs::metadata(&self.path)?;
        let same = |kept: &Kept| kept.device == current.dev() && kept.inode == current.ino();
        let open = || -> std::io::Result<Kept> {
            let file = std::fs::File::open(&self.path)?;
            let opened = file.metadata()?;
            Ok(Kept { file, device: opened.dev(), inode: opened.ino() })
        };
        let wal = match kept.take() {
            Some(wal) if same(&wal) => wal,
            _ => open()?,
        };
        let synced = wal.file.sync_data();
        if synced.is_ok() {
            *kept = Some(wal);
        }
        synced
    }

    fn failure(&self, source: std::io::Error) -> SyncFailure {
        SyncFailure::Fsync { path: self.path.display().to_string(), source: Arc::new(source) }
    }

    /// Waits until every commit a read that just finished could have seen is durable.
    ///
    /// # Errors
    /// [`StoreError::Sync`] when that takes longer than 10 s (the writer is stuck or stopped).
    pub async fn settle(&self) -> Result<(), StoreError> {
        let seen = self.announced.load(Ordering::SeqCst);
        if *self.durable.borrow() >= seen {
            return Ok(());
        }
        let mut durable = self.durable.subscribe();
        match tokio::time::timeout(SETTLE_TIMEOUT, durable.wait_for(|&durable| durable >= seen)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(_)) | Err(_) => Err(StoreError::Sync(SyncFailure::Stalled(SETTLE_TIMEOUT))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_sync_covers_every_returned_commit_and_no_later_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let database = dir.path().join("herald.db");
        std::fs::write(dir.path().join("herald.db-wal"), b"frames").expect("wal");
        let wal = Arc::new(WalSync::new(&database));

        let first = wal.announce();
        wal.returned(first);
        let second = wal.announce(); // issued, not yet returned
        wal.sync(first).await.expect("sync");
        assert_eq!(*wal.durable.borrow(), first, "a commit still under way is not claimed");

        wal.returned(second);
        wal.sync(second).await.expect("sync");
        assert_eq!(*wal.durable.borrow(), second);
        wal.settle().await.expect("nothing pending");
    }

    #[tokio::test]
    async fn a_read_waits_for_the_commits_it_could_see() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("herald.db-wal"), b"frames").expect("wal");
        let wal = std::sync::Arc::new(WalSync::new(&dir.path().join("herald.db")));
        let commit = wal.announce();

        let reader = tokio::spawn({
            let wal = std::sync::Arc::clone(&wal);
            async move { wal.settle().await }
        });
        tokio::task::yield_now().await;
        assert!(!reader.is_finished(), "the read must wait for the commit to be durable");

        wal.returned(commit);
        wal.sync(commit).await.expect("sync");
        reader.await.expect("reader").expect("settled");
    }

    #[tokio::test]
    async fn a_failed_fsync_is_an_error_not_durability() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wal = Arc::new(WalSync::new(&dir.path().join("missing.db"))); // no WAL file to sync
        let commit = wal.announce();
        wal.returned(commit);
        let error = wal.sync(commit).await.expect_err("no file");
        let SyncFailure::Fsync { source, .. } = &error else { panic!("{error}") };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "the cause is kept: {error}");
        assert_eq!(*wal.durable.borrow(), 0);
    }

    #[test]
    fn a_sync_follows_the_wal_to_a_new_file_and_never_claims_a_deleted_one() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("herald.db-wal");
        std::fs::write(&path, b"frames").expect("wal");
        let wal = WalSync::new(&dir.path().join("herald.db"));
        let kept_inode = |wal: &WalSync| wal.file.lock().expect("lock").as_ref().map(|kept| kept.inode);

        let first = wal.announce();
        wal.returned(first);
        wal.sync_here(first).expect("sync");
        assert_eq!(kept_inode(&wal), Some(std::fs::metadata(&path).expect("stat").ino()));

        // SQLite deleted the WAL (its last connection closed): the kept file is not it.
        std::fs::remove_file(&path).expect("delete");
        let second = wal.announce();
        wal.returned(second);
        let error = wal.sync_here(second).expect_err("no WAL to sync");
        let SyncFailure::Fsync { source, .. } = &error else { panic!("{error}") };
        assert_eq!(source.kind(), std::io::ErrorKind::NotFound, "{error}");
        assert_eq!(*wal.durable.borrow(), first, "nothing claimed through the deleted file");

        // ...and started a new one: that is the file synced from now on.
        std::fs::write(&path, b"new frames").expect("new wal");
        wal.sync_here(second).expect("sync");
        assert_eq!(kept_inode(&wal), Some(std::fs::metadata(&path).expect("stat").ino()));
        assert_eq!(*wal.durable.borrow(), second);
    }
}
