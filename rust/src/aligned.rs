//! Cache-line aligned buffers for bulk copies (batch rows, digest reads).

use std::alloc::Layout;
use std::marker::PhantomData;

use crate::error::{Error, Result};

/// Element types whose every bit pattern is valid, so a byte view of them is sound.
///
/// # Safety
/// Implementors have no padding, no invalid bit patterns and alignment <= 64.
pub unsafe trait Plain: Copy {}
// SAFETY: primitive numbers: no padding, every bit pattern valid, alignment <= 4.
unsafe impl Plain for u8 {}
// SAFETY: as above.
unsafe impl Plain for i8 {}
// SAFETY: as above.
unsafe impl Plain for i16 {}
// SAFETY: as above.
unsafe impl Plain for f32 {}

/// The allocation unit of aligned buffers: one 64-byte cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// A zero-initialised array of `len` plain elements that starts on a 64-byte boundary.
///
/// Why: bulk copies run as `rep movsb` (glibc memcpy, and the kernel's copy behind `pread`),
/// which on the AMD EPYC VM measured here runs 3-5x slower when the destination lies a few bytes
/// past the page-aligned source modulo 4 KiB (see [`copy_bytes`], which sidesteps it for
/// copies from a mapping). A plain `Vec` of 1-2 MiB comes from `mmap` via malloc at 16 bytes
/// past a page boundary: 256 random 8 KiB rows took 1.22 ms (memcpy from a map) / 1.54 ms
/// (`pread`) into such a buffer, 0.26 ms / 0.50 ms into a 64-byte aligned one; a sequential
/// 1 MiB `read` loop over cached files ran at 2.7 GB/s vs 12 GB/s aligned.
pub struct AlignedVec<T> {
    lines: Vec<CacheLine>,
    len: usize,
    elem: PhantomData<T>,
}

impl<T: Plain> AlignedVec<T> {
    /// `len` zeroed elements; an allocation failure is reported, not an abort.
    pub fn zeroed(len: usize) -> Result<AlignedVec<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>());
        let err = || Error::Alloc {
            what: "buffer",
            bytes: len as u128 * std::mem::size_of::<T>() as u128,
        };
        let n = bytes.ok_or_else(err)?.div_ceil(64);
        let lines = if n == 0 {
            Vec::new()
        } else {
            let layout = Layout::array::<CacheLine>(n).map_err(|_| err())?;
            // alloc_zeroed (calloc) gets fresh pages already zeroed, avoiding a memset pass
            // that the reads overwrite anyway; failure is reported instead of aborting.
            // SAFETY: layout has non-zero size; all-zero bytes are a valid CacheLine; the Vec
            // takes ownership of a global-allocator block with exactly this layout, capacity n.
            unsafe {
                let ptr = std::alloc::alloc_zeroed(layout) as *mut CacheLine;
                if ptr.is_null() {
                    return Err(err());
                }
                Vec::from_raw_parts(ptr, n, n)
            }
        };
        Ok(AlignedVec {
            lines,
            len,
            elem: PhantomData,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[T] {
        // SAFETY: the lines hold >= len * size_of::<T>() initialised bytes, aligned to 64 >=
        // align_of::<T>(), and every bit pattern is a valid T (Plain). An empty Vec's dangling
        // pointer is non-null and aligned, which is all a zero-length slice needs.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in as_slice, and &mut self makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

impl<T: Plain> std::ops::Deref for AlignedVec<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: Plain> std::ops::DerefMut for AlignedVec<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        self.as_mut_slice()
    }
}

impl<T: Plain + PartialEq> PartialEq for AlignedVec<T> {
    fn eq(&self, other: &Self) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl<T: Plain + std::fmt::Debug> std::fmt::Debug for AlignedVec<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Bytes copied per `memcpy` call when [`copy_bytes`] avoids `rep movsb`: below glibc's
/// `rep_movsb_threshold` (2 KiB at its smallest, with SSE2), so glibc copies with vector loops.
const PIECE: usize = 1024;

/// Copies `len` bytes from `src` to `dst`, at `memcpy` speed whatever the two addresses are.
///
/// Why: glibc's memcpy copies blocks of a few KiB and more with `rep movsb`, which on the AMD
/// EPYC VM measured here runs 4-5x slower when the destination lies 1 to 31 bytes past the
/// source modulo 4 KiB (an 8 KiB row from a page-aligned mapping into a `malloc`ed batch at 16
/// bytes past a page: 1.1-1.3 ms a batch of 256 against 0.22-0.30 ms at any other distance;
/// docs/design.md section 2.3.1). Such copies go in 1 KiB pieces instead, as fast as the
/// aligned copy; every other copy is one `memcpy`.
///
/// # Safety
/// As `ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, the two
/// ranges disjoint.
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    let skew = (dst as usize).wrapping_sub(src as usize) % 4096;
    if len <= PIECE || skew == 0 || skew >= 64 {
        // SAFETY: the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
        return;
    }
    let mut at = 0;
    while at < len {
        let n = PIECE.min(len - at);
        // SAFETY: [at, at + n) lies within both ranges of the caller's guarantee.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), n) };
        at += n;
    }
}

pub(crate) fn bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: T is Plain (no padding, every bit pattern valid); u8 has alignment 1.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut u8, std::mem::size_of_val(v)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_cache_line_aligned_and_exact_length() {
        for len in [0usize, 1, 31, 32, 33, 1 << 20] {
            let mut v = AlignedVec::<i16>::zeroed(len).unwrap();
            assert_eq!(v.len(), len);
            assert_eq!(v.as_ptr() as usize % 64, 0, "len {len}");
            assert!(v.iter().all(|&x| x == 0));
            v.iter_mut().enumerate().for_each(|(i, x)| *x = i as i16);
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as i16));
            assert_eq!(bytes_mut(&mut v).len(), 2 * len);
        }
        assert!(matches!(
            AlignedVec::<f32>::zeroed(usize::MAX / 2),
            Err(Error::Alloc { .. })
        ));
    }

    #[test]
    fn copy_bytes_copies_exactly_at_every_skew_and_length() {
        let src: Vec<u8> = (0..3 * 4096 + 7).map(|i| (i * 31 % 251) as u8).collect();
        let mut dst = AlignedVec::<u8>::zeroed(4 * 4096 + 128).unwrap();
        // Lengths around the piece size; destinations at skews in and out of the piecewise range.
        for len in [
            0,
            1,
            PIECE - 1,
            PIECE,
            PIECE + 1,
            2 * PIECE + 5,
            8192,
            src.len() - 64,
        ] {
            for skew in [0usize, 1, 16, 31, 32, 63, 64, 100] {
                let s = &src[..len];
                dst.iter_mut().for_each(|b| *b = 0xAA);
                let base = dst.as_mut_ptr();
                // The destination's offset from `base` gives it `skew` past the source mod 4 KiB.
                let off =
                    (skew + 4096 - (base as usize).wrapping_sub(s.as_ptr() as usize) % 4096) % 4096;
                // SAFETY: off + len <= dst.len(); src and dst are distinct allocations.
                unsafe { copy_bytes(s.as_ptr(), base.add(off), len) };
                assert_eq!(&dst[off..off + len], s, "len {len} skew {skew}");
                assert!(
                    dst[..off].iter().all(|&b| b == 0xAA),
                    "before: len {len} skew {skew}"
                );
                assert!(
                    dst[off + len..].iter().all(|&b| b == 0xAA),
                    "after: len {len} skew {skew}"
                );
            }
        }
    }
}
