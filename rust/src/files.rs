//! The open data files of a dataset, at most `cap` at a time.
//!
//! Positioned reads need a descriptor, and a process may hold only so many (`RLIMIT_NOFILE`;
//! 1024 is a common soft limit, 20,000 the hard limit of the shared VM), while an archive may
//! hold 100,000 recordings. When every recording fits, every file opened at dataset open stays
//! open for the dataset's life (the pool never evicts). When they do not, the pool keeps `cap`
//! files open and evicts by the clock (second-chance) rule: a file read since the hand last
//! passed keeps its descriptor once more. A file that is not open is opened again by path on
//! its next read, and must be the file that was opened at dataset open (the same device and
//! inode): a file replaced under the run (renamed over, deleted and written again) is
//! [`Error::Replaced`], never read; a deleted one fails to open, naming it. Either ends a run
//! like a truncation does.
//!
//! A reader holds an `Arc<File>`, so evicting a file another thread is reading closes it only
//! when that read ends: at most `cap` plus the number of reading threads are open at once.

use std::fs::File;
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};

const NONE: u32 = u32::MAX;

/// The identity of a data file when its dataset opened it: device and inode (Unix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    /// The identity in `meta`; `None` where the platform has no inode numbers.
    pub fn of(meta: &std::fs::Metadata) -> Option<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            Some(FileId {
                dev: meta.dev(),
                ino: meta.ino(),
            })
        }
        #[cfg(not(unix))]
        {
            let _ = meta;
            None
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

/// At most `cap` open files of `n` recordings; see the module documentation.
pub struct FilePool {
    cap: usize,
    clock: Mutex<Clock>,
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
        Ok(FilePool {
            cap,
            clock: Mutex::new(Clock {
                slot_of: vec![NONE; n],
                slots: Vec::with_capacity(cap.min(n)),
                hand: 0,
            }),
        })
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// How many files are open now.
    pub fn open_files(&self) -> usize {
        self.lock().map_or(0, |c| c.slots.len())
    }

    /// Keeps `file`, just opened for recording `r` at dataset open, while there is room;
    /// otherwise it is closed (and opened again when read).
    pub fn offer(&self, r: usize, file: File) -> Result<()> {
        let mut clock = self.lock()?;
        if clock.slots.len() < self.cap && clock.slot_of[r] == NONE {
            clock.insert(r, Arc::new(file));
        }
        Ok(())
    }

    /// Recording `r`'s open file, opened by `reopen` when the pool does not hold it (then kept,
    /// evicting another when the pool is full). `reopen` runs without the pool's lock held.
    pub fn get(&self, r: usize, reopen: impl FnOnce() -> Result<File>) -> Result<Arc<File>> {
        if let Some(f) = self.lock()?.touch(r) {
            return Ok(f);
        }
        let file = Arc::new(reopen()?);
        let evicted;
        {
            let mut clock = self.lock()?;
            // Another thread may have opened it meanwhile: keep one descriptor, theirs.
            if let Some(f) = clock.touch(r) {
                return Ok(f);
            }
            evicted = if clock.slots.len() < self.cap {
                clock.insert(r, file.clone());
                None
            } else {
                Some(clock.replace(r, file.clone()))
            };
        }
        drop(evicted); // the close, outside the lock
        Ok(file)
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Clock>> {
        self.clock
            .lock()
            .map_err(|_| Error::Internal("open-file pool poisoned by an earlier failure".into()))
    }
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
        self.slot_of[r] = self.slots.len() as u32; // < cap <= n < u32::MAX
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
        crate::recordings::read_exact_at(f, &mut b, 0).unwrap();
        b[0]
    }

    #[test]
    fn holds_at_most_cap_and_reads_every_file() {
        let t = TempDir::new("pool");
        let paths = files(&t, 7);
        let pool = FilePool::new(7, 3).unwrap();
        for (r, p) in paths.iter().enumerate() {
            pool.offer(r, File::open(p).unwrap()).unwrap();
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
