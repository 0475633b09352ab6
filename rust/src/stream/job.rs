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
//!    then counts the chunk in `done` (`Release`). A failed chunk lowers `first_failed` to its
//!    index and keeps its error if it is the lowest so far; a chunk claimed later is skipped
//!    (counted, not read) only when a lower chunk has failed. So the lowest failing chunk is
//!    always read, and the error a batch reports never depends on which thread read what.
//! 3. `complete` waits until every chunk is counted (`Acquire`: every write to the buffer has
//!    happened, and no claimant writes it again), and then exactly one of the two owners (the
//!    prefetch thread and the consumer) wins it (`won.swap`). The winner runs the per-file check
//!    (`Dataset::recheck`), gets the outcome and the pooled buffer, and publishes the batch; the
//!    other gets nothing. Helpers never complete a job.
//!
//! So the buffer is written only by claimants of distinct chunks before the job completes, and by
//! the winner (the re-read of a changed file's rows) inside `complete`; the pooled `Buffer` and
//! the batch's ids leave the job only through its winner, and a ring slot stays `Filling` until
//! then.
//!
//! The consumer's side, the same for a pooled stream and a ring, is [`wait_for`]: take a ready
//! batch, else claim rows of the open job of the batch it waits for, else spin briefly, else
//! sleep until the prefetch thread changes something.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::buffer::{Buffer, BufferPool, RawBuf};
use crate::error::{Error, Result};
use crate::recordings::{Dataset, RowSource};

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

/// The batch's window ids: read by the claimants of its chunks, then moved out (never copied) by
/// the winner of `complete`, which never reads them through `get`.
struct Ids(UnsafeCell<Vec<u64>>);

// SAFETY: the ids are read only by a claimant of a chunk (`decode_chunk`), before it counts the
// chunk done; they are written once, by `take`, which only the winner of `complete` calls, after
// every chunk is counted done (`Acquire` on `done`, paired with each
// claimant's `Release`) and after its own reads. A claim made after the last chunk reads nothing.
unsafe impl Sync for Ids {}

impl Ids {
    /// # Safety
    /// Only by a claimant of a chunk, before it counts the chunk done (see the `Sync` impl).
    unsafe fn get(&self) -> &[u64] {
        // SAFETY: the caller's guarantee: `take`, the only writer, has not run and runs only
        // once every reader is done.
        unsafe { &*self.0.get() }
    }

    /// # Safety
    /// Only by the winner of `complete`, once every chunk is counted done.
    unsafe fn take(&self) -> Vec<u64> {
        // SAFETY: the caller's guarantee: nobody reads or writes the ids any more.
        unsafe { std::mem::take(&mut *self.0.get()) }
    }
}

/// One batch being assembled (see the module docs).
pub struct Job {
    pub pos: u64,
    ids: Ids,
    out: RawBuf,
    /// The pooled buffer `out` points into (None for a ring slot, owned by the ring); taken only
    /// by the winner of `complete`.
    owned: Mutex<Option<Buffer>>,
    row_bytes: usize,
    rows: usize,
    chunks: usize,
    next: AtomicUsize,
    done: AtomicUsize,
    /// Each row's source, set by the claimant of its chunk before that chunk is counted done.
    sources: Vec<AtomicUsize>,
    /// The lowest chunk that failed so far (`usize::MAX`: none).
    first_failed: AtomicUsize,
    error: Mutex<Option<(usize, Error)>>,
    won: AtomicBool,
}

/// What the winner of `Job::complete` gets.
#[derive(Debug)]
pub struct Completed {
    /// The batch's window ids, or why the batch could not be made.
    pub result: Result<Vec<u64>>,
    /// The pooled buffer (None for a ring job), on an error too, for its owner to take back.
    pub buffer: Option<Buffer>,
}

impl Job {
    /// A job filling a buffer of `pool` with the batch of `ids` at `pos`. The ids are checked
    /// before a buffer is taken, so a bad batch costs the pool nothing.
    pub fn pooled(ds: &Dataset, pos: u64, ids: Vec<u64>, pool: &BufferPool) -> Result<Job> {
        let too_big = || Error::config("batch_size", "batch buffer exceeds the address space");
        let elems = ids.len().checked_mul(ds.row_elems()).ok_or_else(too_big)?;
        let bytes = ids.len().checked_mul(ds.row_bytes()).ok_or_else(too_big)?;
        ds.check_batch(&ids, bytes)?;
        let mut buffer = pool.take(ds.storage(), elems)?;
        let out = buffer.as_bytes_mut();
        // The pool hands out a buffer of exactly `elems` of the dataset's storage type; the rows'
        // raw slices (`decode_chunk`) rely on it, so it is checked, not assumed.
        assert_eq!(
            out.len(),
            bytes,
            "a pooled batch buffer of the wrong length"
        );
        let out = RawBuf::new(out.as_mut_ptr(), out.len())?;
        Ok(Job::new(ds, pos, ids, out, Some(buffer)))
    }

