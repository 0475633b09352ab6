//! The global sample stream (docs/design.md section 2), rank slicing, batch buffers and the
//! prefetch thread.
//!
//! Global sample `g` is position `g % n` of epoch `g / n`; its window id is
//! `Permutation::new(n, seed, g / n).index(g % n)`. Global batch at position `pos` is samples
//! `[pos, pos + B)`; rank `r` of `W` takes `[pos + r·B/W, pos + (r+1)·B/W)`. The position is a
//! global sample count, so resuming with another world size or batch size continues at the next
//! unseen sample.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

pub(crate) use crate::aligned::bytes_mut;
pub use crate::aligned::{AlignedVec, Plain};
use crate::error::{Error, Result};
use crate::job::{self, Completed, Job};
use crate::permutation::Permutation;
use crate::recordings::{Dataset, Storage};
use crate::ring::{RawBuf, Ring};

/// Validated stream geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamSpec {
    pub n: u64,
    pub batch_size: u64,
    pub seed: u64,
    pub rank: u64,
    pub world_size: u64,
}

impl StreamSpec {
    pub fn new(n: u64, batch_size: u64, seed: u64, rank: u64, world_size: u64) -> Result<Self> {
        if n == 0 {
            return Err(Error::config("dataset", "has no windows"));
        }
        if batch_size < 1 {
            return Err(Error::config(
                "batch_size",
                format!("must be >= 1, got {batch_size}"),
            ));
        }
        if world_size < 1 {
            return Err(Error::config(
                "world_size",
                format!("must be >= 1, got {world_size}"),
            ));
        }
        if rank >= world_size {
            return Err(Error::config(
                "rank",
                format!("must be < world_size ({world_size}), got {rank}"),
            ));
        }
        if batch_size % world_size != 0 {
            return Err(Error::config(
                "batch_size",
                format!("{batch_size} is not divisible by world_size {world_size}"),
            ));
        }
        Ok(StreamSpec {
            n,
            batch_size,
            seed,
            rank,
            world_size,
        })
    }

    /// Rows this rank receives per batch: `B / W`.
    pub fn local_rows(&self) -> u64 {
        self.batch_size / self.world_size
    }

    /// Checks that the global batch starting at `pos` is addressable.
    pub fn check_pos(&self, pos: u64) -> Result<()> {
        match pos.checked_add(self.batch_size) {
            Some(_) => Ok(()),
            None => Err(Error::config(
                "samples_consumed",
                format!(
                    "{pos} leaves no room for a batch of {} below 2^64",
                    self.batch_size
                ),
            )),
        }
    }

    /// Window ids of this rank's slice of the global batch at sample position `pos`.
    pub fn batch_ids(&self, pos: u64) -> Result<Vec<u64>> {
        self.check_pos(pos)?;
        let rows = self.local_rows();
        let first = pos + self.rank * rows;
        let mut ids = Vec::new();
        ids.try_reserve_exact(rows as usize)
            .map_err(|_| Error::Alloc {
                what: "batch ids",
                bytes: rows as u128 * 8,
            })?;
        // One permutation per epoch touched (a batch may straddle several).
        let mut perm: Option<(u64, Permutation)> = None;
        for g in first..first + rows {
            let (epoch, at) = (g / self.n, g % self.n);
            let p = match &perm {
                Some((e, p)) if *e == epoch => p,
                _ => {
                    &perm
                        .insert((epoch, Permutation::new(self.n, self.seed, epoch)))
                        .1
                }
            };
            ids.push(p.index(at));
        }
        Ok(ids)
    }
}

/// An owned batch buffer in the storage dtype; handed to numpy without a copy.
#[derive(Debug, PartialEq)]
pub enum Buffer {
    I8(AlignedVec<i8>),
    I16(AlignedVec<i16>),
    F32(AlignedVec<f32>),
}

impl Buffer {
    pub fn zeroed(storage: Storage, elems: usize) -> Result<Buffer> {
        Ok(match storage {
            Storage::Int8 => Buffer::I8(AlignedVec::zeroed(elems)?),
            Storage::Int16 => Buffer::I16(AlignedVec::zeroed(elems)?),
            Storage::Float32 => Buffer::F32(AlignedVec::zeroed(elems)?),
        })
    }

    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Buffer::I8(v) => bytes_mut(v),
            Buffer::I16(v) => bytes_mut(v),
            Buffer::F32(v) => bytes_mut(v),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Buffer::I8(v) => v.len(),
            Buffer::I16(v) => v.len(),
            Buffer::F32(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn storage(&self) -> Storage {
        match self {
            Buffer::I8(_) => Storage::Int8,
            Buffer::I16(_) => Storage::Int16,
            Buffer::F32(_) => Storage::Float32,
        }
    }
}

/// Recycles batch buffers: reusing warm, already-mapped memory instead of faulting in fresh
/// zeroed pages saves about a quarter of a 2 MiB batch assembly. Every byte of a reused buffer
/// is overwritten, so recycling never changes batch contents.
#[derive(Debug)]
pub struct BufferPool {
    free: Mutex<Vec<Buffer>>,
    cap: usize,
}

impl BufferPool {
    pub fn new(cap: usize) -> BufferPool {
        BufferPool {
            free: Mutex::new(Vec::new()),
            cap,
        }
    }

