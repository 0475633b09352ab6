//! One batch's assembly as a shared job (docs/design.md 2.3): its rows split in chunks that
//! any thread may claim from one counter.
//!
//! Why: handing a batch from one thread to another costs a wake-up, about 50 µs on the 2-core VM
//! measured in design 2.3.1, a quarter of a 256-row batch's copy. So the prefetch thread does not
//! hand its batch to a pool and sleep, and the consumer does not sleep while the batch it waits
//! for is unfinished: both claim chunks of the same job, and nobody waits for a wake-up while
//! rows are left to copy. On machines with more than two threads in rayon's pool, helpers on that
//! pool claim chunks too (`helpers`).
//!
//! The protocol, each step a single atomic operation or a lock:
//!
//! 1. `claim`: `next.fetch_add(1)` hands out chunk indices; an index past the last chunk means
//!    nothing is left. Each chunk is claimed exactly once, so each row has exactly one writer.
//! 2. A claimant decodes its chunk's rows into the batch buffer, records the rows' sources, and
//!    then counts the chunk in `done` (`Release`). A failed row records its error (the one of the
//!    lowest chunk is kept, so which error a batch reports never depends on threads) and the
//!    remaining chunks are counted without being read.
//! 3. Exactly one of the two owners (the prefetch thread and the consumer) wins `complete`
//!    (`won.swap`), after seeing every chunk counted (`Acquire`): every write to the buffer has
//!    happened then, and no thread writes to it again. The winner runs the per-file check
//!    (`Dataset::recheck`) and publishes the batch; helpers never complete a job.
//!
//! So the buffer is written only by claimants of distinct chunks before the job completes, and by
//! the winner (the re-read of a changed file's rows) after it; the owner of a buffer (the pool's
//! `Buffer` here, a ring slot in `Filling` state) keeps it until the job completes.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::recordings::{Dataset, RowSource};
use crate::ring::RawBuf;
use crate::stream::Buffer;

/// Rows per chunk: enough to amortise a claim (one contended atomic) against ~µs row copies, few
/// enough that the last chunk in flight keeps a waiting thread only a few µs.
pub const CHUNK_ROWS: usize = 4;

/// How long a thread spins (yielding its core between polls) for something that is microseconds
/// away (a chunk in flight, a batch being published) before it sleeps instead.
pub const SPIN: Duration = Duration::from_micros(200);

/// Polls `ready` until it returns true, yielding between polls, for at most `SPIN`. True when it
/// did. Yielding matters on a busy machine: a spinning thread would take the core of the one it
/// waits for.
pub fn spin_until(mut ready: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    loop {
        if ready() {
            return true;
        }
        if start.elapsed() > SPIN {
            return false;
        }
        std::thread::yield_now();
    }
}

/// One batch being assembled (see the module docs).
pub struct Job {
    pub pos: u64,
    pub ids: Vec<u64>,
    out: RawBuf,
    /// The pooled buffer `out` points into (None for a ring slot, owned by the ring).
    owned: Mutex<Option<Buffer>>,
    row_bytes: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Each row's source, set by the claimant of its chunk before that chunk is counted done.
    sources: Vec<AtomicUsize>,
    failed: AtomicBool,
    error: Mutex<Option<(usize, Error)>>,
    won: AtomicBool,
    /// Set by the winner once the batch is published (a ring slot finished); a consumer that lost
    /// `complete` to the prefetch thread polls it instead of sleeping.
    published: AtomicBool,
}

impl Job {
    /// A job filling the pooled `buffer` with the batch of `ids` at `pos`. The ids and the buffer
    /// length are checked here, so a failing batch leaves the buffer untouched.
    pub fn pooled(ds: &Dataset, pos: u64, ids: Vec<u64>, mut buffer: Buffer) -> Result<Job> {
        let bytes = buffer.as_bytes_mut();
        let out = RawBuf::new(bytes.as_mut_ptr(), bytes.len())?;
        Job::new(ds, pos, ids, out, Some(buffer))
    }

