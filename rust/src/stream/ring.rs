//! Batch assembly into a ring of buffers: the stream's one assembly path (issue #9).
//!
//! The caller allocates `N` batch buffers (on CUDA: pinned host tensors) and hands their
//! addresses to a [`Ring`]. The stream then assembles each batch directly into one of them, so
//! the batch the caller gets is already where the host-to-device copy reads from. A stream whose
//! caller gave no buffers (`Stream::next_batch`, numpy arrays) assembles into a ring of its own
//! ([`Ring::owned`]) and hands each filled buffer out whole, putting a recycled one in its slot
//! (`take_held`), so no batch is copied there either. Each buffer is a *slot* with one owner at
//! a time:
//!
//! ```text
//!   Free --claim--> Filling --finish--> Ready --pop_ready--> Held --release--> Free
//!   (ring)          (one job)           (ring)               (caller)
//!                      `----------------hand_over-----------^
//! ```
//!
//! Only a `Filling` slot is ever written: by the one job assembling its batch (`job.rs`: the
//! prefetch thread, the consumer while it waits for that batch, and rayon helpers, each on rows
//! claimed from one counter, so every row has one writer; or by the consumer alone without
//! prefetch). A slot reaches `Filling` only from `Free` (initially or after the caller's
//! explicit `release`), and leaves it only once every row of its job is written: queued as
//! `Ready` by the prefetch thread, or handed straight to a consumer that completed the job
//! itself (`hand_over`; it waited for exactly that batch, and later ones may be queued already).
//! So the caller may read a `Held` slot for as long as it likes (with grad_accum, until the step
//! that read it is done), and nothing the caller still reads is ever overwritten. [`Slots`] is
//! that state machine, pure and single-threaded; [`Ring`] adds the prefetch thread. Batch
//! contents come from `(dataset, spec, position)` alone: which slot a batch lands in, and when,
//! never changes its bytes.

use std::any::Any;
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use super::buffer::{Buffer, RawBuf};
use super::job::{self, Completed, Found, Job, Waiter};
use super::spec::{assemble_into, StreamSpec};
use crate::error::{Error, Result};
use crate::recordings::{Dataset, Storage};

/// Who owns a slot (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotState {
    /// Released: the ring may fill it next.
    Free,
    /// Being written by its batch's job (each row by exactly one thread).
    Filling,
    /// Holds the next batch(es), not yet returned to the caller.
    Ready,
    /// Returned by `next`; the caller reads it until it calls `release`.
    Held,
}

/// One assembled (or failed) batch, queued in stream order.
#[derive(Debug)]
pub struct Filled {
    pub pos: u64,
    /// The slot and the window ids of its rows, or why the batch at `pos` could not be made.
    pub result: Result<(usize, Vec<u64>)>,
}

/// The slot state machine of a ring of `len()` buffers. Pure: no threads, no memory access.
#[derive(Debug)]
pub struct Slots {
    state: Vec<SlotState>,
    /// Released slots in the order they will be filled.
    free: VecDeque<usize>,
    /// Filled slots (and at most one trailing error) in stream order.
    ready: VecDeque<Filled>,
}