    fn free(&self) -> std::sync::MutexGuard<'_, Vec<Buffer>> {
        // Holds only plain buffers: a panic elsewhere cannot leave them inconsistent.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A buffer of `elems` elements of `storage`: recycled if one fits, else freshly zeroed.
    pub fn take(&self, storage: Storage, elems: usize) -> Result<Buffer> {
        let reused = {
            let mut free = self.free();
            // Most recently returned first: likeliest to still be in cache.
            let at = free
                .iter()
                .rposition(|b| b.len() == elems && b.storage() == storage);
            at.map(|i| free.remove(i))
        };
        match reused {
            Some(b) => Ok(b),
            None => Buffer::zeroed(storage, elems),
        }
    }

    /// Returns a buffer for reuse (dropped when the pool is full).
    pub fn give(&self, buf: Buffer) {
        let mut free = self.free();
        if free.len() < self.cap {
            free.push(buf);
        }
    }
}

/// One assembled batch: this rank's rows of the global batch at `pos`.
#[derive(Debug)]
pub struct Batch {
    pub pos: u64,
    pub ids: Vec<u64>,
    pub data: Buffer,
}

/// Assembles the batch at `pos` into `out` (exactly one batch of bytes); returns its ids.
pub(crate) fn assemble_into(
    ds: &Dataset,
    spec: &StreamSpec,
    pos: u64,
    out: &mut [u8],
) -> Result<Vec<u64>> {
    let ids = spec.batch_ids(pos)?;
    ds.gather(&ids, out)?;
    Ok(ids)
}

/// Assembles the batch at `pos` synchronously (rows in parallel on rayon's pool).
pub fn assemble(ds: &Dataset, spec: &StreamSpec, pos: u64, pool: &BufferPool) -> Result<Batch> {
    let ids = spec.batch_ids(pos)?;
    let elems = ids
        .len()
        .checked_mul(ds.row_elems())
        .ok_or_else(|| Error::config("batch_size", "batch buffer exceeds the address space"))?;
    let mut data = pool.take(ds.storage(), elems)?;
    if let Err(e) = ds.gather(&ids, data.as_bytes_mut()) {
        pool.give(data);
        return Err(e);
    }
    Ok(Batch { pos, ids, data })
}

/// Starts the job of the batch at `pos` in a pooled buffer.
fn start_job(ds: &Dataset, spec: &StreamSpec, pos: u64, pool: &BufferPool) -> Result<Job> {
    let ids = spec.batch_ids(pos)?;
    let elems = ids
        .len()
        .checked_mul(ds.row_elems())
        .ok_or_else(|| Error::config("batch_size", "batch buffer exceeds the address space"))?;
    // Checked before a buffer is taken, so a bad batch costs the pool nothing.
    ds.check_batch(&ids, elems.saturating_mul(ds.storage().elem_bytes()))?;
    Job::pooled(ds, pos, ids, pool.take(ds.storage(), elems)?)
}

/// The winner's end of a pooled job (`Job::complete`): the batch, or its error with the buffer
/// back in the pool.
fn pooled_batch(job: &Job, (result, buffer): Completed, pool: &BufferPool) -> Result<Batch> {
    let data = buffer.ok_or_else(|| Error::Internal("a pooled batch without its buffer".into()))?;
    match result {
        Ok(()) => Ok(Batch {
            pos: job.pos,
            ids: job.ids.clone(),
            data,
        }),
        Err(e) => {
            pool.give(data);
            Err(e)
        }
    }
}

/// The batch a prefetch thread is assembling, for a waiting consumer to help with.
type Current = Arc<Mutex<Option<Arc<Job>>>>;

fn set_current(current: &Current, job: Option<Arc<Job>>) {
    // Holds only an Option<Arc>: a panic elsewhere cannot leave it inconsistent.
    *current.lock().unwrap_or_else(|e| e.into_inner()) = job;
}

/// Background thread assembling batches `start, start+B, ...` into a bounded channel. The
/// consumer, when no batch is ready, helps with the one being assembled (`job.rs`).
struct Worker {
    rx: Option<Receiver<Result<Batch>>>,
    stop: Arc<AtomicBool>,
    current: Current,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    fn spawn(
        ds: Arc<Dataset>,
        spec: StreamSpec,
        start: u64,
        depth: usize,
        pool: Arc<BufferPool>,
        helpers: Option<usize>,
    ) -> Result<Worker> {
        // Capacity depth-1 plus the batch blocked in send() = `depth` batches ready.
        let (tx, rx) = sync_channel::<Result<Batch>>(depth.saturating_sub(1));
        let stop = Arc::new(AtomicBool::new(false));
        let current: Current = Arc::new(Mutex::new(None));
        let (flag, shown) = (stop.clone(), current.clone());
        let handle = std::thread::Builder::new()
            .name("iqtrain-prefetch".into())
            .spawn(move || {
                let helpers = helpers.unwrap_or_else(job::helpers);
                let mut pos = start;
                while !flag.load(Ordering::Relaxed) {
                    let item = match start_job(&ds, &spec, pos, &pool) {
                        Ok(job) => {
                            let job = Arc::new(job);
                            set_current(&shown, Some(job.clone()));
                            job.spawn_helpers(&ds, helpers);
                            job.work(&ds);
                            set_current(&shown, None);
                            match job.complete(&ds) {
                                Some(done) => pooled_batch(&job, done, &pool),
                                None => {
                                    // The consumer completed it and took it (or its error,
                                    // and then drops this thread).
                                    pos += spec.batch_size;
                                    continue;
                                }
                            }
                        }
                        Err(e) => Err(e),
                    };
                    let failed = item.is_err();
                    // A dropped receiver (seek/drop) ends the thread.
                    if tx.send(item).is_err() || failed {
                        break;
                    }
                    // start_job() checked that pos + B fits.
                    pos += spec.batch_size;
                }
            })
            .map_err(|e| Error::Thread(format!("cannot be started ({e})")))?;
        Ok(Worker {
            rx: Some(rx),
            stop,
            current,
            handle: Some(handle),
        })
    }