    /// A job filling the ring buffer `out`; the ids and the buffer length are checked first.
    ///
    /// # Safety
    /// `out` must stay valid for writes, and nobody but this job's claimants and the winner of
    /// `complete` may access it, until `complete` has returned to its winner.
    pub unsafe fn into_raw(ds: &Dataset, pos: u64, ids: Vec<u64>, out: RawBuf) -> Result<Job> {
        ds.check_batch(&ids, out.len())?;
        Ok(Job::new(ds, pos, ids, out, None))
    }

    /// `ids` and `out` as `check_batch` passed them: `out` holds exactly `ids.len()` rows.
    fn new(ds: &Dataset, pos: u64, ids: Vec<u64>, out: RawBuf, owned: Option<Buffer>) -> Job {
        let rows = ids.len();
        let chunks = if ds.row_bytes() == 0 {
            0
        } else {
            rows.div_ceil(CHUNK_ROWS)
        };
        Job {
            pos,
            out,
            owned: Mutex::new(owned),
            row_bytes: ds.row_bytes(),
            rows,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sources: (0..rows).map(|_| AtomicUsize::new(0)).collect(),
            first_failed: AtomicUsize::new(usize::MAX),
            error: Mutex::new(None),
            won: AtomicBool::new(false),
            ids: Ids(UnsafeCell::new(ids)),
        }
    }

    /// Claims and decodes chunks until none is left; returns how many this call did. Any thread
    /// may call it, any number of times, at any point of the job's life: once every chunk is
    /// claimed it writes nothing.
    pub fn work(&self, ds: &Dataset) -> usize {
        let mut did = 0;
        loop {
            let c = self.next.fetch_add(1, Ordering::Relaxed);
            if c >= self.chunks {
                return did;
            }
            self.run_chunk(ds, c);
            did += 1;
        }
    }

    /// Reads chunk `c`, claimed by this thread, unless a lower chunk has failed.
    fn run_chunk(&self, ds: &Dataset, c: usize) {
        // Counted done however the chunk ends, even by a panic (then as failed), so waiters
        // never hang and a half-written chunk is never published.
        let _counted = Counted {
            job: self,
            chunk: c,
        };
        if c < self.first_failed.load(Ordering::Relaxed) {
            if let Err(e) = self.decode_chunk(ds, c) {
                self.fail(c, e);
            }
        }
    }

    fn decode_chunk(&self, ds: &Dataset, c: usize) -> Result<()> {
        let first = c * CHUNK_ROWS;
        let last = (first + CHUNK_ROWS).min(self.rows);
        let rb = self.row_bytes;
        // SAFETY: chunk c was claimed by this thread alone (fetch_add hands each index out once),
        // its rows [first, last) lie inside `out` (ids.len() * rb == out.len(): checked by
        // `pooled` against the buffer taken, by `into_raw` against the ring slot), and
        // `out` stays valid until the job completes, which needs this chunk counted done.
        let rows = unsafe {
            std::slice::from_raw_parts_mut(self.out.as_ptr().add(first * rb), (last - first) * rb)
        };
        // SAFETY: a claimant before counting its chunk done: the winner takes the ids only after.
        let ids = unsafe { self.ids.get() };
        let mut sources = [(0usize, false); CHUNK_ROWS];
        let sources = &mut sources[..last - first];
        ds.decode_rows(&ids[first..last], rows, sources)?;
        for (slot, &(r, mapped)) in self.sources[first..last].iter().zip(sources.iter()) {
            slot.store(r << 1 | mapped as usize, Ordering::Relaxed);
        }
        Ok(())
    }

    fn fail(&self, chunk: usize, e: Error) {
        self.first_failed.fetch_min(chunk, Ordering::Relaxed);
        let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(|(c, _)| chunk < *c) {
            *g = Some((chunk, e));
        }
    }

