//! Row decode: raw samples of a recording's datatype into the storage dtype.
//!
//! Every scalar is converted by value, never scaled: `cu8` is `b - 128` and `cu16` is
//! `u - 32768` (as int8 / int16, or as float32 in a mixed dataset), `cu32` is `u - 2^31`; the
//! 32-bit integers and `cf64` become the nearest float32 (ties to even, as numpy's
//! `astype(np.float32)` gives; float64 beyond float32's range becomes infinity, NaN stays NaN).
//! Big-endian kinds (and little-endian ones on a big-endian host) are byte-swapped.
//!
//! Two paths: [`convert_in_place`] for a row read straight into the output (the raw scalar as
//! wide as the stored one: 8-bit kinds into int8, 16-bit into int16, `cf32`, `ci32` and `cu32`
//! into float32), and [`convert_frames`] for everything else (widening, `cf64`, and one channel
//! out of interleaved multi-channel frames), from a scratch buffer.

use super::datatype::{Kind, Scalar, Storage};
use crate::error::{Error, Result};

/// Whether `kind`'s scalars are in the host's byte order.
fn native(kind: Kind) -> bool {
    kind.big_endian() == cfg!(target_endian = "big")
}

fn unsupported(kind: Kind, storage: Storage) -> Error {
    Error::Internal(format!(
        "{} cannot be stored as {}",
        kind.name(),
        storage.name()
    ))
}

/// Calls `$f($args..., closure)` with a closure that reads one scalar of type `$t` in the byte
/// order `$be` says into `$v` and returns `$body` (the output scalar's bytes). The order is
/// chosen once, outside the loop in `$f`.
macro_rules! by_order {
    ($be:expr, $t:ty, |$v:ident| $body:expr, $f:ident($($arg:expr),*)) => {
        if $be {
            $f($($arg,)* |b| {
                let $v = <$t>::from_be_bytes(b);
                $body
            })
        } else {
            $f($($arg,)* |b| {
                let $v = <$t>::from_le_bytes(b);
                $body
            })
        }
    };
}

#[inline(always)]
fn array<const N: usize>(s: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(s);
    a
}

/// Replaces every `N`-byte scalar of `buf` by `f` of it.
#[inline(always)]
fn in_place<const N: usize>(buf: &mut [u8], f: impl Fn([u8; N]) -> [u8; N]) {
    for c in buf.chunks_exact_mut(N) {
        let v = f(array(c));
        c.copy_from_slice(&v);
    }
}

/// Converts a row read straight from the file into the storage dtype, in place: the kind's
/// scalars must be as wide as the storage's (one channel).
pub(super) fn convert_in_place(kind: Kind, storage: Storage, buf: &mut [u8]) -> Result<()> {
    let be = kind.big_endian();
    match (kind.scalar(), storage) {
        (Scalar::I8, Storage::Int8) => {}
        (Scalar::U8, Storage::Int8) => buf.iter_mut().for_each(|b| *b ^= 0x80),
        (Scalar::I16, Storage::Int16) | (Scalar::F32, Storage::Float32) if native(kind) => {}
        // The other byte order: a swap of whole scalars (`u16`/`u32::swap_bytes`), which the
        // compiler vectorises; reversing each chunk of bytes was 2-6x slower here.
        (Scalar::I16, Storage::Int16) => in_place(buf, |b: [u8; 2]| {
            u16::from_ne_bytes(b).swap_bytes().to_ne_bytes()
        }),
        (Scalar::F32, Storage::Float32) => in_place(buf, |b: [u8; 4]| {
            u32::from_ne_bytes(b).swap_bytes().to_ne_bytes()
        }),
        (Scalar::U16, Storage::Int16) => by_order!(
            be,
            u16,
            |v| ((v ^ 0x8000) as i16).to_ne_bytes(),
            in_place(buf)
        ),
        (Scalar::I32, Storage::Float32) => {
            by_order!(be, i32, |v| (v as f32).to_ne_bytes(), in_place(buf))
        }
        (Scalar::U32, Storage::Float32) => by_order!(
            be,
            u32,
            |v| (((v ^ 0x8000_0000) as i32) as f32).to_ne_bytes(),
            in_place(buf)
        ),
        // Integer storage is only chosen when every recording is of that family; other widths
        // go through `convert_frames`.
        _ => return Err(unsupported(kind, storage)),
    }
    Ok(())
}

