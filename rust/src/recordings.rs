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
            return Err(Error::config(
                "window",
                format!("must be >= 1, got {window}"),
            ));
        }
        if stride < 1 {
            return Err(Error::config(
                "stride",
                format!("must be >= 1, got {stride}"),
            ));
        }
        if kinds.len() != paths.len() {
            return Err(Error::config(
                "kinds",
                format!(
                    "has {} entries but data_paths has {}",
                    kinds.len(),
                    paths.len()
                ),
            ));
        }
        let mut parsed = Vec::with_capacity(paths.len());
        for (p, k) in paths.iter().zip(kinds) {
            let (p, k) = (p.as_ref(), k.as_ref());
            let kind = Kind::parse(k).ok_or_else(|| {
                Error::data(
                    p,
                    "datatype",
                    format!(
                        "'{k}' is not supported (supported: {})",
                        KIND_NAMES.join(", ")
                    ),
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
                Error::data(
                    p.as_ref(),
                    "data length",
                    "overflows the 2^64 window id space",
                )
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
                format!(
                    "has {} bytes, expected {} rows of {rb} bytes",
                    out.len(),
                    ids.len()
                ),
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
            return Err(Error::data(
                path,
                "data length",
                format!("{len} bytes cannot be mapped"),
            ));
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
            // Windows are read in random order: without this the kernel's readahead (8 MiB per
            // fault on some block devices) turns every window into megabytes of I/O.
            #[cfg(unix)]
            let _ = m.advise(memmap2::Advice::Random);
            if m.len() as u64 != len {
                return Err(Error::data(
                    path,
                    "data length",
                    "changed while being mapped",
                ));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn row(ds: &Dataset, id: u64) -> Vec<u8> {
        let mut out = vec![0u8; ds.row_bytes()];
        ds.fill_row(id, &mut out).unwrap();
        out
    }

    fn i16s(b: &[u8]) -> Vec<i16> {
        b.chunks_exact(2)
            .map(|c| i16::from_ne_bytes([c[0], c[1]]))
            .collect()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn every_kind_decodes() {
        let t = TempDir::new("kinds");
        // 3 complex samples each: values -2..=3 as I/Q pairs.
        let vals: [i32; 6] = [-2, -1, 0, 1, 2, 3];
        let ci8: Vec<u8> = vals.iter().map(|&v| v as i8 as u8).collect();
        let cu8: Vec<u8> = vals.iter().map(|&v| (v + 128) as u8).collect();
        let i16le: Vec<u8> = vals
            .iter()
            .flat_map(|&v| (v as i16 * 1000).to_le_bytes())
            .collect();
        let i16be: Vec<u8> = vals
            .iter()
            .flat_map(|&v| (v as i16 * 1000).to_be_bytes())
            .collect();
        let f32le: Vec<u8> = vals
            .iter()
            .flat_map(|&v| (v as f32 * 0.5).to_le_bytes())
            .collect();
        let f32be: Vec<u8> = vals
            .iter()
            .flat_map(|&v| (v as f32 * 0.5).to_be_bytes())
            .collect();

        let int8 = |p: &str, k: &str| {
            let ds = Dataset::open(&[p], &[k], 3, 3).unwrap();
            assert_eq!(ds.storage(), Storage::Int8);
            row(&ds, 0)
                .iter()
                .map(|&b| b as i8 as i32)
                .collect::<Vec<_>>()
        };
        assert_eq!(int8(&t.file("a.ci8", &ci8), "ci8"), vals);
        assert_eq!(int8(&t.file("a.cu8", &cu8), "cu8"), vals);

        let want16: Vec<i16> = vals.iter().map(|&v| v as i16 * 1000).collect();
        for (name, bytes, kind) in [("le.i16", &i16le, "ci16_le"), ("be.i16", &i16be, "ci16_be")] {
            let ds = Dataset::open(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
            assert_eq!(ds.storage(), Storage::Int16);
            assert_eq!(i16s(&row(&ds, 0)), want16, "{kind}");
        }
        let wantf: Vec<f32> = vals.iter().map(|&v| v as f32 * 0.5).collect();
        for (name, bytes, kind) in [("le.f32", &f32le, "cf32_le"), ("be.f32", &f32be, "cf32_be")] {
            let ds = Dataset::open(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
            assert_eq!(ds.storage(), Storage::Float32);
            assert_eq!(f32s(&row(&ds, 0)), wantf, "{kind}");
        }

        // Mixed: every kind promoted by value to f32, recordings in the given order.
        let files = [
            (t.file("m.ci8", &ci8), "ci8", 1.0f32),
            (t.file("m.cu8", &cu8), "cu8", 1.0),
            (t.file("m.le16", &i16le), "ci16_le", 1000.0),
            (t.file("m.be16", &i16be), "ci16_be", 1000.0),
            (t.file("m.lef", &f32le), "cf32_le", 0.5),
            (t.file("m.bef", &f32be), "cf32_be", 0.5),
        ];
        let paths: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
        let kinds: Vec<&str> = files.iter().map(|f| f.1).collect();
        let ds = Dataset::open(&paths, &kinds, 3, 3).unwrap();
        assert_eq!(ds.storage(), Storage::Float32);
        assert_eq!(ds.num_windows(), 6);
        for (id, f) in files.iter().enumerate() {
            let want: Vec<f32> = vals.iter().map(|&v| v as f32 * f.2).collect();
            assert_eq!(f32s(&row(&ds, id as u64)), want, "{}", f.1);
        }
        // ci8 + cu8 stay int8.
        let ds = Dataset::open(&[paths[0], paths[1]], &["ci8", "cu8"], 3, 3).unwrap();
        assert_eq!(ds.storage(), Storage::Int8);
    }

    #[test]
    fn errors_name_file_and_field() {
        let t = TempDir::new("errors");
        let p = t.file("x.sigmf-data", &[0u8; 1001]);
        let e = Dataset::open(&[&p], &["ci16_le"], 1, 1).err().unwrap();
        assert!(matches!(e, Error::Data { .. }));
        assert_eq!(
            e.to_string(),
            format!("{p}: data length 1001 bytes is not a whole number of ci16_le samples (4 bytes each)")
        );
        let e = Dataset::open(&[&p], &["ri16_le"], 1, 1).err().unwrap();
        assert!(
            e.to_string()
                .starts_with(&format!("{p}: datatype 'ri16_le' is not supported")),
            "{e}"
        );
        let missing = t.0.join("missing.sigmf-data");
        let missing = missing.to_str().unwrap();
        let e = Dataset::open(&[missing], &["ci8"], 1, 1).err().unwrap();
        assert!(
            matches!(e, Error::Data { .. }) && e.to_string().starts_with(missing),
            "{e}"
        );
        let dir = t.0.to_str().unwrap();
        assert!(matches!(
            Dataset::open(&[dir], &["ci8"], 1, 1),
            Err(Error::Data { .. })
        ));
        let ok = t.file("ok", &[0u8; 8]);
        assert!(
            matches!(Dataset::open(&[&ok], &["ci8"], 0, 1), Err(Error::Config { ref key, .. }) if key == "window")
        );
        assert!(
            matches!(Dataset::open(&[&ok], &["ci8"], 1, 0), Err(Error::Config { ref key, .. }) if key == "stride")
        );
        assert!(
            matches!(Dataset::open(&[&ok], &["ci8", "ci8"], 1, 1), Err(Error::Config { ref key, .. }) if key == "kinds")
        );
        // Shorter than the window everywhere: no windows at all.
        assert!(matches!(
            Dataset::open(&[&ok], &["ci8"], 5, 1),
            Err(Error::NoWindows { .. })
        ));
        let empty: [&str; 0] = [];
        assert!(matches!(
            Dataset::open(&empty, &empty, 5, 1),
            Err(Error::NoWindows { .. })
        ));
        // Out-of-range id.
        let ds = Dataset::open(&[&ok], &["ci8"], 1, 1).unwrap();
        assert!(matches!(ds.locate(4), Err(Error::Index { .. })));
        let mut out = vec![0u8; 4];
        assert!(matches!(
            ds.gather(&[0, 9], &mut out),
            Err(Error::Index { .. })
        ));
        assert_eq!(out, [0u8; 4]);
    }

    #[test]
    fn window_location_with_stride_and_short_recordings() {
        let t = TempDir::new("locate");
        // ci8: sample k of recording r has I = 10*r + k (mod 128), Q = -I.
        let rec = |r: i32, samples: i32| -> Vec<u8> {
            (0..samples)
                .flat_map(|k| {
                    let i = (10 * r + k) as i8;
                    [i as u8, i.wrapping_neg() as u8]
                })
                .collect()
        };
        // window 4, stride 3: 10 samples -> 3 windows (starts 0,3,6); 3 samples -> 0; 4 -> 1; 0 -> 0.
        let paths = [
            t.file("r0", &rec(0, 10)),
            t.file("r1", &rec(1, 3)),
            t.file("r2", &rec(2, 4)),
            t.file("r3", &[]),
            t.file("r4", &rec(4, 12)),
        ];
        let ds = Dataset::open(&paths, &["ci8"; 5], 4, 3).unwrap();
        let counts: Vec<u64> = ds.recordings().iter().map(|r| r.windows).collect();
        assert_eq!(counts, [3, 0, 1, 0, 3]);
        let samples: Vec<u64> = ds.recordings().iter().map(|r| r.samples).collect();
        assert_eq!(samples, [10, 3, 4, 0, 12]);
        assert_eq!(ds.num_windows(), 7);
        let want = [(0, 0), (0, 3), (0, 6), (2, 0), (4, 0), (4, 3), (4, 6)];
        for (id, &(r, s)) in want.iter().enumerate() {
            assert_eq!(ds.locate(id as u64).unwrap(), (r, s), "id {id}");
            let got = row(&ds, id as u64);
            let exp: Vec<u8> = (0..4)
                .flat_map(|k| {
                    let i = (10 * r as i32 + s as i32 + k) as i8;
                    [i as u8, i.wrapping_neg() as u8]
                })
                .collect();
            assert_eq!(got, exp, "id {id}");
        }
        // gather = rows in id order.
        let ids = [6u64, 0, 3, 3];
        let mut out = vec![0u8; ids.len() * ds.row_bytes()];
        ds.gather(&ids, &mut out).unwrap();
        let exp: Vec<u8> = ids.iter().flat_map(|&i| row(&ds, i)).collect();
        assert_eq!(out, exp);
    }
}