impl Slots {
    /// `n` slots, all free, filled in index order first.
    pub fn new(n: usize) -> Slots {
        Slots {
            state: vec![SlotState::Free; n],
            free: (0..n).collect(),
            ready: VecDeque::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.state.len()
    }

    pub fn is_empty(&self) -> bool {
        self.state.is_empty()
    }

    pub fn state(&self, slot: usize) -> Option<SlotState> {
        self.state.get(slot).copied()
    }

    fn count(&self, s: SlotState) -> usize {
        self.state.iter().filter(|&&x| x == s).count()
    }

    /// Slots the caller holds, in index order.
    pub fn held(&self) -> Vec<usize> {
        (0..self.len())
            .filter(|&i| self.state[i] == SlotState::Held)
            .collect()
    }

    /// True when every slot is held by the caller: nothing can be filled until one is released.
    pub fn all_held(&self) -> bool {
        self.count(SlotState::Held) == self.len()
    }

    /// The next free slot to fill, now `Filling`, unless `depth` batches are already assembled
    /// or being assembled ahead of the caller.
    pub fn claim(&mut self, depth: usize) -> Option<usize> {
        if self.ready.len() + self.count(SlotState::Filling) >= depth {
            return None;
        }
        let slot = self.free.pop_front()?;
        self.state[slot] = SlotState::Filling;
        Some(slot)
    }

    /// Records the outcome of filling `slot` with the batch at `pos`. A failed batch queues its
    /// error and frees the slot (it is refilled first).
    pub fn finish(&mut self, slot: usize, pos: u64, result: Result<Vec<u64>>) -> Result<()> {
        let filled = self.settle(slot, pos, result, SlotState::Ready)?;
        self.ready.push_back(filled);
        Ok(())
    }

    /// Hands the batch at `pos` in `slot` straight to the caller, who completed it itself (it
    /// waited for exactly that batch, so every earlier one has been taken, while later ones may
    /// already be queued): its slot is now held, or, for a failed batch, free (refilled first).
    pub fn hand_over(&mut self, slot: usize, pos: u64, result: Result<Vec<u64>>) -> Result<Filled> {
        self.settle(slot, pos, result, SlotState::Held)
    }

    /// Ends the filling of `slot`: `to` (Ready or Held) with its batch, or Free (refilled first)
    /// with its error.
    fn settle(
        &mut self,
        slot: usize,
        pos: u64,
        result: Result<Vec<u64>>,
        to: SlotState,
    ) -> Result<Filled> {
        if self.state(slot) != Some(SlotState::Filling) {
            return Err(Error::Internal(format!(
                "ring slot {slot} ended but not filling"
            )));
        }
        let result = match result {
            Ok(ids) => {
                self.state[slot] = to;
                Ok((slot, ids))
            }
            Err(e) => {
                self.state[slot] = SlotState::Free;
                self.free.push_front(slot);
                Err(e)
            }
        };
        Ok(Filled { pos, result })
    }

    /// The oldest queued batch; its slot is now held by the caller.
    pub fn pop_ready(&mut self) -> Option<Filled> {
        let f = self.ready.pop_front()?;
        if let Ok((slot, _)) = f.result {
            self.state[slot] = SlotState::Held;
        }
        Some(f)
    }

    /// The caller is done with `slot`: it may be filled again.
    pub fn release(&mut self, slot: usize) -> Result<()> {
        match self.state(slot) {
            Some(SlotState::Held) => {
                self.state[slot] = SlotState::Free;
                self.free.push_back(slot);
                Ok(())
            }
            Some(_) => Err(Error::config(
                "slot",
                format!(
                    "{slot} is not held by the caller (already released, or not yet returned \
                     by next_slot)"
                ),
            )),
            None => Err(Error::Index {
                what: "slot",
                index: slot as u64,
                len: self.len() as u64,
            }),
        }
    }

    /// Drops every batch assembled ahead of the caller (seek, restart): ready and filling slots
    /// become free. Only called when no thread is filling. Held slots stay held.
    pub fn discard(&mut self) {
        for f in self.ready.drain(..) {
            if let Ok((slot, _)) = f.result {
                self.state[slot] = SlotState::Free;
                self.free.push_back(slot);
            }
        }
        for slot in 0..self.state.len() {
            if self.state[slot] == SlotState::Filling {
                self.state[slot] = SlotState::Free;
                self.free.push_back(slot);
            }
        }
    }
}

struct Inner {
    slots: Slots,
    /// Each slot's buffer. A slot's entry changes only while the caller holds it (`take_held`),
    /// so a job, which exists only while its slot is `Filling`, never sees it change.
    bufs: Vec<RawBuf>,
    /// The batch the prefetch thread is assembling, and its slot: a consumer waiting for that
    /// batch claims its remaining rows (`job.rs`) instead of sleeping.
    current: Option<(usize, Arc<Job>)>,
    /// Set to stop the prefetch thread at its next claim.
    stop: bool,
    /// False once the prefetch thread has exited (normally or not).
    running: bool,
}

struct Shared {
    inner: Mutex<Inner>,
    /// Signalled on every state change (a slot filled, taken or released; stop; exit).
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Inner is updated in single steps that leave it consistent; a panic elsewhere (none is
        // expected) must not make every later call fail.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, g: MutexGuard<'a, Inner>) -> MutexGuard<'a, Inner> {
        self.changed.wait(g).unwrap_or_else(|e| e.into_inner())
    }
}

/// Marks the prefetch thread as gone however it exits, so a waiting consumer never hangs.
struct ExitGuard(Arc<Shared>);

impl Drop for ExitGuard {
    fn drop(&mut self) {
        self.0.lock().running = false;
        self.0.changed.notify_all();
    }
}

/// Batch buffers with a background thread filling released ones in stream order.
///
/// Safety invariant: every buffer stays valid for writes (its memory is kept alive by
/// `keepalive` or `owned`, dropped only after the prefetch thread has been joined, and that
/// thread waits for every row of its job to be written before it moves on or exits), and a
/// buffer is written only while its slot is `Filling`, which the state machine grants to one
/// batch's job at a time and only for slots the caller has not been handed (or has released).
pub struct Ring {
    shared: Arc<Shared>,
    len: usize,
    batch_bytes: usize,
    prefetch: usize,
    worker: Option<JoinHandle<()>>,
    /// A ring of the stream's own (`Ring::owned`): slot i's buffer. Empty for a caller's ring.
    /// Dropped only after `Drop::drop` has joined the prefetch thread.
    owned: Vec<Buffer>,
    /// Owns a caller's buffers' memory (the Python arrays). Dropped only after `Drop::drop` has
    /// joined the prefetch thread.
    _keepalive: Box<dyn Any + Send>,
}

/// The fewest buffers a ring with `prefetch` batches assembled ahead needs: those `prefetch`
/// plus the one the caller reads.
pub fn min_buffers(prefetch: usize) -> usize {
    prefetch.saturating_add(1)
}

impl Ring {
    /// A ring over `bufs`, each exactly `batch_bytes` long and pairwise disjoint, with up to
    /// `prefetch` batches assembled ahead of the caller (0: assembled by `next` itself).
    ///
    /// # Safety
    /// While `keepalive` lives, each buffer must be valid for writes of its length, and nobody
    /// but this ring may read or write a buffer from the moment it is given here until `next`
    /// returns its slot, and again from `release(slot)` until `next` returns it again.
    pub unsafe fn new(
        bufs: Vec<RawBuf>,
        batch_bytes: usize,
        prefetch: usize,
        keepalive: Box<dyn Any + Send>,
    ) -> Result<Ring> {
        let need = min_buffers(prefetch);
        if bufs.len() < need {
            return Err(Error::config(
                "buffers",
                format!(
                    "{} given, need at least prefetch + 1 = {need} (prefetch {prefetch} batches \
                     assembled ahead, plus the one being read)",
                    bufs.len()
                ),
            ));
        }
        if let Some((i, b)) = bufs
            .iter()
            .enumerate()
            .find(|(_, b)| b.len() != batch_bytes)
        {
            return Err(Error::config(
                &format!("buffers[{i}]"),
                format!("has {} bytes, a batch has {batch_bytes}", b.len()),
            ));
        }
        let mut ranges: Vec<(usize, usize, usize)> = bufs
            .iter()
            .enumerate()
            .map(|(i, b)| (b.range().0, b.range().1, i))
            .collect();
        ranges.sort_unstable();
        if let Some(w) = ranges.windows(2).find(|w| w[1].0 < w[0].1) {
            let (a, b) = (w[0].2.min(w[1].2), w[0].2.max(w[1].2));
            return Err(Error::config(
                "buffers",
                format!("buffers[{a}] and buffers[{b}] share memory; each needs its own"),
            ));
        }
        let len = bufs.len();
        Ok(Ring {
            shared: Arc::new(Shared {
                inner: Mutex::new(Inner {
                    slots: Slots::new(len),
                    bufs,
                    current: None,
                    stop: false,
                    running: false,
                }),
                changed: Condvar::new(),
            }),
            len,
            batch_bytes,
            prefetch,
            worker: None,
            owned: Vec::new(),
            _keepalive: keepalive,
        })
    }