    /// The batch at `pos`: a ready one, else the one being assembled, with this thread claiming
    /// its remaining rows (and completing it when it finishes first).
    fn next(&self, ds: &Dataset, pool: &BufferPool, pos: u64) -> Result<Batch> {
        let stopped = || Error::Thread("stopped unexpectedly".into());
        let rx = self.rx.as_ref().ok_or_else(stopped)?;
        let mut since = Instant::now();
        loop {
            match rx.try_recv() {
                Ok(item) => return item,
                Err(TryRecvError::Disconnected) => return Err(stopped()),
                Err(TryRecvError::Empty) => {}
            }
            let job = self
                .current
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some(job) = job.filter(|j| j.pos == pos && !j.is_won()) {
                job.work(ds);
                if let Some(done) = job.complete(ds) {
                    return pooled_batch(&job, done, pool);
                }
                // The prefetch thread completes it: its send is microseconds away.
                since = Instant::now();
            } else if since.elapsed() > job::SPIN {
                // Nothing to help with for a while (the thread is blocked, not started yet, or
                // re-reading a changed file's rows): sleep until the batch arrives.
                return rx.recv().unwrap_or_else(|_| Err(stopped()));
            }
            std::thread::yield_now();
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        drop(self.rx.take()); // unblocks a send() in progress
        if let Some(h) = self.handle.take() {
            let _ = h.join(); // at most one batch assembly away
        }
    }
}

/// A rank's view of the global stream, with optional prefetch. Output bytes depend only on
/// (dataset, spec, position), never on prefetch depth or thread count.
pub struct Stream {
    ds: Arc<Dataset>,
    spec: StreamSpec,
    prefetch: usize,
    pos: u64,
    last_ids: Vec<u64>,
    worker: Option<Worker>,
    pool: Arc<BufferPool>,
    /// Set by `use_ring`: batches go into caller-owned buffers (`next_slot`), not the pool.
    ring: Option<Ring>,
    /// Rayon helpers per prefetched batch (`job.rs`); None: `job::helpers()`, the global pool's
    /// threads beyond two, counted on the prefetch thread.
    helpers: Option<usize>,
}

impl Stream {
    pub fn new(
        ds: Arc<Dataset>,
        batch_size: u64,
        seed: u64,
        rank: u64,
        world_size: u64,
        prefetch: usize,
    ) -> Result<Stream> {
        let spec = StreamSpec::new(ds.num_windows(), batch_size, seed, rank, world_size)?;
        // Reject buffers that cannot exist before any thread starts.
        (spec.local_rows() as usize)
            .checked_mul(ds.row_bytes())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::config(
                    "batch_size",
                    format!(
                        "{batch_size} rows of {} bytes exceed the address space",
                        ds.row_bytes()
                    ),
                )
            })?;
        Ok(Stream {
            ds,
            spec,
            prefetch,
            pos: 0,
            last_ids: Vec::new(),
            worker: None,
            // Enough for the batches in flight plus a couple held by the consumer.
            pool: Arc::new(BufferPool::new(prefetch + 2)),
            ring: None,
            helpers: None,
        })
    }

