//! The open data files of a dataset, at most `cap` at a time.
//!
//! Positioned reads need a descriptor, and a process may hold only so many (`RLIMIT_NOFILE`;
//! 1024 is a common soft limit, 20,000 the hard limit of the development machine), while an
//! archive may hold 100,000 recordings. When the cap covers every recording, every file opened
//! at dataset open stays open for the dataset's life and reads borrow it without a lock. When
//! it does not, the pool keeps `cap` files open and evicts by the clock
//! (second-chance) rule: a file read since the hand last passed keeps its descriptor once more.
//! A file that is not open is opened again by path on its next read, and must be the file that
//! was opened at dataset open (the same device, inode and birth time, [`FileId`]): a file
//! replaced under the run (renamed over, or deleted and written again, even where the
//! filesystem reuses the inode number) is [`Error::Replaced`], never read; a deleted one fails
//! to open, naming it. Either ends a run like a truncation does.
//!
//! A reader holds an `Arc<File>`, so evicting a file another thread is reading closes it only
//! when that read ends: at most `cap` plus the number of reading threads are open at once.

use std::fs::File;
use std::ops::Deref;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

const NONE: u32 = u32::MAX;

/// The identity of a data file when its dataset opened it: device, inode, and the birth time
/// where the filesystem records one (ext4, xfs, btrfs, tmpfs), else the status-change time (an
/// inode number is reused once its file is deleted; a time set at creation is not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
    born: (i64, i64),
}

impl FileId {
    /// The identity in `meta`; `None` where the platform has no inode numbers.
    pub fn of(meta: &std::fs::Metadata) -> Option<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let born = match meta
                .created()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            {
                Some(d) => (d.as_secs() as i64, i64::from(d.subsec_nanos())),
                None => (meta.ctime(), meta.ctime_nsec()),
            };
            Some(FileId {
                dev: meta.dev(),
                ino: meta.ino(),
                born,
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
        }
    }
}

/// A data file as a read sees it: borrowed from a pool that holds every file, or shared with
/// a pool that may evict it meanwhile.
pub enum Held<'a> {
    Borrowed(&'a File),
    Shared(Arc<File>),
}

impl Deref for Held<'_> {
    type Target = File;
    fn deref(&self) -> &File {
        match self {
            Held::Borrowed(f) => f,
            Held::Shared(f) => f,
        }
    }
}

struct Slot {
    recording: u32,
    file: Arc<File>,
    /// Read since the clock hand last passed it.
    used: bool,
}

struct Clock {
    /// Per recording: its slot, or `NONE` when it is not open.
    slot_of: Vec<u32>,
    slots: Vec<Slot>,
    hand: usize,
}

enum Mode {
    /// `cap >= n`: the files offered at open, read without a lock.
    All(Vec<Option<File>>),
    Clock(Mutex<Clock>),
}

/// At most `cap` open files of `n` recordings; see the module documentation.
pub struct FilePool {
    cap: usize,
    mode: Mode,
}

impl FilePool {
    /// A pool for `n` recordings holding at most `cap` (>= 1) of them open.
    pub fn new(n: usize, cap: usize) -> Result<FilePool> {
        if cap == 0 {
            return Err(Error::config("max_open_files", "must be >= 1, got 0"));
        }
        if u32::try_from(n).map_or(true, |n| n == NONE) {
            return Err(Error::config(
                "data_paths",
                format!("{n} recordings is more than a dataset can hold"),
            ));
        }
        let mode = if cap >= n {
            Mode::All((0..n).map(|_| None).collect())
        } else {
            Mode::Clock(Mutex::new(Clock {
                slot_of: vec![NONE; n],
                slots: Vec::with_capacity(cap),
                hand: 0,
            }))
        };
        Ok(FilePool { cap, mode })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Whether every recording's file stays open (no eviction, no reopening).
    pub fn holds_all(&self) -> bool {
        matches!(self.mode, Mode::All(_))
    }

    /// How many files are open now (held by the pool).
    pub fn open_files(&self) -> usize {
        match &self.mode {
            Mode::All(files) => files.iter().filter(|f| f.is_some()).count(),
            Mode::Clock(m) => m.lock().map_or(0, |c| c.slots.len()),
        }
    }

    /// Keeps `file`, just opened for recording `r` at dataset open, while there is room;
    /// otherwise it is closed (and opened again when read).
    pub fn offer(&mut self, r: usize, file: File) {
        match &mut self.mode {
            Mode::All(files) => files[r] = Some(file),
            Mode::Clock(m) => {
                // Nothing else holds the pool yet (it is being built): no lock to wait for.
                let clock = m.get_mut().unwrap_or_else(|e| e.into_inner());
                if clock.slots.len() < self.cap && clock.slot_of[r] == NONE {
                    clock.insert(r, Arc::new(file));
                }
            }
        }
    }

    /// Recording `r`'s file if the pool holds it now (marking it read), without opening it.
    pub fn peek(&self, r: usize) -> Result<Option<Held<'_>>> {
        Ok(match &self.mode {
            Mode::All(files) => files[r].as_ref().map(Held::Borrowed),
            Mode::Clock(m) => lock(m)?.touch(r).map(Held::Shared),
        })
    }

