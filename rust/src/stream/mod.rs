//! The global sample stream (docs/design.md "The sample stream and its cursor"): a rank's
//! batches in order, assembled into a ring of buffers (`ring`), the caller's or the stream's
//! own, synchronously or by a prefetch thread, each prefetched batch a job any thread may help
//! with (`job`).
//!
//! Modules import one way: `Stream` (here) uses `ring`, which uses `job` and `spec` (the
//! geometry and synchronous assembly); all of them use `buffer` (the batch buffers), and `job`
//! uses only `buffer` and the dataset.
//!
//! Global sample `g` is position `g % n` of epoch `g / n`; its window id is
//! `Permutation::new(n, seed, g / n).index(g % n)`. Global batch at position `pos` is samples
//! `[pos, pos + B)`; rank `r` of `W` takes `[pos + r·B/W, pos + (r+1)·B/W)`. The position is a
//! global sample count, so resuming with another world size or batch size continues at the next
//! unseen sample.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::recordings::Dataset;

mod buffer;
mod job;
mod ring;
mod spec;
#[cfg(test)]
mod tests;

pub use buffer::{Buffer, BufferPool, RawBuf};
pub use ring::{Ring, Slots};
pub use spec::StreamSpec;

/// A rank's view of the global stream, with optional prefetch. Output bytes depend only on
/// (dataset, spec, position), never on prefetch depth or thread count.
pub struct Stream {
    ds: Arc<Dataset>,
    spec: StreamSpec,
    prefetch: usize,
    pos: u64,
    last_ids: Vec<u64>,
    /// Where batches are assembled: the caller's buffers (set by `use_ring`, read with
    /// `next_slot`), or a ring of the stream's own (started by the first `next_batch`).
    ring: Option<Ring>,
    /// Buffers numpy has freed, put back into the stream's own ring in place of those
    /// `next_batch` hands out.
    pool: Arc<BufferPool>,
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
            ring: None,
            // Keeps what numpy frees between two batches: a consumer holding several batches
            // (up to the prefetch depth and a couple more) hands them back together.
            pool: Arc::new(BufferPool::new(prefetch + 2)),
            helpers: None,
        })
    }

    /// Starts `n` rayon helpers per prefetched batch instead of the default (tests: a 2-core
    /// machine has none by default). Takes effect when the prefetch thread next starts.
    #[cfg(test)]
    pub(crate) fn set_helpers(&mut self, n: usize) {
        self.helpers = Some(n);
    }

    /// Bytes of one batch of this rank (checked to fit in `new`).
    pub fn batch_bytes(&self) -> usize {
        self.spec.local_rows() as usize * self.ds.row_bytes()
    }

    /// Elements of one batch of this rank (fits: its bytes do).
    fn batch_elems(&self) -> usize {
        self.spec.local_rows() as usize * self.ds.row_elems()
    }

    /// From now on, assemble batches into the caller-owned `bufs` (see `ring.rs`) and hand them
    /// out with `next_slot`. Batches prefetched so far are dropped (they were not consumed);
    /// the position is unchanged. A previous ring (the caller's or the stream's own) is stopped
    /// (its thread joined) first.
    ///
    /// # Safety
    /// As `Ring::new`: while `keepalive` lives each buffer is valid for writes of its length,
    /// and nobody else accesses a buffer the ring owns (not yet returned, or released).
    pub unsafe fn use_ring(
        &mut self,
        bufs: Vec<RawBuf>,
        keepalive: Box<dyn std::any::Any + Send>,
    ) -> Result<()> {
        // SAFETY: `Ring::new` asks exactly what this function's caller guarantees (the same
        // words above), for the same buffers and keepalive, passed on unchanged.
        let ring = unsafe { Ring::new(bufs, self.batch_bytes(), self.prefetch, keepalive)? };
        self.ring = None; // joins the old ring's thread before the new one exists
        self.ring = Some(ring);
        Ok(())
    }

    /// Buffers in the caller's ring (0 without one).
    pub fn ring_len(&self) -> usize {
        self.ring
            .as_ref()
            .filter(|r| !r.is_owned())
            .map_or(0, Ring::len)
    }

    /// As `next_batch`, into a buffer of the caller's ring: the slot index, now held by the
    /// caller until `release(slot)`. Errors when all slots are held instead of waiting forever.
    pub fn next_slot(&mut self) -> Result<usize> {
        let ring = caller_ring(self.ring.as_mut())?;
        let (slot, ids) = ring.next(&self.ds, &self.spec, self.pos, self.helpers)?;
        self.pos += self.spec.batch_size;
        self.last_ids = ids;
        Ok(slot)
    }

    /// The caller has finished reading buffer `slot` of its ring.
    pub fn release(&self, slot: usize) -> Result<()> {
        caller_ring(self.ring.as_ref())?.release(slot)
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
    /// The pool that the stream's own ring takes fresh buffers from; hand buffers that
    /// `next_batch` returned back with `give` once read.
    pub fn pool(&self) -> &Arc<BufferPool> {
        &self.pool
    }

    /// This rank's rows of the global batch at the current position, in a buffer of its own
    /// (assembled in the stream's own ring, which takes a buffer from the pool in its place);
    /// advances by B.
    pub fn next_batch(&mut self) -> Result<Buffer> {
        let (storage, elems) = (self.ds.storage(), self.batch_elems());
        let ring = match self.ring {
            Some(ref mut r) => r,
            // Started lazily so a seek right after construction wastes no work.
            None => self.ring.insert(Ring::owned(
                storage,
                elems,
                ring::min_buffers(self.prefetch),
                self.prefetch,
            )?),
        };
        if !ring.is_owned() {
            return Err(Error::config(
                "ring",
                "this stream fills caller buffers: use next_slot() and release()",
            ));
        }
        // Taken first: a failed allocation consumes no batch.
        let fresh = self.pool.take(storage, elems)?;
        let (slot, ids) = match ring.next(&self.ds, &self.spec, self.pos, self.helpers) {
            Ok(next) => next,
            Err(e) => {
                self.pool.give(fresh);
                return Err(e);
            }
        };
        let batch = ring.take_held(slot, fresh);
        ring.release(slot)?;
        let batch = batch?;
        self.pos += self.spec.batch_size;
        self.last_ids = ids;
        Ok(batch)
    }

    /// Drops prefetched batches; the next batch is global samples `[pos, pos + B)`.
    pub fn seek(&mut self, pos: u64) -> Result<()> {
        self.spec.check_pos(pos)?;
        if let Some(r) = self.ring.as_mut() {
            r.reset(); // held slots stay with the caller
        }
        self.pos = pos;
        self.last_ids.clear();
        Ok(())
    }
}

/// The ring in `ring` if it holds the caller's buffers (`use_ring`), not the stream's own.
fn caller_ring<R: std::ops::Deref<Target = Ring>>(ring: Option<R>) -> Result<R> {
    ring.filter(|r| !r.is_owned())
        .ok_or_else(|| Error::config("ring", "no buffers: call use_ring(buffers) first"))
}