    /// Claims what is left (after a failed chunk, every higher one is only counted, never read)
    /// and waits until each claimant has counted its chunk: then nothing writes the buffer any
    /// more. For a thread that owns the buffer and unwinds out of `work` ([`DrainOnUnwind`]).
    pub fn drain(&self, ds: &Dataset) {
        self.work(ds);
        while !spin_until(|| self.finished()) {
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Every chunk has been claimed and decoded (or skipped after a lower chunk failed).
    fn finished(&self) -> bool {
        self.done.load(Ordering::Acquire) >= self.chunks
    }

    /// True once an owner has won `complete`: nothing is left to claim, and a thread waiting
    /// for the batch only waits for the winner to publish it.
    pub fn is_won(&self) -> bool {
        self.won.load(Ordering::Acquire)
    }

    /// True while this is the job of the batch at `pos` and nobody has won it: a consumer
    /// waiting for that batch claims its rows.
    pub fn open_at(&self, pos: u64) -> bool {
        self.pos == pos && !self.is_won()
    }

    /// Waits for the chunks other threads still have in flight (spinning, then sleeping in
    /// short steps), then returns the outcome to exactly one caller, the winner: the per-file
    /// check of the rows copied from mappings (and the re-read of a changed file's rows), the
    /// batch's ids or its error, and the pooled buffer. Every other caller gets None. Call
    /// after `work` has returned, so that every chunk is claimed and each claimant is a copy of
    /// at most `CHUNK_ROWS` rows away from counting it.
    pub fn complete(&self, ds: &Dataset) -> Option<Completed> {
        while !spin_until(|| self.finished()) {
            std::thread::sleep(Duration::from_micros(50));
        }
        if self.won.swap(true, Ordering::AcqRel) {
            return None;
        }
        let buffer = self.owned.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((_, e)) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Some(Completed {
                result: Err(e),
                buffer,
            });
        }
        let sources: Vec<RowSource> = self
            .sources
            .iter()
            .map(|s| {
                let v = s.load(Ordering::Relaxed);
                (v >> 1, v & 1 == 1)
            })
            .collect();
        // SAFETY: every chunk is done (Acquire above), so no claimant writes `out` or reads the
        // ids any more; only the winner gets here, once; the buffer stays valid until this
        // returns (a pooled one is owned by this call now, a ring slot stays Filling until its
        // winner finishes it).
        let (out, ids) = unsafe { (self.out.as_mut_slice(), self.ids.take()) };
        let result = ds.recheck(&ids, out, &sources).map(|()| ids);
        Some(Completed { result, buffer })
    }

    /// Starts `n` helpers on rayon's global pool, each claiming chunks of this job until none is
    /// left. They hold the job and the dataset, never complete the job, and a helper that
    /// starts after the last claim does nothing. (A panic in a helper aborts the process, as any
    /// panic in a `rayon::spawn` job does; the rows' code returns errors rather than panic.)
    pub fn spawn_helpers(self: &Arc<Self>, ds: &Arc<Dataset>, n: usize) {
        for _ in 0..n.min(self.chunks.saturating_sub(1)) {
            let (job, ds) = (self.clone(), ds.clone());
            rayon::spawn(move || {
                job.work(&ds);
            });
        }
    }
}

/// How many rayon helpers a prefetching stream starts per batch by default: the global pool's
/// threads beyond the two that the prefetch thread and a waiting consumer already are (none on
/// a 2-core machine). Called on the prefetch thread, which is in no pool, so it counts the pool
/// the helpers run in.
pub fn helpers() -> usize {
    rayon::current_num_threads().saturating_sub(2)
}

/// Drains `job` ([`Job::drain`]) if the thread holding this unwinds: a ring's prefetch thread
/// that panics inside `work` must not give up its slot (the ring resets once it is gone) while
/// rayon helpers may still be writing rows into it. The chunk that panicked is counted as
/// failed, so every chunk above it is skipped, and the drain reads nothing.
pub struct DrainOnUnwind<'a> {
    pub job: &'a Job,
    pub ds: &'a Dataset,
}

impl Drop for DrainOnUnwind<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.job.drain(self.ds);
        }
    }
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

/// What a consumer waiting for its batch finds on one look ([`Waiter::look`]).
pub enum Found<B, T> {
    /// The batch, or why there is none: the wait is over.
    Ready(B),
    /// The open job of the batch waited for (`Job::open_at`), with what the consumer needs to
    /// publish it should it complete the job itself (a ring slot).
    Open(Arc<Job>, T),
    /// Neither: the batch is being published, or its job not started yet.
    Pending,
}