    /// A ring of `n` zeroed buffers of its own, each `elems` elements of `storage`, with up to
    /// `prefetch` batches assembled ahead; its batches leave it through `take_held`.
    pub fn owned(storage: Storage, elems: usize, n: usize, prefetch: usize) -> Result<Ring> {
        let mut owned = (0..n)
            .map(|_| Buffer::zeroed(storage, elems))
            .collect::<Result<Vec<Buffer>>>()?;
        let bufs = owned
            .iter_mut()
            .map(Buffer::raw)
            .collect::<Result<Vec<RawBuf>>>()?;
        let batch_bytes = bufs.first().map_or(0, RawBuf::len);
        // SAFETY: each RawBuf is the heap block of one of the fresh buffers in `owned`, which
        // moves into the ring below (moving a Buffer does not move its block) and is freed only
        // after the ring's thread is joined (`owned` is dropped after `Drop::drop`). Nothing
        // outside the ring refers to them: a buffer leaves only through `take_held`, for a held
        // slot, when the ring has stopped writing it and gets another in its place.
        let mut ring = unsafe { Ring::new(bufs, batch_bytes, prefetch, Box::new(())) }?;
        ring.owned = owned;
        Ok(ring)
    }

    /// True for a ring of the stream's own buffers (`Ring::owned`).
    pub fn is_owned(&self) -> bool {
        !self.owned.is_empty()
    }

