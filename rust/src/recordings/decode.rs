//! Row decode: raw samples of a recording's datatype into the storage dtype.

use super::datatype::{Kind, Storage};
use crate::error::{Error, Result};

/// Converts a row read straight from the file into the storage dtype, in place (same width).
pub(super) fn convert_in_place(kind: Kind, storage: Storage, buf: &mut [u8]) -> Result<()> {
    const LE: bool = cfg!(target_endian = "little");
    match (kind, storage) {
        (Kind::Ci8, Storage::Int8) => {}
        (Kind::Cu8, Storage::Int8) => buf.iter_mut().for_each(|b| *b ^= 0x80),
        (Kind::Ci16Le, Storage::Int16) | (Kind::Cf32Le, Storage::Float32) if LE => {}
        (Kind::Ci16Be, Storage::Int16) | (Kind::Cf32Be, Storage::Float32) if !LE => {}
        (Kind::Ci16Le | Kind::Ci16Be, Storage::Int16) => swap_bytes::<2>(buf),
        (Kind::Cf32Le | Kind::Cf32Be, Storage::Float32) => swap_bytes::<4>(buf),
        // Integer storage is only chosen when every recording is of that family.
        _ => {
            return Err(Error::Internal(format!(
                "{} cannot be stored as {}",
                kind.name(),
                storage.name()
            )))
        }
    }
    Ok(())
}

/// Mixed datatypes: promotes raw samples `src` of `kind` by value to float32 in `out` (no
/// scaling). `out.len() == src.len() / kind_elem_bytes * 4`.
pub(super) fn widen(kind: Kind, storage: Storage, src: &[u8], out: &mut [u8]) -> Result<()> {
    if storage != Storage::Float32 {
        return Err(Error::Internal(format!(
            "{} cannot be stored as {}",
            kind.name(),
            storage.name()
        )));
    }
    let dst = out.chunks_exact_mut(4);
    match kind {
        Kind::Ci8 => dst
            .zip(src)
            .for_each(|(o, &b)| o.copy_from_slice(&(b as i8 as f32).to_ne_bytes())),
        Kind::Cu8 => dst
            .zip(src)
            .for_each(|(o, &b)| o.copy_from_slice(&((b as i32 - 128) as f32).to_ne_bytes())),
        Kind::Ci16Le => dst.zip(src.chunks_exact(2)).for_each(|(o, s)| {
            let v = i16::from_le_bytes([s[0], s[1]]) as f32;
            o.copy_from_slice(&v.to_ne_bytes())
        }),
        Kind::Ci16Be => dst.zip(src.chunks_exact(2)).for_each(|(o, s)| {
            let v = i16::from_be_bytes([s[0], s[1]]) as f32;
            o.copy_from_slice(&v.to_ne_bytes())
        }),
        Kind::Cf32Le => dst.zip(src.chunks_exact(4)).for_each(|(o, s)| {
            let v = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            o.copy_from_slice(&v.to_ne_bytes())
        }),
        Kind::Cf32Be => dst.zip(src.chunks_exact(4)).for_each(|(o, s)| {
            let v = f32::from_be_bytes([s[0], s[1], s[2], s[3]]);
            o.copy_from_slice(&v.to_ne_bytes())
        }),
    }
    Ok(())
}

#[inline]
fn swap_bytes<const N: usize>(buf: &mut [u8]) {
    for c in buf.chunks_exact_mut(N) {
        c.reverse();
    }
}