/// Writes `f` of each sample's I and Q scalars (`N` bytes each, `at` bytes into each `frame`
/// of `src`) to consecutive `M`-byte scalars of `out`.
#[inline(always)]
fn frames<const N: usize, const M: usize>(
    src: &[u8],
    frame: usize,
    at: usize,
    out: &mut [u8],
    f: impl Fn([u8; N]) -> [u8; M],
) {
    if frame == 2 * N {
        // One channel: the scalars are contiguous.
        for (o, s) in out.chunks_exact_mut(M).zip(src.chunks_exact(N)) {
            o.copy_from_slice(&f(array(s)));
        }
    } else {
        for (o, fr) in out.chunks_exact_mut(2 * M).zip(src.chunks_exact(frame)) {
            let (i, q) = o.split_at_mut(M);
            i.copy_from_slice(&f(array(&fr[at..at + N])));
            q.copy_from_slice(&f(array(&fr[at + N..at + 2 * N])));
        }
    }
}

/// Converts raw frames `src` of `kind` (one sample frame of `frame` bytes per output sample,
/// the wanted channel's I/Q pair `at` bytes into each) by value into the storage dtype in
/// `out`, which must hold exactly one output sample per frame.
pub(super) fn convert_frames(
    kind: Kind,
    storage: Storage,
    src: &[u8],
    frame: usize,
    at: usize,
    out: &mut [u8],
) -> Result<()> {
    let sb = kind.sample_bytes();
    let fits = at.checked_add(sb).is_some_and(|end| end <= frame)
        && src.len() % frame == 0
        && (src.len() / frame).checked_mul(2 * storage.elem_bytes()) == Some(out.len());
    if !fits {
        return Err(Error::Internal(format!(
            "{} bytes of {}-byte frames (sample at {at}) do not fill {} bytes of {}",
            src.len(),
            frame,
            out.len(),
            storage.name()
        )));
    }
    let be = kind.big_endian();
    match (kind.scalar(), storage) {
        (Scalar::I8, Storage::Int8) => {
            by_order!(be, i8, |v| v.to_ne_bytes(), frames(src, frame, at, out))
        }
        (Scalar::U8, Storage::Int8) => by_order!(
            be,
            u8,
            |v| ((v ^ 0x80) as i8).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::I16, Storage::Int16) => {
            by_order!(be, i16, |v| v.to_ne_bytes(), frames(src, frame, at, out))
        }
        (Scalar::U16, Storage::Int16) => by_order!(
            be,
            u16,
            |v| ((v ^ 0x8000) as i16).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::I8, Storage::Float32) => by_order!(
            be,
            i8,
            |v| f32::from(v).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::U8, Storage::Float32) => by_order!(
            be,
            u8,
            |v| f32::from((v ^ 0x80) as i8).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::I16, Storage::Float32) => by_order!(
            be,
            i16,
            |v| f32::from(v).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::U16, Storage::Float32) => by_order!(
            be,
            u16,
            |v| f32::from((v ^ 0x8000) as i16).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::I32, Storage::Float32) => by_order!(
            be,
            i32,
            |v| (v as f32).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::U32, Storage::Float32) => by_order!(
            be,
            u32,
            |v| (((v ^ 0x8000_0000) as i32) as f32).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        (Scalar::F32, Storage::Float32) => {
            by_order!(be, f32, |v| v.to_ne_bytes(), frames(src, frame, at, out))
        }
        (Scalar::F64, Storage::Float32) => by_order!(
            be,
            f64,
            |v| (v as f32).to_ne_bytes(),
            frames(src, frame, at, out)
        ),
        _ => return Err(unsupported(kind, storage)),
    }
    Ok(())
}
