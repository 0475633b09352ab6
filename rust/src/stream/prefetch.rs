//! The prefetch thread of a stream without a ring: it assembles batches `start, start + B, ...`
//! into pooled buffers, each as a job (`job.rs`), and sends them over a bounded channel. The
//! consumer, when no batch is ready, helps with the one being assembled (`job::wait_for`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::buffer::BufferPool;
use super::job::{self, Completed, Found, Job, Waiter};
use super::spec::{Batch, StreamSpec};
use crate::error::{Error, Result};
use crate::recordings::Dataset;

/// Starts the job of the batch at `pos` in a pooled buffer.
fn start_job(ds: &Dataset, spec: &StreamSpec, pos: u64, pool: &BufferPool) -> Result<Job> {
    Job::pooled(ds, pos, spec.batch_ids(pos)?, pool)
}

/// The winner's end of a pooled job (`Job::complete`): the batch, or its error with the buffer
/// back in the pool.
fn pooled_batch(pos: u64, done: Completed, pool: &BufferPool) -> Result<Batch> {
    let data = done
        .buffer
        .ok_or_else(|| Error::Internal("a pooled batch without its buffer".into()))?;
    match done.result {
        Ok(ids) => Ok(Batch { pos, ids, data }),
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

/// Background thread assembling batches `start, start+B, ...` into a bounded channel.
pub(super) struct Worker {
    rx: Option<Receiver<Result<Batch>>>,
    stop: Arc<AtomicBool>,
    current: Current,
    handle: Option<JoinHandle<()>>,
}

impl Worker {
    /// Starts the thread, `depth` batches ahead of the consumer at most, with `helpers` rayon
    /// helpers per batch (None: `job::helpers()`).
    pub(super) fn spawn(
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
                                Some(done) => pooled_batch(pos, done, &pool),
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
    pub(super) fn next(&self, ds: &Dataset, pool: &BufferPool, pos: u64) -> Result<Batch> {
        let rx = self.rx.as_ref().ok_or_else(stopped)?;
        let mut w = Wait {
            rx,
            current: &self.current,
            pool,
            pos,
        };
        job::wait_for(&mut w, ds)
    }
}

fn stopped() -> Error {
    Error::Thread("stopped unexpectedly".into())
}

/// A consumer of the channel waiting for the batch at `pos`.
struct Wait<'a> {
    rx: &'a Receiver<Result<Batch>>,
    current: &'a Current,
    pool: &'a BufferPool,
    pos: u64,
}

impl Waiter for Wait<'_> {
    type Batch = Result<Batch>;
    type Tag = ();

    fn look(&mut self, sleep: bool) -> Found<Result<Batch>, ()> {
        match self.rx.try_recv() {
            Ok(item) => return Found::Ready(item),
            Err(TryRecvError::Disconnected) => return Found::Ready(Err(stopped())),
            Err(TryRecvError::Empty) => {}
        }
        let job = self
            .current
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        match job.filter(|j| j.open_at(self.pos)) {
            Some(job) => Found::Open(job, ()),
            // Nothing to help with for a while (the thread is blocked, not started yet, or
            // re-reading a changed file's rows): sleep until the batch arrives.
            None if sleep => Found::Ready(self.rx.recv().unwrap_or_else(|_| Err(stopped()))),
            None => Found::Pending,
        }
    }

    fn won(&mut self, job: &Job, (): (), done: Completed) -> Result<Batch> {
        pooled_batch(job.pos, done, self.pool)
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