    /// Recording `r`'s open file, opened by `reopen` when the pool does not hold it (then kept,
    /// evicting another when the pool is full). `reopen` runs without the pool's lock held.
    pub fn get(&self, r: usize, reopen: impl FnOnce() -> Result<File>) -> Result<Held<'_>> {
        let m = match &self.mode {
            Mode::All(files) => {
                return match files[r].as_ref() {
                    Some(f) => Ok(Held::Borrowed(f)),
                    None => Ok(Held::Shared(Arc::new(reopen()?))),
                }
            }
            Mode::Clock(m) => m,
        };
        if let Some(f) = lock(m)?.touch(r) {
            return Ok(Held::Shared(f));
        }
        let file = Arc::new(reopen()?);
        let evicted;
        {
            let mut clock = lock(m)?;
            // Another thread may have opened it meanwhile: keep one descriptor, theirs.
            if let Some(f) = clock.touch(r) {
                return Ok(Held::Shared(f));
            }
            evicted = if clock.slots.len() < self.cap {
                clock.insert(r, file.clone());
                None
            } else {
                Some(clock.replace(r, file.clone()))
            };
        }
        drop(evicted); // the close, outside the lock
        Ok(Held::Shared(file))
    }
}

fn lock(m: &Mutex<Clock>) -> Result<std::sync::MutexGuard<'_, Clock>> {
    m.lock()
        .map_err(|_| Error::Internal("open-file pool poisoned by an earlier failure".into()))
}

impl Clock {
    fn touch(&mut self, r: usize) -> Option<Arc<File>> {
        let s = self.slot_of[r];
        (s != NONE).then(|| {
            let slot = &mut self.slots[s as usize];
            slot.used = true;
            slot.file.clone()
        })
    }

    fn insert(&mut self, r: usize, file: Arc<File>) {
        self.slot_of[r] = self.slots.len() as u32; // < cap < n < u32::MAX
        self.slots.push(Slot {
            recording: r as u32,
            file,
            used: true,
        });
    }

