//! Recordings: memory-mapped SigMF data files, their datatypes, window location and row decode.
//!
//! Window ids enumerate recordings in the given order; recording `r` contributes
//! `(samples - window) / stride + 1` windows (0 when shorter than the window). A prefix sum of
//! those counts locates any id by binary search, so opening costs O(recordings), not O(windows).

use std::fs::File;

use memmap2::Mmap;

use crate::error::{Error, Result};

/// On-disk complex sample format (SigMF `core:datatype`, complex, one channel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ci8,
    Cu8,
    Ci16Le,
    Ci16Be,
    Cf32Le,
    Cf32Be,
}

pub const KIND_NAMES: [&str; 6] = ["ci8", "cu8", "ci16_le", "ci16_be", "cf32_le", "cf32_be"];

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "ci8" => Kind::Ci8,
            "cu8" => Kind::Cu8,
            "ci16_le" => Kind::Ci16Le,
            "ci16_be" => Kind::Ci16Be,
            "cf32_le" => Kind::Cf32Le,
            "cf32_be" => Kind::Cf32Be,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ci8 => "ci8",
            Kind::Cu8 => "cu8",
            Kind::Ci16Le => "ci16_le",
            Kind::Ci16Be => "ci16_be",
            Kind::Cf32Le => "cf32_le",
            Kind::Cf32Be => "cf32_be",
        }
    }

    /// Bytes of one complex sample (I and Q).
    pub fn sample_bytes(self) -> usize {
        2 * self.storage().elem_bytes()
    }

    /// The storage dtype this kind has when all recordings share its family.
    pub fn storage(self) -> Storage {
        match self {
            Kind::Ci8 | Kind::Cu8 => Storage::Int8,
            Kind::Ci16Le | Kind::Ci16Be => Storage::Int16,
            Kind::Cf32Le | Kind::Cf32Be => Storage::Float32,
        }
    }
}

/// The dtype of assembled batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Int8,
    Int16,
    Float32,
}

impl Storage {
    pub fn name(self) -> &'static str {
        match self {
            Storage::Int8 => "int8",
            Storage::Int16 => "int16",
            Storage::Float32 => "float32",
        }
    }

    pub fn elem_bytes(self) -> usize {
        match self {
            Storage::Int8 => 1,
            Storage::Int16 => 2,
            Storage::Float32 => 4,
        }
    }
}

/// One memory-mapped recording.
pub struct Recording {
    pub path: String,
    pub kind: Kind,
    pub samples: u64,
    pub windows: u64,
    /// None when no window fits (also avoids mapping empty files).
    map: Option<Mmap>,
}

/// An ordered set of recordings cut into fixed windows.
pub struct Dataset {
    recordings: Vec<Recording>,
    window: u64,
    stride: u64,
    storage: Storage,
    /// `prefix[r]` = windows in recordings `0..r`; length `recordings + 1`.
    prefix: Vec<u64>,
    row_elems: usize,
}