    /// Hands out the buffer of `slot`, held by the caller, of a ring of its own, and puts
    /// `fresh` (a buffer of the same size) in its place; the caller still releases the slot.
    pub fn take_held(&mut self, slot: usize, mut fresh: Buffer) -> Result<Buffer> {
        let raw = fresh.raw()?;
        if !self.is_owned() || raw.len() != self.batch_bytes {
            return Err(Error::Internal(format!(
                "a {}-byte buffer swapped into a ring of {}-byte {} buffers",
                raw.len(),
                self.batch_bytes,
                if self.is_owned() { "owned" } else { "caller" }
            )));
        }
        let mut g = self.shared.lock();
        if g.slots.state(slot) != Some(SlotState::Held) {
            return Err(Error::Internal(format!(
                "ring slot {slot} swapped but not held"
            )));
        }
        // The slot is held: no job writes it, and it is filled again only after `release`,
        // from this new buffer.
        g.bufs[slot] = raw;
        drop(g);
        Ok(std::mem::replace(&mut self.owned[slot], fresh))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Slots the caller holds, in index order.
    pub fn held(&self) -> Vec<usize> {
        self.shared.lock().slots.held()
    }

    fn all_held(&self) -> Error {
        Error::config(
            "ring",
            format!(
                "all {} buffers are held by the caller: release one before asking for the next \
                 batch",
                self.len()
            ),
        )
    }

    /// The batch at `pos` in a slot now held by the caller: `(slot, window ids)`. A prefetch
    /// thread started here runs `helpers` rayon helpers per batch (None: `job::helpers()`,
    /// counted on that thread).
    pub fn next(
        &mut self,
        ds: &Arc<Dataset>,
        spec: &StreamSpec,
        pos: u64,
        helpers: Option<usize>,
    ) -> Result<(usize, Vec<u64>)> {
        if self.prefetch == 0 {
            return self.next_sync(ds, spec, pos);
        }
        if self.worker.is_none() {
            self.spawn(ds.clone(), *spec, pos, helpers)?;
        }
        let filled = job::wait_for(&mut Wait { ring: self, pos }, ds)?;
        match filled.result {
            Ok((slot, ids)) if filled.pos == pos => Ok((slot, ids)),
            Ok((slot, _)) => {
                let _ = self.release(slot);
                self.reset();
                Err(Error::Thread("delivered a batch out of order".into()))
            }
            Err(e) => {
                // The thread has exited after a failure it completed; one the consumer completed
                // stops it here. The next call restarts at `pos`.
                self.reset();
                Err(e)
            }
        }
    }

    fn next_sync(
        &mut self,
        ds: &Dataset,
        spec: &StreamSpec,
        pos: u64,
    ) -> Result<(usize, Vec<u64>)> {
        let (slot, buf) = {
            let mut g = self.shared.lock();
            let slot = g.slots.claim(1).ok_or_else(|| self.all_held())?;
            (slot, g.bufs[slot])
        };
        // SAFETY: the ring's memory is valid while it lives (`Ring::new`'s caller, or `owned`),
        // and the slot is Filling, claimed just now by this thread: the ring writes a slot only
        // while it is Filling, there is no prefetch thread (prefetch 0), and the caller does
        // not touch the buffer before `next` returns it. So this is the only access until the
        // slot is finished below.
        let out = unsafe { buf.slice_mut(0, buf.len()) };
        let result = assemble_into(ds, spec, pos, out);
        let mut g = self.shared.lock();
        g.slots.finish(slot, pos, result)?;
        match g.slots.pop_ready().map(|f| f.result) {
            Some(r) => r,
            None => Err(Error::Internal("ring batch vanished".into())),
        }
    }

    /// The caller is done reading `slot`; the ring may fill it again.
    pub fn release(&self, slot: usize) -> Result<()> {
        self.shared.lock().slots.release(slot)?;
        self.shared.changed.notify_all();
        Ok(())
    }

    /// Stops the prefetch thread and drops every batch assembled ahead (seek, after an error).
    /// Slots the caller holds stay held.
    pub fn reset(&mut self) {
        if let Some(h) = self.worker.take() {
            self.shared.lock().stop = true;
            self.shared.changed.notify_all();
            let _ = h.join(); // at most one batch assembly away
        }
        let mut g = self.shared.lock();
        g.stop = false;
        g.running = false;
        g.current = None;
        g.slots.discard();
    }

    fn spawn(
        &mut self,
        ds: Arc<Dataset>,
        spec: StreamSpec,
        start: u64,
        helpers: Option<usize>,
    ) -> Result<()> {
        self.shared.lock().running = true;
        let shared = self.shared.clone();
        let depth = self.prefetch;
        let handle = std::thread::Builder::new()
            .name("iqtrain-ring".into())
            .spawn(move || fill_loop(shared, ds, spec, start, depth, helpers));
        match handle {
            Ok(h) => {
                self.worker = Some(h);
                Ok(())
            }
            Err(e) => {
                self.shared.lock().running = false;
                Err(Error::Thread(format!("cannot be started ({e})")))
            }
        }
    }
}

/// The caller of `Ring::next` waiting for the batch at `pos` (`job::wait_for`).
struct Wait<'a> {
    ring: &'a mut Ring,
    pos: u64,
}

impl Waiter for Wait<'_> {
    type Batch = Result<Filled>;
    /// The slot of the open job.
    type Tag = usize;