    /// Puts `r` in the first slot, from the hand on, not read since the hand last passed it
    /// (clearing the mark of each it passes); returns the evicted file.
    fn replace(&mut self, r: usize, file: Arc<File>) -> Arc<File> {
        loop {
            let h = self.hand;
            self.hand = (h + 1) % self.slots.len();
            let slot = &mut self.slots[h];
            if std::mem::take(&mut slot.used) {
                continue;
            }
            self.slot_of[slot.recording as usize] = NONE;
            self.slot_of[r] = h as u32;
            slot.recording = r as u32;
            slot.used = true;
            return std::mem::replace(&mut slot.file, file);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn files(t: &TempDir, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| t.file(&format!("f{i}"), &[i as u8]))
            .collect()
    }

    fn first_byte(f: &File) -> u8 {
        let mut b = [0u8];
        crate::io::read_exact_at(f, &mut b, 0).unwrap();
        b[0]
    }

    #[test]
    fn holds_at_most_cap_and_reads_every_file() {
        let t = TempDir::new("pool");
        let paths = files(&t, 7);
        let mut pool = FilePool::new(7, 3).unwrap();
        for (r, p) in paths.iter().enumerate() {
            pool.offer(r, File::open(p).unwrap());
        }
        assert_eq!(pool.open_files(), 3);
        let mut opened = 0;
        for round in 0..3 {
            for (r, p) in paths.iter().enumerate() {
                let f = pool
                    .get(r, || {
                        opened += 1;
                        Ok(File::open(p).unwrap())
                    })
                    .unwrap();
                assert_eq!(first_byte(&f), r as u8, "round {round} recording {r}");
                assert!(pool.open_files() <= 3);
            }
        }
        assert!(
            opened >= 4,
            "the 4 not kept at open were opened on read ({opened})"
        );
    }

    #[test]
    fn the_file_not_read_since_the_hand_passed_is_evicted() {
        let t = TempDir::new("pool");
        let paths = files(&t, 4);
        let pool = FilePool::new(4, 2).unwrap();
        let opens = std::cell::Cell::new(0);
        let get = |r: usize| {
            pool.get(r, || {
                opens.set(opens.get() + 1);
                Ok(File::open(&paths[r]).unwrap())
            })
            .unwrap()
        };
        get(0);
        get(1);
        // Full, both read: the hand clears 0 and 1, comes round and evicts 0; it stops at 1.
        get(2);
        // 1 lost its mark when the hand passed; 2 was read since: 3 takes 1's descriptor.
        get(3);
        assert_eq!(opens.get(), 4);
        get(2);
        get(3);
        assert_eq!(opens.get(), 4, "2 and 3 are open");
        get(1);
        assert_eq!(opens.get(), 5, "1 was evicted");
        assert_eq!(pool.open_files(), 2);
    }

    #[test]
    fn a_pool_that_holds_every_file_lends_them_and_never_reopens() {
        let t = TempDir::new("pool");
        let paths = files(&t, 3);
        let mut pool = FilePool::new(3, 3).unwrap();
        assert!(pool.holds_all());
        pool.offer(0, File::open(&paths[0]).unwrap());
        pool.offer(2, File::open(&paths[2]).unwrap());
        assert_eq!(pool.open_files(), 2);
        for r in [0, 2, 0, 2] {
            let f = pool.get(r, || panic!("reopened {r}")).unwrap();
            assert!(matches!(f, Held::Borrowed(_)));
            assert_eq!(first_byte(&f), r as u8);
        }
        // Not offered (a recording without windows): opened for the read, not kept.
        let f = pool.get(1, || Ok(File::open(&paths[1]).unwrap())).unwrap();
        assert_eq!(first_byte(&f), 1);
        assert!(pool.peek(1).unwrap().is_none());
        assert_eq!(pool.open_files(), 2);
        assert!(!FilePool::new(4, 3).unwrap().holds_all());
    }

    #[test]
    fn an_unopenable_file_is_its_error_and_leaves_the_pool_as_it_was() {
        let pool = FilePool::new(2, 1).unwrap();
        let e = pool
            .get(0, || Err(Error::data("x", "data file", "cannot be opened")))
            .err()
            .unwrap();
        assert!(matches!(e, Error::Data { .. }));
        assert_eq!(pool.open_files(), 0);
        assert!(matches!(
            FilePool::new(2, 0),
            Err(Error::Config { ref key, .. }) if key == "max_open_files"
        ));
    }

    #[test]
    fn threads_share_the_pool() {
        let t = TempDir::new("pool");
        let paths = files(&t, 16);
        let pool = FilePool::new(16, 3).unwrap();
        std::thread::scope(|s| {
            for k in 0..4 {
                let (pool, paths) = (&pool, &paths);
                s.spawn(move || {
                    for i in 0..400 {
                        let r = (i * 7 + k * 3) % 16;
                        let f = pool.get(r, || Ok(File::open(&paths[r]).unwrap())).unwrap();
                        assert_eq!(first_byte(&f), r as u8);
                    }
                });
            }
        });
        assert!(pool.open_files() <= 3);
    }
}