    /// Starts `n` rayon helpers per prefetched batch instead of the default (tests: a 2-core
    /// machine has none by default). Takes effect when the prefetch thread next starts.
    #[cfg(test)]
    pub(crate) fn set_helpers(&mut self, n: usize) {
        self.helpers = Some(n);
        if let Some(r) = self.ring.as_mut() {
            r.set_helpers(n);
        }
    }

    /// Bytes of one batch of this rank (checked to fit in `new`).
    pub fn batch_bytes(&self) -> usize {
        self.spec.local_rows() as usize * self.ds.row_bytes()
    }

    /// From now on, assemble batches into the caller-owned `bufs` (see `ring.rs`) and hand them
    /// out with `next_slot`. Batches prefetched so far are dropped (they were not consumed);
    /// the position is unchanged. A previous ring is stopped (its thread joined) first.
    ///
    /// # Safety
    /// As `Ring::new`: while `keepalive` lives each buffer is valid for writes of its length,
    /// and nobody else accesses a buffer the ring owns (not yet returned, or released).
    pub unsafe fn use_ring(
        &mut self,
        bufs: Vec<RawBuf>,
        keepalive: Box<dyn std::any::Any + Send>,
    ) -> Result<()> {
        // SAFETY: forwarded to the caller.
        let mut ring = unsafe { Ring::new(bufs, self.batch_bytes(), self.prefetch, keepalive)? };
        ring.helpers = self.helpers;
        self.worker = None;
        self.ring = None; // joins the old ring's thread before the new one exists
        self.ring = Some(ring);
        Ok(())
    }

    /// Buffers in the ring (0 without one).
    pub fn ring_len(&self) -> usize {
        self.ring.as_ref().map_or(0, Ring::len)
    }

    /// As `next_batch`, into a ring buffer: the slot index, now held by the caller until
    /// `release(slot)`. Errors when all slots are held instead of waiting forever.
    pub fn next_slot(&mut self) -> Result<usize> {
        let ring = self
            .ring
            .as_mut()
            .ok_or_else(|| Error::config("ring", "no buffers: call use_ring(buffers) first"))?;
        let (slot, ids) = ring.next(&self.ds, &self.spec, self.pos)?;
        self.pos += self.spec.batch_size;
        self.last_ids = ids;
        Ok(slot)
    }

    /// The caller has finished reading ring buffer `slot`.
    pub fn release(&self, slot: usize) -> Result<()> {
        match &self.ring {
            Some(r) => r.release(slot),
            None => Err(Error::config(
                "ring",
                "no buffers: call use_ring(buffers) first",
            )),
        }
    }

