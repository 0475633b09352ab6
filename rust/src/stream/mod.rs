//! The global sample stream (docs/design.md section 2): a rank's batches in order, assembled
//! synchronously, by a prefetch thread into pooled buffers (`prefetch`), or into a ring of
//! caller-owned ones (`ring`), each batch a job any thread may help with (`job`).
//!
//! Modules import one way: `Stream` (here) uses `prefetch` and `ring`, both use `job`, and all
//! of them use `spec` (the geometry and synchronous assembly) and `buffer` (the batch buffers);
//! `job` uses only `buffer` and the dataset.
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
mod prefetch;
mod ring;
mod spec;
#[cfg(test)]
mod tests;

pub use buffer::{Buffer, BufferPool, RawBuf};
pub use ring::{Ring, Slots};
pub use spec::{assemble, Batch, StreamSpec};

use prefetch::Worker;

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
        let ring = unsafe { Ring::new(bufs, self.batch_bytes(), self.prefetch, keepalive)? };
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
        let (slot, ids) = ring.next(&self.ds, &self.spec, self.pos, self.helpers)?;
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