    /// The next queued batch (or why there is none), else the open job of the batch at `pos`
    /// and its slot; with `sleep`, waits for the prefetch thread to change something first.
    fn look(&mut self, sleep: bool) -> Found<Result<Filled>, usize> {
        let shared = &self.ring.shared;
        let mut g = shared.lock();
        loop {
            if let Some(f) = g.slots.pop_ready() {
                shared.changed.notify_all(); // one fewer batch ahead: the thread may fill more
                return Found::Ready(Ok(f));
            }
            if !g.running {
                drop(g);
                self.ring.reset();
                return Found::Ready(Err(Error::Thread("stopped unexpectedly".into())));
            }
            if g.slots.all_held() {
                return Found::Ready(Err(self.ring.all_held()));
            }
            if let Some((slot, job)) = g.current.as_ref().filter(|(_, j)| j.open_at(self.pos)) {
                return Found::Open(job.clone(), *slot);
            }
            if !sleep {
                // The thread is between batches, or queueing one: microseconds away.
                return Found::Pending;
            }
            // Every change of state (a batch queued, a job started, an exit) notifies.
            g = shared.wait(g);
        }
    }

    /// Straight to this caller, not through the queue: the prefetch thread may have queued
    /// later batches meanwhile.
    fn won(&mut self, job: &Job, slot: usize, done: Completed) -> Result<Filled> {
        let shared = &self.ring.shared;
        let mut g = shared.lock();
        if g.current
            .as_ref()
            .is_some_and(|(_, j)| std::ptr::eq(Arc::as_ptr(j), job))
        {
            g.current = None;
        }
        let filled = g.slots.hand_over(slot, self.pos, done.result);
        drop(g);
        shared.changed.notify_all(); // a failed batch freed its slot
        filled
    }
}

