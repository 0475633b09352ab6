//! One batch's assembly as a shared job (docs/design.md "Assembly, prefetch, ring"): its rows
//! split in chunks that any thread may claim from one counter.
//!
//! Why: handing a batch from one thread to another costs a wake-up, about 50 µs on the 2-core
//! development machine (bench/results/loader_cpu_2026-12-02.md), a quarter of a 256-row batch's
//! copy. So the prefetch thread does not hand its batch over and sleep, and the consumer does
//! not sleep while the batch it waits for is unfinished: both claim chunks of the same job, and
//! nobody waits for a wake-up while rows are left to copy. On machines with more than two
//! threads in rayon's pool, helpers on that pool claim chunks too (`helpers`).
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
//!    (`Dataset::recheck`), gets the outcome, and publishes the batch; the other gets nothing.
//!    Helpers never complete a job.
//!
//! So the buffer is written only by claimants of distinct chunks before the job completes, and by
//! the winner (the re-read of a changed file's rows) inside `complete`; the batch's outcome
//! leaves the job only through its winner, and its ring slot stays `Filling` until then.
//!
//! The consumer's side is [`wait_for`]: take a ready batch, else claim rows of the open job of
//! the batch it waits for, else spin briefly, else sleep until the prefetch thread changes
//! something.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::buffer::RawBuf;
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

/// One batch being assembled (see the module docs).
pub struct Job {
    pub pos: u64,
    /// The batch's window ids, row by row; read by the claimants of its chunks, copied out by
    /// the winner of `complete`.
    ids: Vec<u64>,
    /// The batch buffer, exactly `rows * row_bytes` long; see `Job::new` for who may write it.
    out: RawBuf,
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
}

