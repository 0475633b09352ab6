//! Batch buffers: the stream's own, 64-byte aligned ones handed to numpy (`Buffer`, recycled
//! through a `BufferPool`), and the address of a ring slot (`RawBuf`) that a job writes.

use std::ptr::NonNull;
use std::sync::Mutex;

use crate::error::{Error, Result};
use crate::io::{bytes_mut, AlignedVec};
use crate::recordings::Storage;

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

    /// The address and length of the buffer's bytes (its heap block, which stays put when the
    /// Buffer moves).
    pub fn raw(&mut self) -> Result<RawBuf> {
        let bytes = self.as_bytes_mut();
        RawBuf::new(bytes.as_mut_ptr(), bytes.len())
    }
}

/// Recycles batch buffers (those numpy frees, handed back to the stream's ring in place of the
/// ones it hands out): reusing warm, already-mapped memory instead of faulting in fresh zeroed
/// pages saves about a quarter of a 2 MiB batch assembly. Every byte of a reused buffer is
/// overwritten, so recycling never changes batch contents.
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

/// The address and byte length of one batch buffer (a ring slot: the caller's, or the stream's
/// own).
#[derive(Clone, Copy, Debug)]
pub struct RawBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a RawBuf is an address and a length with no access of its own: the only way to reach
// the memory is `slice_mut`, an unsafe fn whose caller must own the bytes exclusively (the
// Ring's slot states and a Job's chunk claims, `job.rs`, decide which thread that is). Moving
// the address to another thread therefore grants nothing.
unsafe impl Send for RawBuf {}
// SAFETY: `&RawBuf` offers only copies of the address and its length (`len`, `range`,
// `slice_mut` takes the RawBuf by value and is unsafe), so sharing one between threads is as
// harmless as sending a copy.
unsafe impl Sync for RawBuf {}

impl RawBuf {
    /// Records an address; nothing is dereferenced here.
    pub fn new(ptr: *mut u8, len: usize) -> Result<RawBuf> {
        let ptr = NonNull::new(ptr).ok_or_else(|| Error::config("buffers", "null buffer"))?;
        if (ptr.as_ptr() as usize).checked_add(len).is_none() || len > isize::MAX as usize {
            return Err(Error::config("buffers", "buffer exceeds the address space"));
        }
        Ok(RawBuf { ptr, len })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn range(&self) -> (usize, usize) {
        let a = self.ptr.as_ptr() as usize;
        (a, a + self.len)
    }

    /// Bytes `[start, start + len)` of the buffer, writable. Panics when the range is not
    /// inside the buffer.
    ///
    /// # Safety
    /// The buffer's memory must be valid for writes (allocated, not freed), and nothing else
    /// may read or write those bytes while the returned slice lives.
    pub(crate) unsafe fn slice_mut<'a>(self, start: usize, len: usize) -> &'a mut [u8] {
        assert!(
            start.checked_add(len).is_some_and(|end| end <= self.len),
            "bytes [{start}, +{len}) of a {}-byte buffer",
            self.len
        );
        // SAFETY: the range lies inside the buffer (asserted above), whose `len` bytes from a
        // non-null `ptr` fit below isize::MAX and the end of the address space (checked in
        // `new`), so `add` stays in bounds; validity and exclusive access for the slice's life
        // are the caller's guarantee. Bytes need no alignment and every value is valid.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(start), len) }
    }
}
