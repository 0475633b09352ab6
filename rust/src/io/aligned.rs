//! Cache-line aligned buffers for bulk copies (batch rows, digest reads).

use std::alloc::Layout;
use std::marker::PhantomData;

use crate::error::{Error, Result};

/// Element types whose every bit pattern is valid, so a byte view of them is sound.
///
/// # Safety
/// Implementors have no padding, no invalid bit patterns and alignment <= 64.
pub unsafe trait Plain: Copy {}
// SAFETY: u8 is one byte: no padding, all 256 values valid, alignment 1.
unsafe impl Plain for u8 {}
// SAFETY: i8 is one byte: no padding, all 256 values valid, alignment 1.
unsafe impl Plain for i8 {}
// SAFETY: i16 is two bytes with no padding; every bit pattern is a value; alignment 2.
unsafe impl Plain for i16 {}
// SAFETY: f32 is four bytes with no padding; every bit pattern is a float (NaNs included, which
// are values, not undefined behaviour); alignment 4.
unsafe impl Plain for f32 {}

/// The allocation unit of aligned buffers: one 64-byte cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct CacheLine([u8; 64]);

/// A zero-initialised array of `len` plain elements that starts on a 64-byte boundary.
///
/// Why: bulk copies run as `rep movsb` (glibc memcpy, and the kernel's copy behind `pread`),
/// which on the AMD EPYC development machine measured here runs 3-5x slower when the
/// destination lies 1 to 31 bytes past the page-aligned source modulo 4 KiB (copies from a
/// mapping sidestep it: see `copy_bytes` in this module). A plain `Vec` of 1-2 MiB comes from
/// `mmap` via malloc at 16 bytes
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
            // SAFETY: `layout` has a non-zero size (n > 0), as alloc_zeroed needs; a null result
            // is returned as an error before use. Otherwise the block comes from the global
            // allocator with exactly the layout of n CacheLines (size and alignment), all n of
            // them initialised (all-zero bytes are a valid CacheLine), so Vec::from_raw_parts
            // may own it with length and capacity n.
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
        // SAFETY: the lines hold ceil(len * size_of::<T>() / 64) * 64 >= len * size_of::<T>()
        // initialised bytes (zeroed at allocation, written only as T since), aligned to 64 >=
        // align_of::<T>() (Plain), and every bit pattern is a valid T (Plain); the slice
        // borrows `self`, so the lines outlive it and are not written meanwhile. With len 0 an
        // empty Vec's dangling pointer is non-null and 64-aligned, all an empty slice needs.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [T] {
        // SAFETY: as in `as_slice` (size, initialisation, alignment, validity); `&mut self`
        // makes this the only borrow of the lines, and any bytes written through it leave valid
        // T values (Plain).
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

/// Bytes copied per `memcpy` call when `copy_bytes` avoids `rep movsb`: below glibc's default
/// `rep_movsb_threshold` (2048 bytes with SSE2, 2112 with FSRM as here, 8 KiB and more with
/// AVX2/AVX-512), so glibc copies them with vector loops. A `GLIBC_TUNABLES` threshold set below
/// 1 KiB would send the pieces back to `rep movsb` (and its slow distance).
const PIECE: usize = 1024;

/// True when `copy_bytes` copies in pieces: x86-64 with glibc, more than one piece, and the
/// destination 1 to 31 bytes past the source modulo 4 KiB.
///
/// Why: glibc's memcpy copies blocks above its threshold with `rep movsb`, which on the AMD EPYC
/// development machine measured here runs 4-5x slower at those distances. 256 rows of 8 KiB
/// from a page-aligned mapping into a batch at distance 1, 8 or 16 took 1.1-1.3 ms; at 0, 32, 48, 63, 64, 65, 96,
/// 128, 256, 1024, 2048, 4032, 4080 and 4095 they took 0.22-0.30 ms
/// (docs/design.md "Assembly, prefetch, ring"; the figures:
/// bench/results/loader_cpu_2026-12-02.md). A `malloc`ed 2 MiB numpy batch starts 16 bytes past
/// a page. Elsewhere (another
/// architecture, or musl, whose memcpy does not use `rep movsb` this way) one `memcpy` is kept.
pub(crate) fn piecewise(src: *const u8, dst: *const u8, len: usize) -> bool {
    let skew = (dst as usize).wrapping_sub(src as usize) % 4096;
    cfg!(all(target_arch = "x86_64", target_env = "gnu")) && len > PIECE && (1..32).contains(&skew)
}

/// Copies `len` bytes from `src` to `dst`: one `memcpy`, or 1 KiB pieces where `piecewise` says
/// one `memcpy` would be slow. Measured for rows copied from a file mapping: a ring of numpy
/// buffers 16 bytes past a page took 0.243 ms a batch against 0.648 ms in one `memcpy` a row
/// (64-byte aligned torch buffers: 0.185-0.200 ms).
///
/// # Safety
/// As `ptr::copy_nonoverlapping`: `src` readable and `dst` writable for `len` bytes, the two
/// ranges disjoint.
pub(crate) unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize) {
    let piece = if piecewise(src, dst, len) { PIECE } else { len };
    let mut at = 0;
    while at < len {
        let n = piece.min(len - at);
        // SAFETY: [at, at + n) lies within [0, len), where the caller guarantees `src` readable,
        // `dst` writable and the two ranges disjoint; at + n <= len, so both `add`s stay inside
        // their ranges.
        unsafe { std::ptr::copy_nonoverlapping(src.add(at), dst.add(at), n) };
        at += n;
    }
}

/// The bytes of `v`, writable: any bytes written leave valid `T`s (`Plain`).
pub fn bytes_mut<T: Plain>(v: &mut [T]) -> &mut [u8] {
    // SAFETY: the result covers exactly v's size_of_val bytes and borrows `v` mutably for its
    // whole life, so nothing else can see them meanwhile; T is Plain (no padding, so every
    // byte is initialised; every bit pattern valid, so any byte written leaves a valid T); u8
    // has alignment 1.
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
    fn pieces_only_at_the_slow_distances_and_above_one_piece() {
        let src = 0x10_0000 as *const u8;
        let at = |skew: usize| (0x20_0000 + skew) as *const u8;
        let x86_gnu = cfg!(all(target_arch = "x86_64", target_env = "gnu"));
        for skew in [1, 16, 31] {
            assert_eq!(piecewise(src, at(skew), 8192), x86_gnu, "skew {skew}");
            assert_eq!(piecewise(src, at(skew), PIECE + 1), x86_gnu, "skew {skew}");
            assert!(!piecewise(src, at(skew), PIECE), "one piece: skew {skew}");
            // The destination's distance past the source: the other way round (4065-4095 past
            // it, modulo 4 KiB) was measured at full speed.
            assert!(!piecewise(at(skew), src, 8192), "reverse: skew {skew}");
        }
        for skew in [0, 32, 63, 64, 4095] {
            assert!(!piecewise(src, at(skew), 8192), "skew {skew}");
        }
        assert_eq!(piecewise(src, at(4096 + 16), 8192), x86_gnu);
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
            for skew in [0usize, 1, 16, 31, 32, 63, 64, 100, 4095] {
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