impl Dataset {
    /// Maps every data file read-only and validates lengths, kinds and window geometry.
    pub fn open<P: AsRef<str>, K: AsRef<str>>(
        paths: &[P],
        kinds: &[K],
        window: u64,
        stride: u64,
    ) -> Result<Dataset> {
        if window < 1 {
            return Err(Error::config("window", format!("must be >= 1, got {window}")));
        }
        if stride < 1 {
            return Err(Error::config("stride", format!("must be >= 1, got {stride}")));
        }
        if kinds.len() != paths.len() {
            return Err(Error::config(
                "kinds",
                format!("has {} entries but data_paths has {}", kinds.len(), paths.len()),
            ));
        }
        let mut parsed = Vec::with_capacity(paths.len());
        for (p, k) in paths.iter().zip(kinds) {
            let (p, k) = (p.as_ref(), k.as_ref());
            let kind = Kind::parse(k).ok_or_else(|| {
                Error::data(
                    p,
                    "datatype",
                    format!("'{k}' is not supported (supported: {})", KIND_NAMES.join(", ")),
                )
            })?;
            parsed.push(kind);
        }
        let storage = match parsed.first() {
            Some(first) if parsed.iter().all(|k| k.storage() == first.storage()) => first.storage(),
            _ => Storage::Float32,
        };
        // Row size must be addressable (window * 2 * elem bytes, and the source span).
        let row_elems = usize::try_from(window)
            .ok()
            .and_then(|w| w.checked_mul(2))
            .filter(|e| e.checked_mul(8).is_some_and(|b| b <= isize::MAX as usize))
            .ok_or_else(|| Error::config("window", format!("{window} samples is too large")))?;

        let mut recordings = Vec::with_capacity(paths.len());
        let mut prefix = Vec::with_capacity(paths.len() + 1);
        prefix.push(0u64);
        let mut total = 0u64;
        for (p, kind) in paths.iter().zip(parsed) {
            let rec = Recording::open(p.as_ref(), kind, window, stride)?;
            total = total.checked_add(rec.windows).ok_or_else(|| {
                Error::data(p.as_ref(), "data length", "overflows the 2^64 window id space")
            })?;
            prefix.push(total);
            recordings.push(rec);
        }
        if total == 0 {
            return Err(Error::NoWindows {
                recordings: recordings.len(),
                window,
                longest: recordings.iter().map(|r| r.samples).max().unwrap_or(0),
            });
        }
        Ok(Dataset {
            recordings,
            window,
            stride,
            storage,
            prefix,
            row_elems,
        })
    }

    pub fn num_windows(&self) -> u64 {
        self.prefix[self.prefix.len() - 1]
    }
    pub fn window_len(&self) -> u64 {
        self.window
    }
    pub fn stride(&self) -> u64 {
        self.stride
    }
    pub fn storage(&self) -> Storage {
        self.storage
    }
    pub fn recordings(&self) -> &[Recording] {
        &self.recordings
    }
    /// Elements (I and Q scalars) in one output row: `2 * window`.
    pub fn row_elems(&self) -> usize {
        self.row_elems
    }
    /// Bytes of one output row in the storage dtype.
    pub fn row_bytes(&self) -> usize {
        self.row_elems * self.storage.elem_bytes()
    }

    pub fn check_id(&self, id: u64) -> Result<()> {
        if id < self.num_windows() {
            Ok(())
        } else {
            Err(Error::Index {
                what: "window id",
                index: id,
                len: self.num_windows(),
            })
        }
    }

    /// `(recording index, first sample)` of window `id`; `id` must be valid.
    pub fn locate(&self, id: u64) -> Result<(usize, u64)> {
        self.check_id(id)?;
        // First recording whose prefix end exceeds id; empty recordings have equal bounds and
        // are skipped by the strict comparison.
        let r = self.prefix.partition_point(|&p| p <= id) - 1;
        Ok((r, (id - self.prefix[r]) * self.stride))
    }

    /// Decodes window `id` into `out` (exactly `row_bytes()` bytes, storage dtype, native order).
    /// A pure function of `id`: batch bytes never depend on threads or prefetch.
    pub fn fill_row(&self, id: u64, out: &mut [u8]) -> Result<()> {
        let (r, start) = self.locate(id)?;
        if out.len() != self.row_bytes() {
            return Err(Error::config(
                "out",
                format!("row has {} bytes, expected {}", out.len(), self.row_bytes()),
            ));
        }
        let rec = &self.recordings[r];
        let sb = rec.kind.sample_bytes();
        // In range by construction: start + window <= samples, and samples * sb == file length.
        let lo = start as usize * sb;
        let src = &rec.bytes()[lo..lo + self.window as usize * sb];
        decode(rec.kind, self.storage, src, out);
        Ok(())
    }

    /// Fills `out` (`ids.len()` rows) in parallel; ids are validated first so a bad id leaves
    /// `out` untouched.
    pub fn gather(&self, ids: &[u64], out: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        for &id in ids {
            self.check_id(id)?;
        }
        let rb = self.row_bytes();
        let expected = ids.len().checked_mul(rb);
        if expected != Some(out.len()) {
            return Err(Error::config(
                "out",
                format!("has {} bytes, expected {} rows of {rb} bytes", out.len(), ids.len()),
            ));
        }
        if rb == 0 {
            return Ok(());
        }
        // A few rows per task amortises rayon's scheduling against ~µs row copies.
        out.par_chunks_mut(rb)
            .zip(ids.par_iter())
            .with_min_len(4)
            .try_for_each(|(row, &id)| self.fill_row(id, row))
    }
}