    pub fn spec(&self) -> &StreamSpec {
        &self.spec
    }
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.ds
    }
    pub fn samples_consumed(&self) -> u64 {
        self.pos
    }
    /// Whole global batches consumed: `samples_consumed / batch_size`.
    pub fn batches_consumed(&self) -> u64 {
        self.pos / self.spec.batch_size
    }
    pub fn last_ids(&self) -> &[u64] {
        &self.last_ids
    }
    /// The pool that `next_batch` buffers come from; hand finished buffers back with `give`.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// This rank's rows of the global batch at the current position; advances by B.
    pub fn next_batch(&mut self) -> Result<Buffer> {
        if self.ring.is_some() {
            return Err(Error::config(
                "ring",
                "this stream fills caller buffers: use next_slot() and release()",
            ));
        }
        let batch = if self.prefetch == 0 {
            assemble(&self.ds, &self.spec, self.pos, &self.pool)?
        } else {
            let worker = match self.worker.take() {
                Some(w) => w,
                // Started lazily so a seek right after construction wastes no work.
                None => Worker::spawn(
                    self.ds.clone(),
                    self.spec,
                    self.pos,
                    self.prefetch,
                    self.pool.clone(),
                    self.helpers,
                )?,
            };
            let batch = match worker.next(&self.ds, &self.pool, self.pos) {
                Ok(b) if b.pos == self.pos => b,
                // Dropping the worker restarts it from this position on the next call.
                Ok(_) => return Err(Error::Thread("delivered a batch out of order".into())),
                Err(e) => return Err(e),
            };
            self.worker = Some(worker);
            batch
        };
        self.pos += self.spec.batch_size;
        self.last_ids = batch.ids;
        Ok(batch.data)
    }

    /// Drops prefetched batches; the next batch is global samples `[pos, pos + B)`.
    pub fn seek(&mut self, pos: u64) -> Result<()> {
        self.spec.check_pos(pos)?;
        self.worker = None;
        if let Some(r) = self.ring.as_mut() {
            r.reset(); // held slots stay with the caller
        }
        self.pos = pos;
        self.last_ids.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{open_plain, TempDir};

    /// ci16_le dataset whose sample k of recording r is (r*1000 + k, -(r*1000 + k)).
    fn dataset(t: &TempDir, lens: &[i32], window: u64, stride: u64) -> Arc<Dataset> {
        let paths: Vec<String> = lens
            .iter()
            .enumerate()
            .map(|(r, &len)| {
                let bytes: Vec<u8> = (0..len)
                    .flat_map(|k| {
                        let v = (r as i32 * 1000 + k) as i16;
                        [v.to_le_bytes(), (-v).to_le_bytes()].concat()
                    })
                    .collect();
                t.file(&format!("r{r}.sigmf-data"), &bytes)
            })
            .collect();
        Arc::new(open_plain(&paths, &vec!["ci16_le"; paths.len()], window, stride).unwrap())
    }

    fn take(s: &mut Stream, k: usize) -> Vec<(Vec<u64>, Buffer)> {
        (0..k)
            .map(|_| {
                let b = s.next_batch().unwrap();
                (s.last_ids().to_vec(), b)
            })
            .collect()
    }

    #[test]
    fn spec_validation() {
        assert!(
            matches!(StreamSpec::new(10, 0, 0, 0, 1), Err(Error::Config { ref key, .. }) if key == "batch_size")
        );
        assert!(
            matches!(StreamSpec::new(10, 6, 0, 0, 4), Err(Error::Config { ref key, .. }) if key == "batch_size")
        );
        assert!(
            matches!(StreamSpec::new(10, 8, 0, 4, 4), Err(Error::Config { ref key, .. }) if key == "rank")
        );
        assert!(
            matches!(StreamSpec::new(10, 8, 0, 0, 0), Err(Error::Config { ref key, .. }) if key == "world_size")
        );
        let s = StreamSpec::new(10, 8, 0, 0, 1).unwrap();
        assert!(
            matches!(s.batch_ids(u64::MAX - 3), Err(Error::Config { ref key, .. }) if key == "samples_consumed")
        );
    }

    #[test]
    fn epochs_cover_every_window_once_and_batches_straddle() {
        let spec = StreamSpec::new(37, 8, 5, 0, 1).unwrap();
        // 37 * 8 samples = exactly 8 epochs; batch 4 straddles epochs 0 and 1 (samples 32..40).
        let all: Vec<u64> = (0..37)
            .flat_map(|k| spec.batch_ids(k * 8).unwrap())
            .collect();
        for e in 0..8 {
            let mut ep: Vec<u64> = all[e * 37..(e + 1) * 37].to_vec();
            let p = Permutation::new(37, 5, e as u64);
            assert_eq!(ep, (0..37).map(|i| p.index(i)).collect::<Vec<_>>());
            ep.sort_unstable();
            assert_eq!(ep, (0..37).collect::<Vec<_>>());
        }
        assert_ne!(all[..37], all[37..74]);
    }

    #[test]
    fn seek_equals_iteration_and_prefetch_is_invisible() {
        let t = TempDir::new("seek");
        let ds = dataset(&t, &[50, 3, 71, 20], 8, 5);
        let n = ds.num_windows();
        assert_eq!(n, 9 + 13 + 3);
        let mut reference = Stream::new(ds.clone(), 6, 42, 0, 1, 0).unwrap();
        let want = take(&mut reference, 20); // 120 samples: several epochs, straddling batches
        assert_eq!(reference.samples_consumed(), 120);
        assert_eq!(reference.batches_consumed(), 20);
        for depth in [1usize, 2, 5] {
            let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
            assert!(s.last_ids().is_empty());
            assert_eq!(take(&mut s, 20), want, "prefetch {depth}");
        }
        // Recycled (scribbled-on) buffers never leak into later batches.
        for depth in [0usize, 3] {
            let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
            for (k, w) in want.iter().enumerate() {
                let mut b = s.next_batch().unwrap();
                assert_eq!((s.last_ids(), &b), (&w.0[..], &w.1), "k={k} depth={depth}");
                b.as_bytes_mut().fill(0x55);
                s.pool().give(b);
            }
        }
        for k in [0usize, 1, 4, 7, 19] {
            for depth in [0usize, 2] {
                let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
                take(&mut s, 3); // seek must drop whatever was prefetched
                s.seek(6 * k as u64).unwrap();
                assert!(s.last_ids().is_empty());
                assert_eq!(s.batches_consumed(), k as u64);
                assert_eq!(take(&mut s, 1)[0], want[k], "k={k} depth={depth}");
            }
        }
        // Each row is the window its id names.
        let (ids, buf) = &want[0];
        let Buffer::I16(v) = buf else { panic!("dtype") };
        for (j, &id) in ids.iter().enumerate() {
            let mut row = vec![0u8; ds.row_bytes()];
            ds.fill_row(id, &mut row).unwrap();
            let row: Vec<i16> = row
                .chunks_exact(2)
                .map(|c| i16::from_ne_bytes([c[0], c[1]]))
                .collect();
            assert_eq!(&v[j * 16..(j + 1) * 16], &row[..]);
        }
    }

    #[test]
    fn rank_slices_concatenate_to_the_global_batch() {
        let t = TempDir::new("ranks");
        let ds = dataset(&t, &[64, 40], 4, 3);
        let mut one = Stream::new(ds.clone(), 8, 9, 0, 1, 0).unwrap();
        let want = take(&mut one, 12);
        for w in [1u64, 2, 4] {
            let mut ranks: Vec<Stream> = (0..w)
                .map(|r| Stream::new(ds.clone(), 8, 9, r, w, 2).unwrap())
                .collect();
            for (k, (ids, buf)) in want.iter().enumerate() {
                let mut cat_ids = Vec::new();
                let mut cat = Vec::new();
                for s in ranks.iter_mut() {
                    let Buffer::I16(v) = s.next_batch().unwrap() else {
                        panic!("dtype")
                    };
                    cat_ids.extend_from_slice(s.last_ids());
                    cat.extend_from_slice(&v);
                }
                assert_eq!(&cat_ids, ids, "W={w} batch {k}");
                let Buffer::I16(want) = buf else {
                    panic!("dtype")
                };
                assert_eq!(&cat[..], &want[..], "W={w} batch {k}");
            }
        }
        // A cursor saved at W=4 resumes at W=2 (and at another batch size) on the next sample.
        let mut w4: Vec<Stream> = (0..4)
            .map(|r| Stream::new(ds.clone(), 8, 9, r, 4, 1).unwrap())
            .collect();
        for s in w4.iter_mut() {
            take(s, 5);
        }
        let cursor = w4[0].samples_consumed();
        assert_eq!(cursor, 40);
        let mut w2: Vec<Stream> = (0..2)
            .map(|r| Stream::new(ds.clone(), 8, 9, r, 2, 2).unwrap())
            .collect();
        let mut ids = Vec::new();
        for s in w2.iter_mut() {
            s.seek(cursor).unwrap();
            s.next_batch().unwrap();
            ids.extend_from_slice(s.last_ids());
        }
        assert_eq!(ids, want[5].0);
        let mut b4 = Stream::new(ds.clone(), 4, 9, 0, 1, 0).unwrap();
        b4.seek(cursor + 4).unwrap();
        b4.next_batch().unwrap();
        assert_eq!(b4.last_ids(), &want[5].0[4..]);
    }

    #[test]
    fn huge_sparse_dataset_opens_fast() {
        let t = TempDir::new("sparse");
        // 2^31 ci8 samples (4 GiB sparse), window 2, stride 2: 2^30 > 10^9 windows.
        let p = t.0.join("big.sigmf-data");
        let f = std::fs::File::create(&p).unwrap();
        f.set_len(1u64 << 32).unwrap();
        let start = std::time::Instant::now();
        let ds = Arc::new(open_plain(&[p.to_str().unwrap()], &["ci8"], 2, 2).unwrap());
        assert_eq!(ds.num_windows(), 1 << 30);
        let mut s = Stream::new(ds, 256, 1, 0, 1, 2).unwrap();
        let Buffer::I8(v) = s.next_batch().unwrap() else {
            panic!("dtype")
        };
        assert_eq!(v.len(), 256 * 4);
        assert!(s.last_ids().iter().all(|&i| i < 1 << 30));
        assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
    }

    #[test]
    fn a_truncated_file_fails_the_batch_from_the_prefetch_thread_and_recovers() {
        let t = TempDir::new("stream-trunc");
        let ds = dataset(&t, &[400], 4, 4); // one ci16 recording, 100 windows
        let path = ds.recordings()[0].path.clone();
        let full = std::fs::read(&path).unwrap();
        let mut reference = Stream::new(ds.clone(), 8, 3, 0, 1, 0).unwrap();
        let want = take(&mut reference, 12);
        for depth in [0usize, 1, 3] {
            std::fs::write(&path, &full).unwrap();
            let mut s = Stream::new(ds.clone(), 8, 3, 0, 1, depth).unwrap();
            take(&mut s, 2); // the prefetch thread is running and has batches queued
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            // Batches assembled before the truncation may still arrive; then the error does.
            let mut failed_at = None;
            for _ in 0..=depth + 1 {
                let pos = s.samples_consumed();
                match s.next_batch() {
                    Ok(_) => {}
                    Err(e) => {
                        let Error::LengthChanged { file, found, .. } = &e else {
                            panic!("depth {depth}: {e}")
                        };
                        assert_eq!((file, *found), (&path, 0));
                        assert_eq!(s.samples_consumed(), pos, "a failed batch is not consumed");
                        failed_at = Some(pos);
                        break;
                    }
                }
            }
            let pos = failed_at.unwrap_or_else(|| panic!("depth {depth}: no error"));
            std::fs::write(&path, &full).unwrap();
            // The same stream continues with exactly the batch that failed.
            let k = (pos / 8) as usize;
            let got = s.next_batch().unwrap();
            assert_eq!(
                (s.last_ids(), &got),
                (&want[k].0[..], &want[k].1),
                "depth {depth}"
            );
        }
    }

    /// Many batches with the consumer always waiting (it claims rows of the batch being
    /// assembled, and completes it when it finishes first): pooled and ring batches equal the
    /// synchronous ones, from mapped files and with pread, with and without rayon helpers.
    #[test]
    fn cooperative_assembly_equals_synchronous_assembly() {
        let t = TempDir::new("coop");
        let paths: Vec<String> = (0..3)
            .map(|r| {
                let bytes: Vec<u8> = (0..40_000u32).map(|k| (k * 13 + r * 7) as u8).collect();
                t.file(&format!("r{r}.sigmf-data"), &bytes)
            })
            .collect();
        let caps = vec![[0u64]; 3];
        for map_min_bytes in [0, u64::MAX] {
            let policy = crate::recordings::ReadPolicy {
                map_min_bytes,
                ..Default::default()
            };
            let ds = Dataset::open_with(&paths, &["ci16_le"; 3], &caps, 64, 48, policy);
            let ds = Arc::new(ds.unwrap());
            let mut reference = Stream::new(ds.clone(), 24, 5, 0, 1, 0).unwrap();
            let want = take(&mut reference, 150);
            for helpers in [None, Some(2)] {
                for depth in [1usize, 2, 3] {
                    let mut s = Stream::new(ds.clone(), 24, 5, 0, 1, depth).unwrap();
                    if let Some(n) = helpers {
                        s.set_helpers(n);
                    }
                    for (k, (ids, buf)) in take(&mut s, 150).iter().zip(&want).enumerate() {
                        assert_eq!((&ids.0, &ids.1), (&buf.0, &buf.1), "k={k} d={depth}");
                    }
                    let mut s = Stream::new(ds.clone(), 24, 5, 0, 1, depth).unwrap();
                    let (mem, raw) = ring_bufs(&s, depth + 1);
                    // SAFETY: `mem` outlives `s` (dropped after it).
                    unsafe { s.use_ring(raw, Box::new(())).unwrap() };
                    if let Some(n) = helpers {
                        s.set_helpers(n);
                    }
                    for (k, (ids, buf)) in want.iter().enumerate() {
                        let slot = s.next_slot().unwrap();
                        let Buffer::I16(w) = buf else { panic!("dtype") };
                        assert_eq!(s.last_ids(), &ids[..], "ring k={k} d={depth}");
                        assert_eq!(as_i16(&mem[slot]), &w[..], "ring k={k} d={depth}");
                        s.release(slot).unwrap();
                    }
                    drop(s);
                    drop(mem); // a helper still queued then claims nothing: it writes nothing
                }
            }
        }
    }

    /// `k` aligned batch buffers for `s` and their RawBufs.
    fn ring_bufs(s: &Stream, k: usize) -> (Vec<AlignedVec<u8>>, Vec<RawBuf>) {
        let mut mem: Vec<AlignedVec<u8>> = (0..k)
            .map(|_| AlignedVec::zeroed(s.batch_bytes()).unwrap())
            .collect();
        let raw = mem
            .iter_mut()
            .map(|m| RawBuf::new(m.as_mut_ptr(), m.len()).unwrap())
            .collect();
        (mem, raw)
    }

    fn as_i16(bytes: &[u8]) -> Vec<i16> {
        bytes
            .chunks_exact(2)
            .map(|c| i16::from_ne_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn ring_batches_equal_pooled_batches_while_slots_are_held() {
        let t = TempDir::new("ring");
        let ds = dataset(&t, &[50, 3, 71, 20], 8, 5);
        let mut reference = Stream::new(ds.clone(), 6, 42, 0, 1, 0).unwrap();
        let want = take(&mut reference, 24);
        for (depth, nbuf, hold) in [
            (0usize, 1usize, 1usize),
            (0, 3, 3),
            (1, 2, 1),
            (2, 3, 1),
            (2, 5, 3),
            (4, 5, 1),
        ] {
            let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
            let (mut mem, raw) = ring_bufs(&s, nbuf);
            // SAFETY: `mem` outlives `s` (dropped after it, below); slots are read only while
            // held and scribbled on just before release.
            unsafe { s.use_ring(raw, Box::new(())).unwrap() };
            assert!(s.next_batch().is_err(), "next_batch with a ring");
            let mut held = Vec::new();
            for (k, (ids, buf)) in want.iter().enumerate() {
                let slot = s.next_slot().unwrap();
                assert_eq!(s.last_ids(), &ids[..], "k={k} depth={depth}");
                let Buffer::I16(w) = buf else { panic!("dtype") };
                assert_eq!(as_i16(&mem[slot]), &w[..], "k={k} depth={depth}");
                held.push(slot);
                if held.len() == hold {
                    // Release out of order, scribbling first: nothing leaks into later batches.
                    for &h in held.iter().rev() {
                        mem[h].fill(0x55);
                        s.release(h).unwrap();
                    }
                    held.clear();
                }
            }
            drop(s);
            drop(mem);
        }
    }

    #[test]
    fn ring_errors_instead_of_deadlock_and_seek_discards_prefetched() {
        let t = TempDir::new("ring-err");
        let ds = dataset(&t, &[64, 40], 4, 3);
        let mut reference = Stream::new(ds.clone(), 4, 9, 0, 1, 0).unwrap();
        let want = take(&mut reference, 10);
        for depth in [0usize, 2] {
            let mut s = Stream::new(ds.clone(), 4, 9, 0, 1, depth).unwrap();
            assert!(s.next_slot().is_err(), "no ring yet");
            assert!(s.release(0).is_err(), "no ring yet");
            let (mem, raw) = ring_bufs(&s, depth + 1);
            // SAFETY: `mem` outlives `s`.
            unsafe { s.use_ring(raw, Box::new(())).unwrap() };
            let mut held = Vec::new();
            for _ in 0..=depth {
                held.push(s.next_slot().unwrap());
            }
            let e = s.next_slot().unwrap_err().to_string();
            assert!(e.contains("all") && e.contains("held"), "{e}");
            assert_eq!(s.samples_consumed(), 4 * (depth as u64 + 1));
            assert!(s.release(held[0]).is_ok());
            assert!(s.release(held[0]).is_err(), "double release");
            assert!(s.release(depth + 1).is_err(), "out of range");
            // Seek drops prefetched batches; slots still held stay held.
            s.seek(4 * 7).unwrap();
            let slot = s.next_slot().unwrap();
            let Buffer::I16(w) = &want[7].1 else {
                panic!("dtype")
            };
            assert_eq!(
                (s.last_ids(), as_i16(&mem[slot])),
                (&want[7].0[..], w.to_vec())
            );
            for &h in &held[1..] {
                s.release(h).unwrap();
            }
            s.release(slot).unwrap();
            let slot = s.next_slot().unwrap();
            assert_eq!(s.last_ids(), &want[8].0[..]);
            let Buffer::I16(w) = &want[8].1 else {
                panic!("dtype")
            };
            assert_eq!(as_i16(&mem[slot]), w.to_vec());
            drop(s);
            drop(mem);
        }
    }

    #[test]
    fn a_truncated_file_fails_a_ring_batch_and_recovers() {
        let t = TempDir::new("ring-trunc");
        let ds = dataset(&t, &[400], 4, 4);
        let path = ds.recordings()[0].path.clone();
        let full = std::fs::read(&path).unwrap();
        let mut reference = Stream::new(ds.clone(), 8, 3, 0, 1, 0).unwrap();
        let want = take(&mut reference, 12);
        for depth in [0usize, 1, 3] {
            std::fs::write(&path, &full).unwrap();
            let mut s = Stream::new(ds.clone(), 8, 3, 0, 1, depth).unwrap();
            let (mem, raw) = ring_bufs(&s, depth + 2);
            // SAFETY: `mem` outlives `s`.
            unsafe { s.use_ring(raw, Box::new(())).unwrap() };
            for _ in 0..2 {
                let slot = s.next_slot().unwrap();
                s.release(slot).unwrap();
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .unwrap()
                .set_len(0)
                .unwrap();
            let mut failed_at = None;
            for _ in 0..=depth + 1 {
                let pos = s.samples_consumed();
                match s.next_slot() {
                    Ok(slot) => s.release(slot).unwrap(),
                    Err(e) => {
                        assert!(matches!(e, Error::LengthChanged { found: 0, .. }), "{e}");
                        assert_eq!(s.samples_consumed(), pos);
                        failed_at = Some(pos);
                        break;
                    }
                }
            }
            let pos = failed_at.unwrap_or_else(|| panic!("depth {depth}: no error"));
            std::fs::write(&path, &full).unwrap();
            let k = (pos / 8) as usize;
            let slot = s.next_slot().unwrap();
            let Buffer::I16(w) = &want[k].1 else {
                panic!("dtype")
            };
            assert_eq!(
                (s.last_ids(), as_i16(&mem[slot])),
                (&want[k].0[..], w.to_vec())
            );
            drop(s);
            drop(mem);
        }
    }
}