/// The prefetch thread: fills released slots with batches `start, start + B, ...` in order,
/// staying at most `depth` batches ahead of the caller; exits on stop or after a failed batch it
/// completed (one the consumer completed stops it through `reset`).
fn fill_loop(
    shared: Arc<Shared>,
    ds: Arc<Dataset>,
    spec: StreamSpec,
    start: u64,
    depth: usize,
    helpers: Option<usize>,
) {
    let _exit = ExitGuard(shared.clone());
    let helpers = helpers.unwrap_or_else(job::helpers);
    let mut pos = start;
    loop {
        let (slot, buf) = {
            let mut g = shared.lock();
            loop {
                if g.stop {
                    return;
                }
                if let Some(s) = g.slots.claim(depth) {
                    break (s, g.bufs[s]);
                }
                g = shared.wait(g);
            }
        };
        // SAFETY: the buffer is valid for writes while the ring lives (`Ring::new`'s caller, or
        // `owned`), and this thread outlives the job's use of it: it completes (or, unwinding,
        // drains) the job before it claims another slot or exits, and the ring joins it before
        // freeing any buffer. Nobody else accesses the buffer meanwhile: the slot is Filling,
        // claimed just now by this thread; the caller released it (or never had it) and gets
        // it back only once the job's winner has finished it, and its entry in `bufs` changes
        // only while the caller holds it.
        let job = spec
            .batch_ids(pos)
            .and_then(|ids| unsafe { Job::new(&ds, pos, ids, buf) });
        let job = match job {
            Ok(j) => Arc::new(j),
            Err(e) => {
                let _ = shared.lock().slots.finish(slot, pos, Err(e));
                shared.changed.notify_all();
                return;
            }
        };
        shared.lock().current = Some((slot, job.clone()));
        shared.changed.notify_all(); // a consumer asleep waiting for this batch may help
        job.spawn_helpers(&ds, helpers);
        {
            // A panic in `work` unwinds out of this thread, and the ring resets its slot once
            // the thread is gone: first the helpers still writing the slot finish.
            let _drain = job::DrainOnUnwind { job: &job, ds: &ds };
            job.work(&ds);
        }
        // complete() waits for every chunk, the consumer's and the helpers' included.
        if let Some(Completed { result, .. }) = job.complete(&ds) {
            let failed = result.is_err();
            let recorded = {
                let mut g = shared.lock();
                g.current = None;
                g.slots.finish(slot, pos, result)
            };
            shared.changed.notify_all();
            if failed || recorded.is_err() {
                return;
            }
        }
        // Otherwise the consumer completed it (and on an error resets this ring).
        pos += spec.batch_size;
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // Join the prefetch thread before `owned` or `_keepalive` (the buffers' owners) is
        // dropped.
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(pos: u64) -> Result<Vec<u64>> {
        Ok(vec![pos])
    }

    #[test]
    fn slots_follow_the_ownership_cycle() {
        let mut s = Slots::new(3);
        assert_eq!(s.claim(2), Some(0));
        assert_eq!(s.claim(2), Some(1));
        assert_eq!(s.claim(2), None, "depth 2 reached");
        s.finish(0, 0, ids(0)).unwrap();
        s.finish(1, 8, ids(8)).unwrap();
        assert_eq!(s.claim(2), None, "two ready batches ahead");
        let f = s.pop_ready().unwrap();
        assert_eq!((f.pos, f.result.unwrap()), (0, (0, vec![0])));
        assert_eq!(s.state(0), Some(SlotState::Held));
        assert_eq!(s.claim(2), Some(2));
        s.finish(2, 16, ids(16)).unwrap();
        assert_eq!(s.pop_ready().unwrap().result.unwrap().0, 1);
        assert_eq!(s.pop_ready().unwrap().result.unwrap().0, 2);
        assert!(s.all_held());
        assert_eq!(s.claim(2), None, "nothing released");
        // Out-of-order release: slots are refilled in release order.
        s.release(2).unwrap();
        s.release(0).unwrap();
        assert_eq!(s.held(), vec![1]);
        assert_eq!(s.claim(3), Some(2));
        assert_eq!(s.claim(3), Some(0));
        // Double release, release of a slot the ring owns, out of range.
        assert!(matches!(s.release(2), Err(Error::Config { ref key, .. }) if key == "slot"));
        s.release(1).unwrap();
        assert!(matches!(s.release(1), Err(Error::Config { .. })));
        assert!(matches!(
            s.release(3),
            Err(Error::Index {
                index: 3,
                len: 3,
                ..
            })
        ));
        assert!(s.finish(1, 0, ids(0)).is_err(), "slot 1 is not filling");
    }

    #[test]
    fn a_failed_batch_frees_its_slot_and_discard_keeps_held_slots() {
        let mut s = Slots::new(4);
        let a = s.claim(3).unwrap();
        s.finish(a, 0, ids(0)).unwrap();
        let b = s.claim(3).unwrap();
        let c = s.claim(3).unwrap();
        s.finish(b, 8, Err(Error::Thread("x".into()))).unwrap();
        assert_eq!(s.state(b), Some(SlotState::Free));
        assert_eq!(s.pop_ready().unwrap().result.unwrap().0, a);
        assert!(s.pop_ready().unwrap().result.is_err());
        // c is still filling (a stopped thread's leftover) when the ring resets.
        s.discard();
        assert_eq!(s.state(c), Some(SlotState::Free));
        assert_eq!(s.held(), vec![a]);
        assert!(s.pop_ready().is_none());
        assert_eq!(
            (0..4).filter_map(|_| s.claim(4)).count(),
            3,
            "every slot but the held one is free again"
        );
    }

    #[test]
    fn a_batch_its_consumer_completed_goes_to_it_past_later_queued_ones() {
        let mut s = Slots::new(4);
        let a = s.claim(3).unwrap(); // batch 0: the consumer helps, and completes it
        let b = s.claim(3).unwrap(); // batch 8: the prefetch thread finishes it first
        s.finish(b, 8, ids(8)).unwrap();
        let f = s.hand_over(a, 0, ids(0)).unwrap();
        assert_eq!((f.pos, f.result.unwrap()), (0, (a, vec![0])));
        assert_eq!(s.state(a), Some(SlotState::Held));
        assert_eq!(
            s.pop_ready().unwrap().pos,
            8,
            "the queue still holds batch 8, next"
        );
        // A failed batch frees its slot, refilled first; a slot not filling is a bug, reported.
        let c = s.claim(4).unwrap();
        assert!(s
            .hand_over(c, 16, Err(Error::Thread("x".into())))
            .unwrap()
            .result
            .is_err());
        assert_eq!(s.state(c), Some(SlotState::Free));
        assert_eq!(s.claim(4), Some(c));
        assert!(matches!(s.hand_over(a, 0, ids(0)), Err(Error::Internal(_))));
        assert!(s.pop_ready().is_none());
    }

    #[test]
    fn ring_rejects_bad_buffer_sets() {
        let mut mem = vec![0u8; 64];
        let p = mem.as_mut_ptr();
        let buf = |off: usize, len: usize| RawBuf::new(p.wrapping_add(off), len).unwrap();
        let ok = |bufs: Vec<RawBuf>, prefetch| {
            // SAFETY: `mem` outlives each ring, which is dropped at once without filling.
            unsafe { Ring::new(bufs, 16, prefetch, Box::new(())) }.map(|r| r.len())
        };
        assert_eq!(
            ok(vec![buf(0, 16), buf(16, 16), buf(32, 16)], 2).unwrap(),
            3
        );
        let e = ok(vec![buf(0, 16), buf(16, 16)], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("need at least prefetch + 1 = 3"), "{e}");
        let e = ok(vec![buf(0, 16), buf(16, 8)], 1).unwrap_err().to_string();
        assert!(e.starts_with("buffers[1]: has 8 bytes"), "{e}");
        let e = ok(vec![buf(0, 16), buf(32, 16), buf(8, 16)], 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("buffers[0] and buffers[2] share memory"), "{e}");
        assert!(RawBuf::new(std::ptr::null_mut(), 4).is_err());
        drop(mem);
    }
}