impl Recording {
    fn open(path: &str, kind: Kind, window: u64, stride: u64) -> Result<Recording> {
        let file = File::open(path)
            .map_err(|e| Error::data(path, "data file", format!("cannot be opened ({e})")))?;
        let meta = file
            .metadata()
            .map_err(|e| Error::data(path, "data file", format!("cannot be inspected ({e})")))?;
        if !meta.is_file() {
            return Err(Error::data(path, "data file", "is not a regular file"));
        }
        let len = meta.len();
        let sb = kind.sample_bytes() as u64;
        if len % sb != 0 {
            return Err(Error::data(
                path,
                "data length",
                format!(
                    "{len} bytes is not a whole number of {} samples ({sb} bytes each)",
                    kind.name()
                ),
            ));
        }
        if usize::try_from(len).is_err() {
            return Err(Error::data(path, "data length", format!("{len} bytes cannot be mapped")));
        }
        let samples = len / sb;
        let windows = if samples >= window {
            (samples - window) / stride + 1
        } else {
            0
        };
        let map = if windows > 0 {
            // SAFETY: read-only map; the data files are not modified while training (a file
            // truncated underneath would fault, as with any mmap reader such as numpy.memmap).
            let m = unsafe { Mmap::map(&file) }
                .map_err(|e| Error::data(path, "data file", format!("cannot be mapped ({e})")))?;
            if m.len() as u64 != len {
                return Err(Error::data(path, "data length", "changed while being mapped"));
            }
            Some(m)
        } else {
            None
        };
        Ok(Recording {
            path: path.to_owned(),
            kind,
            samples,
            windows,
            map,
        })
    }

    fn bytes(&self) -> &[u8] {
        self.map.as_deref().unwrap_or(&[])
    }
}

/// Converts one window of raw samples `src` (kind) into `out` (storage, native order).
/// `out.len() == src.len() / kind_elem_bytes * storage_elem_bytes`.
fn decode(kind: Kind, storage: Storage, src: &[u8], out: &mut [u8]) {
    const LE: bool = cfg!(target_endian = "little");
    match (kind, storage) {
        (Kind::Ci8, Storage::Int8) => out.copy_from_slice(src),
        (Kind::Cu8, Storage::Int8) => {
            for (o, &b) in out.iter_mut().zip(src) {
                *o = b ^ 0x80;
            }
        }
        (Kind::Ci16Le, Storage::Int16) | (Kind::Cf32Le, Storage::Float32) if LE => {
            out.copy_from_slice(src)
        }
        (Kind::Ci16Be, Storage::Int16) | (Kind::Cf32Be, Storage::Float32) if !LE => {
            out.copy_from_slice(src)
        }
        (Kind::Ci16Le | Kind::Ci16Be, Storage::Int16) => swap_bytes::<2>(src, out),
        (Kind::Cf32Le | Kind::Cf32Be, Storage::Float32) => swap_bytes::<4>(src, out),
        // Mixed datatypes: promote by value to f32 (no scaling).
        (_, Storage::Float32) => {
            let dst = out.chunks_exact_mut(4);
            match kind {
                Kind::Ci8 => dst
                    .zip(src)
                    .for_each(|(o, &b)| o.copy_from_slice(&(b as i8 as f32).to_ne_bytes())),
                Kind::Cu8 => dst.zip(src).for_each(|(o, &b)| {
                    o.copy_from_slice(&((b as i32 - 128) as f32).to_ne_bytes())
                }),
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
        }
        // Unreachable: integer storage is only chosen when every recording is of that family.
        (_, Storage::Int8 | Storage::Int16) => {
            debug_assert!(false, "{kind:?} cannot be stored as {storage:?}");
            out.fill(0)
        }
    }
}

#[inline]
fn swap_bytes<const N: usize>(src: &[u8], out: &mut [u8]) {
    for (o, s) in out.chunks_exact_mut(N).zip(src.chunks_exact(N)) {
        for j in 0..N {
            o[j] = s[N - 1 - j];
        }
    }
}