/// Where a consumer of a prefetching stream (the pooled channel, or the ring) looks for the
/// batch it waits for, and how it publishes one it completed itself.
pub trait Waiter {
    type Batch;
    type Tag;
    /// One look. With `sleep`, a look that would find neither the batch nor its open job blocks
    /// until the prefetch thread changes something first.
    fn look(&mut self, sleep: bool) -> Found<Self::Batch, Self::Tag>;
    /// The batch of `job`, which this consumer completed (it won `Job::complete`).
    fn won(&mut self, job: &Job, tag: Self::Tag, done: Completed) -> Self::Batch;
}

/// The cooperative wait (module docs, design 2.3): a ready batch is taken; while the batch
/// waited for is being assembled, this thread claims its remaining rows and, if it finishes
/// first, completes and publishes it (`Waiter::won`); otherwise it spins, yielding between
/// looks, for at most `SPIN` since it last had something to do, and then sleeps in `look`.
pub fn wait_for<W: Waiter>(w: &mut W, ds: &Dataset) -> W::Batch {
    let mut since = Instant::now();
    loop {
        match w.look(since.elapsed() > SPIN) {
            Found::Ready(batch) => return batch,
            Found::Open(job, tag) => {
                job.work(ds);
                if let Some(done) = job.complete(ds) {
                    return w.won(&job, tag, done);
                }
                // The prefetch thread won it and publishes it: microseconds away, unless it
                // re-reads a changed file's rows (then this thread sleeps after the spin).
                since = Instant::now();
            }
            // The prefetch thread is between batches, or publishing one: microseconds away.
            Found::Pending => std::thread::yield_now(),
        }
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
        let ds = Dataset::open_with(&paths, &["ci8", "ci8"], &[None, None], 16, 16, policy);
        Arc::new(ds.unwrap())
    }

    fn pooled(ds: &Dataset, ids: &[u64]) -> Job {
        Job::pooled(ds, 7, ids.to_vec(), &BufferPool::new(1)).unwrap()
    }

    fn gathered(ds: &Dataset, ids: &[u64]) -> Vec<u8> {
        let mut want = vec![0u8; ids.len() * ds.row_bytes()];
        ds.gather(ids, &mut want).unwrap();
        want
    }

    /// The winner's batch bytes and ids, or its error.
    fn outcome(done: Completed) -> Result<(Vec<u8>, Vec<u64>)> {
        let Completed { result, buffer } = done;
        result.map(|ids| (buffer.unwrap().as_bytes_mut().to_vec(), ids))
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
                assert_eq!(job.chunks, 26); // 103 rows in chunks of 4, the last of 3
                job.spawn_helpers(&ds, 2);
                let (did, done): (Vec<usize>, Vec<Option<Completed>>) = std::thread::scope(|s| {
                    let hs: Vec<_> = (0..3)
                        .map(|_| {
                            s.spawn(|| {
                                let did = job.work(&ds);
                                (did, job.complete(&ds))
                            })
                        })
                        .collect();
                    hs.into_iter().map(|h| h.join().unwrap()).unzip()
                });
                assert!(did.iter().sum::<usize>() <= 26, "{did:?}"); // the rest: helpers
                assert!(job.is_won());
                let mut won: Vec<Completed> = done.into_iter().flatten().collect();
                assert_eq!(won.len(), 1, "exactly one winner");
                assert!(job.complete(&ds).is_none(), "won once only");
                assert_eq!(
                    outcome(won.pop().unwrap()).unwrap(),
                    (want.clone(), ids.clone()),
                    "mapped {mapped}"
                );
                assert_eq!(job.work(&ds), 0, "nothing is claimed after the end");
            }
        }
    }

    #[test]
    fn a_job_one_thread_finishes_alone_equals_gather() {
        let t = TempDir::new("job-alone");
        let ds = dataset(&t, 1024, true);
        let ids: Vec<u64> = vec![5, 0, 127, 64, 5];
        let job = pooled(&ds, &ids);
        assert!(!job.is_won());
        assert_eq!(job.work(&ds), 2);
        assert_eq!(job.work(&ds), 0, "nothing left to claim");
        let done = job.complete(&ds).unwrap();
        assert_eq!(outcome(done).unwrap(), (gathered(&ds, &ids), ids));
    }

    #[test]
    fn a_bad_batch_is_refused_before_any_row_is_written() {
        let t = TempDir::new("job-bad");
        let ds = dataset(&t, 1024, false);
        let pool = BufferPool::new(1);
        let mut given = Buffer::zeroed(ds.storage(), 2 * ds.row_elems()).unwrap();
        let at = given.as_bytes_mut().as_ptr();
        pool.give(given);
        let e = Job::pooled(&ds, 0, vec![0, ds.num_windows()], &pool).err();
        assert!(matches!(e, Some(Error::Index { .. })), "{e:?}");
        let mut kept = pool.take(ds.storage(), 2 * ds.row_elems()).unwrap();
        assert_eq!(
            kept.as_bytes_mut().as_ptr(),
            at,
            "the buffer stayed in the pool"
        );
        let mut three = Buffer::zeroed(ds.storage(), 3 * ds.row_elems()).unwrap();
        let bytes = three.as_bytes_mut();
        let out = RawBuf::new(bytes.as_mut_ptr(), bytes.len()).unwrap();
        // SAFETY: `three` outlives the job, which is refused before it writes anything.
        let e = unsafe { Job::into_raw(&ds, 0, vec![0, 1], out) }.err();
        assert!(
            matches!(e, Some(Error::Config { ref key, .. }) if key == "out"),
            "{e:?}"
        );
        assert!(
            three.as_bytes_mut().iter().all(|&b| b == 0),
            "no row written"
        );
    }

    #[test]
    fn the_error_reported_is_the_lowest_chunks_whoever_reads_it() {
        let t = TempDir::new("job-err");
        for mapped in [true, false] {
            let ds = dataset(&t, 1024, mapped);
            let per = ds.num_windows() / 2; // windows of recording 0, then of recording 1
                                            // Rows of recording 1 first (chunk 0), of recording 0 from chunk 1 on.
            let ids: Vec<u64> = (0..12).map(|k| if k < 4 { per + k } else { k }).collect();
            let paths: Vec<String> = ds.recordings().iter().map(|r| r.path.clone()).collect();
            let full: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
            for p in &paths {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(0).unwrap();
            }
            for round in 0..10 {
                let job = pooled(&ds, &ids);
                if round == 0 {
                    // Chunk 0 claimed first and read last, after chunk 1 failed (and chunk 2
                    // was skipped): it is still read, and its error is the one reported.
                    let c = job.next.fetch_add(1, Ordering::Relaxed);
                    assert_eq!(job.work(&ds), 2);
                    assert_eq!(job.first_failed.load(Ordering::Relaxed), 1);
                    job.run_chunk(&ds, c);
                } else {
                    std::thread::scope(|s| {
                        s.spawn(|| job.work(&ds));
                        job.work(&ds);
                    });
                }
                match job.complete(&ds).map(outcome) {
                    Some(Err(Error::LengthChanged { file, .. })) => assert_eq!(file, paths[1]),
                    other => panic!("mapped {mapped} round {round}: {other:?}"),
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
        let Completed { result, buffer } = job.complete(&ds).unwrap();
        assert!(buffer.is_some(), "the buffer goes back to its owner");
        let e = result.unwrap_err();
        assert!(
            matches!(e, Error::Internal(ref m) if m.contains("chunk 0")),
            "{e}"
        );
    }

    #[test]
    fn a_thread_unwinding_out_of_work_waits_for_every_chunk_and_reads_no_more() {
        let t = TempDir::new("job-drain");
        let ds = dataset(&t, 1024, false);
        let ids: Vec<u64> = (0..4 * CHUNK_ROWS as u64).collect();
        let job = pooled(&ds, &ids);
        let counted = AtomicBool::new(false);
        let first = job.next.fetch_add(1, Ordering::Relaxed); // chunk 0, claimed by a helper
        std::thread::scope(|s| {
            s.spawn(|| {
                // ... which is still writing it when the other thread panics.
                std::thread::sleep(Duration::from_millis(100));
                counted.store(true, Ordering::SeqCst);
                drop(Counted {
                    job: &job,
                    chunk: first,
                });
            });
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _drain = DrainOnUnwind { job: &job, ds: &ds };
                let c = job.next.fetch_add(1, Ordering::Relaxed); // chunk 1 ...
                let _counted = Counted {
                    job: &job,
                    chunk: c,
                };
                panic!("... dies while copying it");
            }));
            assert!(r.is_err());
            // The unwinding thread came out only once the helper's chunk was counted.
            assert!(counted.load(Ordering::SeqCst));
        });
        // Chunks 2 and 3 were claimed by the drain and counted without being read.
        assert!(job.finished() && job.next.load(Ordering::Relaxed) >= 4);
        let Completed { result, .. } = job.complete(&ds).unwrap();
        let e = result.unwrap_err();
        assert!(
            matches!(e, Error::Internal(ref m) if m.contains("chunk 1")),
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