    /// A job filling the ring buffer `out`.
    ///
    /// # Safety
    /// `out` must stay valid for writes, and nobody but this job's claimants and its winner may
    /// access it, until the job has completed (`complete` returned).
    pub unsafe fn into_raw(ds: &Dataset, pos: u64, ids: Vec<u64>, out: RawBuf) -> Result<Job> {
        Job::new(ds, pos, ids, out, None)
    }

    fn new(
        ds: &Dataset,
        pos: u64,
        ids: Vec<u64>,
        out: RawBuf,
        owned: Option<Buffer>,
    ) -> Result<Job> {
        ds.check_batch(&ids, out.len())?;
        let rows = ids.len();
        let chunks = if ds.row_bytes() == 0 {
            0
        } else {
            rows.div_ceil(CHUNK_ROWS)
        };
        Ok(Job {
            pos,
            out,
            owned: Mutex::new(owned),
            row_bytes: ds.row_bytes(),
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sources: (0..rows).map(|_| AtomicUsize::new(0)).collect(),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            won: AtomicBool::new(false),
            published: AtomicBool::new(false),
            ids,
        })
    }

    /// Chunks in this job.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Claims and decodes chunks until none is left; returns how many this call did. Any thread
    /// may call it, any number of times, at any point of the job's life.
    pub fn work(&self, ds: &Dataset) -> usize {
        let mut did = 0;
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return did;
            }
            // Counted done however the chunk ends, even by a panic (then as failed), so waiters
            // never hang and a half-written chunk is never published.
            let counted = Counted {
                job: self,
                chunk: c,
            };
            if !self.failed.load(Ordering::Relaxed) {
                if let Err(e) = self.decode_chunk(ds, c) {
                    self.fail(c, e);
                }
            }
            drop(counted);
            did += 1;
        }
    }

    fn decode_chunk(&self, ds: &Dataset, c: usize) -> Result<()> {
        let first = c * CHUNK_ROWS;
        let last = (first + CHUNK_ROWS).min(self.ids.len());
        let rb = self.row_bytes;
        // SAFETY: chunk c was claimed by this thread alone (fetch_add hands each index out once),
        // its rows [first, last) lie inside `out` (check_batch: ids.len() * rb == out.len()), and
        // `out` stays valid until the job completes, which needs this chunk counted done.
        let rows = unsafe {
            std::slice::from_raw_parts_mut(self.out.as_ptr().add(first * rb), (last - first) * rb)
        };
        let mut sources = [(0usize, false); CHUNK_ROWS];
        let sources = &mut sources[..last - first];
        ds.decode_rows(&self.ids[first..last], rows, sources)?;
        for (slot, &(r, mapped)) in self.sources[first..last].iter().zip(sources.iter()) {
            slot.store(r << 1 | mapped as usize, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fail(&self, chunk: usize, e: Error) {
        self.failed.store(true, Ordering::Relaxed);
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(|(c, _)| chunk < *c) {
            *g = Some((chunk, e));
        }
    }

    /// Every chunk has been claimed and decoded (or skipped after a failure).
    pub fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.chunks
    }

    /// Waits for the chunks other threads still have in flight (spinning, then sleeping in
    /// short steps). Only called once `work` has returned, so every chunk is claimed and each
    /// claimant is a copy of at most `CHUNK_ROWS` rows away from counting it.
    pub fn wait_finished(&self) {
        while !spin_until(|| self.finished()) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// True for exactly one caller: the one that completes the job. Call after `wait_finished`.
    pub fn win(&self) -> bool {
        !self.won.swap(true, Ordering::AcqRel)
    }

    /// The winner's part: the per-file check of the rows copied from mappings (and the re-read
    /// of a changed file's rows), then the batch's outcome. Call once, after `win`.
    pub fn complete(&self, ds: &Dataset) -> Result<()> {
        if !self.finished() {
            return Err(Error::Internal("batch completed before its rows".into()));
        }
        if let Some((_, e)) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Err(e);
        }
        let sources: Vec<RowSource> = self
            .sources
            .iter()
            .map(|s| {
                let v = s.load(Ordering::Relaxed);
                (v >> 1, v & 1 == 1)
            })
            .collect();
        // SAFETY: every chunk is done (checked above, Acquire), so no claimant writes `out` any
        // more, and only the winner gets here.
        let out = unsafe { self.out.as_mut_slice() };
        ds.recheck(&self.ids, out, &sources)
    }

    /// The pooled buffer, once the job has completed (None for a ring job, or taken already).
    pub fn take_buffer(&self) -> Option<Buffer> {
        self.owned.lock().unwrap_or_else(|p| p.into_inner()).take()
    }

    pub fn publish(&self) {
        self.published.store(true, Ordering::Release);
    }

    pub fn is_published(&self) -> bool {
        self.published.load(Ordering::Acquire)
    }

    /// Starts `n` helpers on rayon's pool, each claiming chunks of this job until none is left.
    /// They hold the job and the dataset, never complete the job, and a helper that starts
    /// after the last claim does nothing.
    pub fn spawn_helpers(self: &Arc<Self>, ds: &Arc<Dataset>, n: usize) {
        for _ in 0..n.min(self.chunks.saturating_sub(1)) {
            let (job, ds) = (self.clone(), ds.clone());
            rayon::spawn(move || {
                job.work(&ds);
            });
        }
    }
}

/// How many rayon helpers a prefetching stream starts per batch: the pool's threads beyond the
/// two that the prefetch thread and a waiting consumer already are (none on a 2-core machine).
pub fn helpers() -> usize {
    rayon::current_num_threads().saturating_sub(2)
}

struct Counted<'a> {
    job: &'a Job,
    chunk: usize,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let msg = format!("rows of chunk {} were not copied (a panic)", self.chunk);
            self.job.fail(self.chunk, Error::Internal(msg));
        }
        self.job.done.fetch_add(1, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recordings::ReadPolicy;
    use crate::testutil::TempDir;

    /// Two ci8 recordings of `samples` samples each, mapped (`map_min_bytes` 0) or read with
    /// pread; windows of 16 samples (32 bytes).
    fn dataset(t: &TempDir, samples: usize, mapped: bool) -> Arc<Dataset> {
        let paths: Vec<String> = (0..2)
            .map(|r| {
                let bytes: Vec<u8> = (0..2 * samples).map(|k| (k * 7 + r * 91) as u8).collect();
                t.file(&format!("r{r}"), &bytes)
            })
            .collect();
        let policy = ReadPolicy {
            map_min_bytes: if mapped { 0 } else { u64::MAX },
            ..ReadPolicy::default()
        };
        let ds = Dataset::open_with(&paths, &["ci8", "ci8"], &[[0u64], [0]], 16, 16, policy);
        Arc::new(ds.unwrap())
    }

    fn pooled(ds: &Dataset, ids: &[u64]) -> Job {
        let buffer = Buffer::zeroed(ds.storage(), ids.len() * ds.row_elems()).unwrap();
        Job::pooled(ds, 7, ids.to_vec(), buffer).unwrap()
    }

    fn bytes(b: &mut Buffer) -> Vec<u8> {
        b.as_bytes_mut().to_vec()
    }

    fn gathered(ds: &Dataset, ids: &[u64]) -> Vec<u8> {
        let mut want = vec![0u8; ids.len() * ds.row_bytes()];
        ds.gather(ids, &mut want).unwrap();
        want
    }

    #[test]
    fn threads_claim_every_chunk_once_and_one_completes() {
        let t = TempDir::new("job");
        for mapped in [true, false] {
            let ds = dataset(&t, 4096, mapped);
            let ids: Vec<u64> = (0..103).map(|k| (k * 37) % ds.num_windows()).collect();
            let want = gathered(&ds, &ids);
            for _ in 0..20 {
                let job = Arc::new(pooled(&ds, &ids));
                assert_eq!(job.chunks(), 26); // 103 rows in chunks of 4, the last of 3
                job.spawn_helpers(&ds, 2);
                let (did, wins): (Vec<usize>, Vec<bool>) = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..3)
                        .map(|_| {
                            s.spawn(|| {
                                let did = job.work(&ds);
                                job.wait_finished();
                                (did, job.win())
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).unzip()
                });
                assert!(job.finished());
                assert!(did.iter().sum::<usize>() <= 26, "{did:?}"); // the rest: helpers
                assert_eq!(wins.iter().filter(|&&w| w).count(), 1, "{wins:?}");
                assert!(!job.win(), "won once only");
                job.complete(&ds).unwrap();
                let mut got = job.take_buffer().unwrap();
                assert_eq!(bytes(&mut got), want, "mapped {mapped}");
                assert!(job.take_buffer().is_none());
            }
        }
    }

    #[test]
    fn a_job_one_thread_finishes_alone_equals_gather() {
        let t = TempDir::new("job-alone");
        let ds = dataset(&t, 1024, true);
        let ids: Vec<u64> = vec![5, 0, 127, 64, 5];
        let job = pooled(&ds, &ids);
        assert!(
            job.complete(&ds).is_err(),
            "completing before the rows is a bug, reported"
        );
        assert_eq!(job.work(&ds), 2);
        assert_eq!(job.work(&ds), 0, "nothing left to claim");
        assert!(job.finished() && job.win());
        job.complete(&ds).unwrap();
        assert_eq!(bytes(&mut job.take_buffer().unwrap()), gathered(&ds, &ids));
    }

    #[test]
    fn a_bad_batch_is_refused_before_any_row_is_written() {
        let t = TempDir::new("job-bad");
        let ds = dataset(&t, 1024, false);
        let buffer = Buffer::zeroed(ds.storage(), 2 * ds.row_elems()).unwrap();
        let e = Job::pooled(&ds, 0, vec![0, ds.num_windows()], buffer).err();
        assert!(matches!(e, Some(Error::Index { .. })), "{e:?}");
        let buffer = Buffer::zeroed(ds.storage(), 3 * ds.row_elems()).unwrap();
        let e = Job::pooled(&ds, 0, vec![0, 1], buffer).err();
        assert!(
            matches!(e, Some(Error::Config { ref key, .. }) if key == "out"),
            "{e:?}"
        );
    }

    #[test]
    fn the_error_reported_is_the_lowest_chunks_whoever_reads_it() {
        let t = TempDir::new("job-err");
        for mapped in [true, false] {
            let ds = dataset(&t, 1024, mapped);
            let per = ds.num_windows() / 2; // windows of recording 0, then of recording 1
                                            // Rows of recording 1 first (chunk 0), of recording 0 from chunk 3 on.
            let ids: Vec<u64> = (0..12).map(|k| if k < 4 { per + k } else { k }).collect();
            let paths: Vec<String> = ds.recordings().iter().map(|r| r.path.clone()).collect();
            let full: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
            for p in &paths {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(0).unwrap();
            }
            for _ in 0..10 {
                let job = pooled(&ds, &ids);
                std::thread::scope(|s| {
                    s.spawn(|| job.work(&ds));
                    job.work(&ds);
                });
                job.wait_finished();
                assert!(job.win());
                match job.complete(&ds) {
                    Err(Error::LengthChanged { file, .. }) => assert_eq!(file, paths[1]),
                    other => panic!("mapped {mapped}: {other:?}"),
                }
            }
            for (p, b) in paths.iter().zip(&full) {
                std::fs::write(p, b).unwrap();
            }
        }
    }

    #[test]
    fn a_claimant_that_panics_fails_the_batch_without_a_hang() {
        let t = TempDir::new("job-panic");
        let ds = dataset(&t, 1024, false);
        let job = pooled(&ds, &[0, 1, 2, 3, 4, 5]);
        let c = job.next.fetch_add(1, Ordering::Relaxed); // a claimant takes chunk 0 ...
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _counted = Counted {
                job: &job,
                chunk: c,
            };
            panic!("... and dies while copying it");
        }));
        assert!(r.is_err());
        job.work(&ds);
        job.wait_finished();
        let e = job.complete(&ds).unwrap_err();
        assert!(
            matches!(e, Error::Internal(ref m) if m.contains("chunk 0")),
            "{e}"
        );
    }

    #[test]
    fn spin_until_gives_up_after_the_spin() {
        let start = Instant::now();
        assert!(!spin_until(|| false));
        assert!(start.elapsed() >= SPIN);
        assert!(spin_until(|| true));
    }
}