impl Job {
    /// A job filling `out` with the batch of `ids` at `pos`; the ids and the buffer's length
    /// are checked first (an error then writes nothing).
    ///
    /// # Safety
    /// `out` must be valid for writes of its length, and nobody but this job may read or write
    /// it, from this call until the job is finished with it: until a `complete` has returned
    /// to its winner, or, for a job nobody completes, until `drain` has returned (both wait for
    /// every claimed chunk to be counted done). After that the job writes `out` no more: a
    /// `work` then claims nothing, and a second `complete` reads nothing.
    pub unsafe fn new(ds: &Dataset, pos: u64, ids: Vec<u64>, out: RawBuf) -> Result<Job> {
        ds.check_batch(&ids, out.len())?;
        // `check_batch` passed: `out` holds exactly `ids.len()` rows.
        let rows = ids.len();
        let chunks = if ds.row_bytes() == 0 {
            0
        } else {
            rows.div_ceil(CHUNK_ROWS)
        };
        Ok(Job {
            pos,
            ids,
            out,
            row_bytes: ds.row_bytes(),
            rows,
            chunks,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            sources: (0..rows).map(|_| AtomicUsize::new(0)).collect(),
            first_failed: AtomicUsize::new(usize::MAX),
            error: Mutex::new(None),
            won: AtomicBool::new(false),
        })
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
        // SAFETY: `Job::new`'s caller lets only this job touch `out` until the job is finished
        // with it, which cannot happen before this chunk is counted done (`complete` and `drain`
        // wait for that). Within the job, rows [first, last) belong to chunk c alone, which this
        // thread claimed (fetch_add hands each index out once), and the winner of `complete`
        // writes only after every chunk is counted; so these bytes have one writer and no
        // reader while the slice lives. `slice_mut` checks the range against `out`.
        let rows = unsafe { self.out.slice_mut(first * rb, (last - first) * rb) };
        let mut sources = [(0usize, false); CHUNK_ROWS];
        let sources = &mut sources[..last - first];
        ds.decode_rows(&self.ids[first..last], rows, sources)?;
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
    /// check of the rows copied from mappings (and the re-read of a changed file's rows), and
    /// the batch's ids or its error. Every other caller gets None. Call after `work` has
    /// returned, so that every chunk is claimed and each claimant is a copy of at most
    /// `CHUNK_ROWS` rows away from counting it.
    pub fn complete(&self, ds: &Dataset) -> Option<Completed> {
        while !spin_until(|| self.finished()) {
            std::thread::sleep(Duration::from_micros(50));
        }
        if self.won.swap(true, Ordering::AcqRel) {
            return None;
        }
        if let Some((_, e)) = self.error.lock().unwrap_or_else(|p| p.into_inner()).take() {
            return Some(Completed { result: Err(e) });
        }
        let sources: Vec<RowSource> = self
            .sources
            .iter()
            .map(|s| {
                let v = s.load(Ordering::Relaxed);
                (v >> 1, v & 1 == 1)
            })
            .collect();
        // SAFETY: `Job::new`'s caller lets only this job touch `out` until a `complete` has
        // returned to its winner, and this is that call, still running. Within the job, every
        // chunk is counted done (the Acquire load in `finished` pairs with each claimant's
        // Release), so no claimant writes `out` any more and none will (a later claim is past
        // the last chunk); `won.swap` let exactly one caller through, so this is the only
        // borrow.
        let out = unsafe { self.out.slice_mut(0, self.out.len()) };
        let result = ds
            .recheck(&self.ids, out, &sources)
            .map(|()| self.ids.clone());
        Some(Completed { result })
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

/// Where a consumer of a prefetching ring looks for the batch it waits for, and how it
/// publishes one it completed itself.
pub trait Waiter {
    type Batch;
    type Tag;
    /// One look. With `sleep`, a look that would find neither the batch nor its open job blocks
    /// until the prefetch thread changes something first.
    fn look(&mut self, sleep: bool) -> Found<Self::Batch, Self::Tag>;
    /// The batch of `job`, which this consumer completed (it won `Job::complete`).
    fn won(&mut self, job: &Job, tag: Self::Tag, done: Completed) -> Self::Batch;
}

/// The cooperative wait (module docs): a ready batch is taken; while the batch
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
    use crate::io::AlignedVec;
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

    /// A job (at position 7) filling a zeroed buffer of `rows` rows of its own. Dropping it
    /// drains the job before the buffer is freed, so a rayon helper still holding the job
    /// writes nothing after that.
    struct Owned {
        job: Arc<Job>,
        ds: Arc<Dataset>,
        buf: AlignedVec<u8>,
    }

    impl Owned {
        fn new(ds: &Arc<Dataset>, ids: &[u64], rows: usize) -> Result<Owned> {
            let mut buf = AlignedVec::<u8>::zeroed(rows * ds.row_bytes()).unwrap();
            let out = RawBuf::new(buf.as_mut_ptr(), buf.len()).unwrap();
            // SAFETY: `buf` is fresh and nothing else refers to it. It moves into the Owned
            // beside the job (its heap block stays where it is), which reads it only through
            // `bytes`, once a `complete` has returned to its winner, and frees it only after
            // `drop` has drained the job.
            let job = unsafe { Job::new(ds, 7, ids.to_vec(), out) }?;
            Ok(Owned {
                job: Arc::new(job),
                ds: ds.clone(),
                buf,
            })
        }

        /// The batch bytes; called only after the winner's `complete` has returned (every
        /// chunk counted, the re-check done), when nothing writes them any more.
        fn bytes(&self) -> Vec<u8> {
            assert!(self.job.finished() && self.job.is_won());
            self.buf.to_vec()
        }
    }

    impl Drop for Owned {
        fn drop(&mut self) {
            self.job.drain(&self.ds);
        }
    }

    fn job(ds: &Arc<Dataset>, ids: &[u64]) -> Owned {
        Owned::new(ds, ids, ids.len()).unwrap()
    }

    fn gathered(ds: &Dataset, ids: &[u64]) -> Vec<u8> {
        let mut want = vec![0u8; ids.len() * ds.row_bytes()];
        ds.gather(ids, &mut want).unwrap();
        want
    }

    /// The winner's batch bytes and ids, or its error.
    fn outcome(o: &Owned, done: Completed) -> Result<(Vec<u8>, Vec<u64>)> {
        done.result.map(|ids| (o.bytes(), ids))
    }

    #[test]
    fn threads_claim_every_chunk_once_and_one_completes() {
        let t = TempDir::new("job");
        for mapped in [true, false] {
            let ds = dataset(&t, 4096, mapped);
            let ids: Vec<u64> = (0..103).map(|k| (k * 37) % ds.num_windows()).collect();
            let want = gathered(&ds, &ids);
            for _ in 0..20 {
                let o = job(&ds, &ids);
                let job = &o.job;
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
                    outcome(&o, won.pop().unwrap()).unwrap(),
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
        let o = job(&ds, &ids);
        assert!(!o.job.is_won());
        assert_eq!(o.job.work(&ds), 2);
        assert_eq!(o.job.work(&ds), 0, "nothing left to claim");
        let done = o.job.complete(&ds).unwrap();
        assert_eq!(outcome(&o, done).unwrap(), (gathered(&ds, &ids), ids));
    }

    #[test]
    fn a_bad_batch_is_refused_before_any_row_is_written() {
        let t = TempDir::new("job-bad");
        let ds = dataset(&t, 1024, false);
        let e = Owned::new(&ds, &[0, ds.num_windows()], 2).err();
        assert!(matches!(e, Some(Error::Index { .. })), "{e:?}");
        let e = Owned::new(&ds, &[0, 1], 3).err();
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
                                            // Rows of recording 1 first (chunk 0), of recording 0 from chunk 1 on.
            let ids: Vec<u64> = (0..12).map(|k| if k < 4 { per + k } else { k }).collect();
            let paths: Vec<String> = ds.recordings().iter().map(|r| r.path.clone()).collect();
            let full: Vec<Vec<u8>> = paths.iter().map(|p| std::fs::read(p).unwrap()).collect();
            for p in &paths {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(0).unwrap();
            }
            for round in 0..10 {
                let o = job(&ds, &ids);
                let job = o.job.as_ref();
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
                match job.complete(&ds).map(|d| outcome(&o, d)) {
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
        let o = job(&ds, &[0, 1, 2, 3, 4, 5]);
        let job = o.job.as_ref();
        let c = job.next.fetch_add(1, Ordering::Relaxed); // a claimant takes chunk 0 ...
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _counted = Counted { job, chunk: c };
            panic!("... and dies while copying it");
        }));
        assert!(r.is_err());
        job.work(&ds);
        let Completed { result } = job.complete(&ds).unwrap();
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
        let o = job(&ds, &ids);
        let job = o.job.as_ref();
        let counted = AtomicBool::new(false);
        let first = job.next.fetch_add(1, Ordering::Relaxed); // chunk 0, claimed by a helper
        std::thread::scope(|s| {
            s.spawn(|| {
                // ... which is still writing it when the other thread panics.
                std::thread::sleep(Duration::from_millis(100));
                counted.store(true, Ordering::SeqCst);
                drop(Counted { job, chunk: first });
            });
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let _drain = DrainOnUnwind { job, ds: &ds };
                let c = job.next.fetch_add(1, Ordering::Relaxed); // chunk 1 ...
                let _counted = Counted { job, chunk: c };
                panic!("... dies while copying it");
            }));
            assert!(r.is_err());
            // The unwinding thread came out only once the helper's chunk was counted.
            assert!(counted.load(Ordering::SeqCst));
        });
        // Chunks 2 and 3 were claimed by the drain and counted without being read.
        assert!(job.finished() && job.next.load(Ordering::Relaxed) >= 4);
        let Completed { result } = job.complete(&ds).unwrap();
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
