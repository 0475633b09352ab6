//! Recordings: SigMF data files, their datatypes, capture segments, window location and row
//! decode.
//!
//! A recording is cut into capture segments. SigMF `captures` each run from their
//! `core:sample_start` to the next capture's (or to the end of the data); samples before the
//! first capture, if it does not start at 0, form a leading segment of their own (they are in the
//! data file, so they are read rather than dropped silently). Each segment is windowed on its own:
//! a segment of `len` samples contributes `(len - window) / stride + 1` windows (0 when shorter)
//! starting at multiples of `stride` from the segment start, so no window crosses a capture
//! boundary (a retune, or a `core:global_index` jump marking dropped samples) or a recording.
//! Window ids enumerate recordings in the given order, then their segments, then windows; a
//! recording with one capture at 0 has exactly the ids it had before segments existed. A prefix
//! sum over segments locates any id by binary search, so opening costs O(segments), not
//! O(windows).
//!
//! A dataset may be restricted to chosen windows ([`Dataset::select`]): a table of base window
//! ids (the numbering above) that `locate` maps every id through, so rows, gathers and streams
//! see only the selected windows, each id still O(1) to locate.
//!
//! Samples of a data file of at least [`ReadPolicy::map_min_bytes`] are copied out of a guarded
//! memory map ([`crate::mapped`]); smaller files (and any mapping that saw a fault) are read
//! with positioned reads (`pread`). Either way a data file truncated while a run reads it is
//! reported as [`Error::LengthChanged`] naming the file, never as a SIGBUS: a fault in a
//! guarded copy is absorbed and the row re-read with `pread`, which comes up short; the lengths
//! of the mapped files a gather touched are checked after it (a truncation inside a window's
//! last page raises no fault).
//!
//! A dataset holds at most [`ReadPolicy::max_open_files`] descriptors ([`crate::files`]): more
//! recordings than that are opened again by path when read, and must still be the file opened
//! at dataset open.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::ops::Range;

use crate::error::{Error, Result};
use crate::files::{FileId, FilePool, Held};
use crate::mapped::{Mapping, DEFAULT_MAP_MIN_BYTES, MAX_MAPPED};

/// How rows are read: data files of at least `map_min_bytes` are mapped (at most
/// [`MAX_MAPPED`] of them), the rest read with `pread`. `u64::MAX` maps nothing. At most
/// `max_open_files` data files are open at once (`usize::MAX`: every recording with a window
/// stays open).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadPolicy {
    pub map_min_bytes: u64,
    pub max_open_files: usize,
}

impl Default for ReadPolicy {
    fn default() -> Self {
        ReadPolicy {
            map_min_bytes: DEFAULT_MAP_MIN_BYTES,
            max_open_files: usize::MAX,
        }
    }
}

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

/// One recording: its data file (open in the dataset's pool while any window reads from it) and
/// its segments.
pub struct Recording {
    pub path: String,
    pub kind: Kind,
    pub samples: u64,
    pub windows: u64,
    /// This recording's entries in [`Dataset::segments`].
    pub segments: Range<usize>,
    /// The data file's device and inode at open: a file opened again must be this one.
    id: Option<FileId>,
    /// The guarded mapping rows are copied from, when the policy maps this file.
    map: Option<Mapping>,
    /// The mapped file's status-change and modification times at open (seconds, nanoseconds):
    /// a truncation that the file then regrew past leaves its length as it was, not these.
    stamp: Option<[i64; 4]>,
}

/// `[ctime, ctime_nsec, mtime, mtime_nsec]` of a file's status (None where unavailable).
fn stamp(m: &std::fs::Metadata) -> Option<[i64; 4]> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some([m.ctime(), m.ctime_nsec(), m.mtime(), m.mtime_nsec()])
    }
    #[cfg(not(unix))]
    {
        let _ = m;
        None
    }
}

/// A run of samples of one recording that is windowed on its own (one SigMF capture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index of the recording in [`Dataset::recordings`].
    pub recording: usize,
    /// First sample, counted from the start of the data file.
    pub start: u64,
    pub samples: u64,
    pub windows: u64,
}

/// Windows of `window` samples at multiples of `stride` that fit in `samples` samples.
pub fn window_count(samples: u64, window: u64, stride: u64) -> u64 {
    if samples >= window && window > 0 && stride > 0 {
        (samples - window) / stride + 1
    } else {
        0
    }
}

/// The segments `(start, samples)` of a recording of `samples` samples whose captures start at
/// `starts` (each capture's `core:sample_start`, in metadata order). No captures is one segment
/// covering the file; a first capture after 0 adds a leading segment `[0, starts[0])`. A capture
/// starting exactly at the end of the data gives an empty segment. Errors name the file and
/// `captures[i].core:sample_start`.
pub fn capture_segments(path: &str, starts: &[u64], samples: u64) -> Result<Vec<(u64, u64)>> {
    let field = |i: usize| format!("captures[{i}].core:sample_start");
    let mut out = Vec::with_capacity(starts.len() + 1);
    match starts.first() {
        None => return Ok(vec![(0, samples)]),
        Some(&first) if first > 0 => out.push((0, first.min(samples))),
        Some(_) => {}
    }
    for (i, &s) in starts.iter().enumerate() {
        if i > 0 && s <= starts[i - 1] {
            return Err(Error::data(
                path,
                &field(i),
                format!(
                    "{s} is not after the previous capture's {} (captures must start at strictly increasing samples)",
                    starts[i - 1]
                ),
            ));
        }
        if s > samples {
            return Err(Error::data(
                path,
                &field(i),
                format!("{s} is beyond the end of the data ({samples} samples)"),
            ));
        }
        let end = starts.get(i + 1).map_or(samples, |&e| e.min(samples));
        // end < s only when the next start is out of order or out of range: reported next round.
        out.push((s, end.saturating_sub(s)));
    }
    Ok(out)
}

/// An ordered set of recordings cut into fixed windows, segment by segment.
pub struct Dataset {
    recordings: Vec<Recording>,
    /// The open data files (at most `ReadPolicy::max_open_files`).
    files: FilePool,
    segments: Vec<Segment>,
    window: u64,
    stride: u64,
    storage: Storage,
    /// `prefix[s]` = windows in segments `0..s`; length `segments + 1`.
    prefix: Vec<u64>,
    row_elems: usize,
    /// With a selection ([`Dataset::select`]): window `i` of the dataset is base window
    /// `selection[i]` (base: the numbering without a selection).
    selection: Option<Vec<u64>>,
}

impl Dataset {
    /// Opens every data file, validates lengths, kinds, capture starts and window geometry.
    ///
    /// `captures[r]` holds recording `r`'s capture starts (`core:sample_start`, see
    /// [`capture_segments`]); an empty list means one segment covering the whole file.
    pub fn open<P: AsRef<str>, K: AsRef<str>, C: AsRef<[u64]>>(
        paths: &[P],
        kinds: &[K],
        captures: &[C],
        window: u64,
        stride: u64,
    ) -> Result<Dataset> {
        Self::open_with(
            paths,
            kinds,
            captures,
            window,
            stride,
            ReadPolicy::default(),
        )
    }

    /// [`Dataset::open`] with an explicit [`ReadPolicy`].
    pub fn open_with<P: AsRef<str>, K: AsRef<str>, C: AsRef<[u64]>>(
        paths: &[P],
        kinds: &[K],
        captures: &[C],
        window: u64,
        stride: u64,
        policy: ReadPolicy,
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
        for (key, len) in [("kinds", kinds.len()), ("captures", captures.len())] {
            if len != paths.len() {
                return Err(Error::config(
                    key,
                    format!("has {len} entries but data_paths has {}", paths.len()),
                ));
            }
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
        let mut segments = Vec::with_capacity(paths.len());
        let mut prefix = Vec::with_capacity(paths.len() + 1);
        prefix.push(0u64);
        let mut total = 0u64;
        let mut mapped = 0usize;
        let mut files = FilePool::new(paths.len(), policy.max_open_files)?;
        for (r, ((p, kind), starts)) in paths.iter().zip(parsed).zip(captures).enumerate() {
            let path = p.as_ref();
            let (file, meta, samples) = open_data(path, kind)?;
            let first = segments.len();
            let mut windows = 0u64;
            for (start, len) in capture_segments(path, starts.as_ref(), samples)? {
                let w = window_count(len, window, stride);
                windows += w; // <= samples / stride: cannot overflow
                total = total.checked_add(w).ok_or_else(|| {
                    Error::data(path, "data length", "overflows the 2^64 window id space")
                })?;
                prefix.push(total);
                segments.push(Segment {
                    recording: r,
                    start,
                    samples: len,
                    windows: w,
                });
            }
            let bytes = samples * kind.sample_bytes() as u64;
            let map = (windows > 0 && bytes >= policy.map_min_bytes && mapped < MAX_MAPPED)
                .then(|| Mapping::new(&file, bytes))
                .flatten();
            mapped += usize::from(map.is_some());
            let stamp = map.as_ref().and_then(|_| stamp(&meta));
            // Unusable recordings hold no descriptor, nor (when the pool cannot hold every
            // file) do mapped ones, whose rows need none; the rest while the pool has room.
            if windows > 0 && (map.is_none() || files.holds_all()) {
                files.offer(r, file);
            }
            recordings.push(Recording {
                path: path.to_owned(),
                kind,
                samples,
                windows,
                segments: first..segments.len(),
                id: FileId::of(&meta),
                map,
                stamp,
            });
        }
        if total == 0 {
            return Err(Error::NoWindows {
                recordings: recordings.len(),
                window,
                longest: segments.iter().map(|s| s.samples).max().unwrap_or(0),
            });
        }
        Ok(Dataset {
            recordings,
            files,
            segments,
            window,
            stride,
            storage,
            prefix,
            row_elems,
            selection: None,
        })
    }

    /// The dataset restricted to the windows `ids` (base ids: the numbering without a
    /// selection, as [`Dataset::base_windows`] counts them): window `i` of the result is base
    /// window `ids[i]`, so `num_windows()` is `ids.len()` and everything that reads rows (rows,
    /// gathers, streams) sees only those windows. Order is kept and repeats are allowed (a
    /// repeated id is one more window of the result). A selection replaces any earlier one.
    /// Recordings and segments keep their base counts. An empty selection is a config error
    /// (`select`), an id beyond the base windows an index error.
    pub fn select(mut self, ids: Vec<u64>) -> Result<Dataset> {
        if ids.is_empty() {
            return Err(Error::config(
                "select",
                "selects no window (give at least one window id)",
            ));
        }
        let base = self.base_windows();
        if let Some(&bad) = ids.iter().find(|&&id| id >= base) {
            return Err(Error::Index {
                what: "selected window id",
                index: bad,
                len: base,
            });
        }
        self.selection = Some(ids);
        Ok(self)
    }

    /// Windows of the dataset: the selection's length when there is one, else
    /// [`Dataset::base_windows`].
    pub fn num_windows(&self) -> u64 {
        match &self.selection {
            Some(table) => table.len() as u64,
            None => self.base_windows(),
        }
    }
    /// Windows of every segment of every recording, whatever the selection.
    pub fn base_windows(&self) -> u64 {
        self.prefix[self.prefix.len() - 1]
    }
    /// The selection's base window ids ([`Dataset::select`]), if any.
    pub fn selection(&self) -> Option<&[u64]> {
        self.selection.as_deref()
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
    /// Every capture segment, recordings in order, each recording's segments in order.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
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

    /// `(recording index, first sample)` of window `id`; `id` must be valid. With a selection,
    /// `id` indexes the selection, which names the base window located.
    pub fn locate(&self, id: u64) -> Result<(usize, u64)> {
        self.check_id(id)?;
        let id = match &self.selection {
            // In range: check_id bounds id by the table's length.
            Some(table) => table[id as usize],
            None => id,
        };
        // First segment whose prefix end exceeds id; segments without windows have equal
        // bounds and are skipped by the strict comparison. O(log segments).
        let s = self.prefix.partition_point(|&p| p <= id) - 1;
        let seg = &self.segments[s];
        Ok((
            seg.recording,
            seg.start + (id - self.prefix[s]) * self.stride,
        ))
    }

    /// Decodes window `id` into `out` (exactly `row_bytes()` bytes, storage dtype, native order).
    /// A pure function of `id` and the file contents: batch bytes never depend on threads or
    /// prefetch, nor on whether the file is mapped. A file that changed length is
    /// [`Error::LengthChanged`].
    pub fn fill_row(&self, id: u64, out: &mut [u8]) -> Result<()> {
        self.gather(std::slice::from_ref(&id), out)
    }

    /// One row, without the length check of mapped files; returns its recording's index and
    /// whether the bytes came from the mapping (the rows that check is for).
    fn decode_row(&self, id: u64, out: &mut [u8]) -> Result<RowSource> {
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
        let offset = start * sb as u64;
        let raw = self.window as usize * sb;
        let mapped = if raw == out.len() {
            // Same element width as the storage: read straight into the row, fix up in place.
            let mapped = self.read_at(r, out, offset)?;
            convert_in_place(rec.kind, self.storage, out)?;
            mapped
        } else {
            // Widening to float32 (mixed datatypes): raw bytes go through a per-thread scratch
            // row, kept between calls so the hot path does not allocate.
            thread_local!(static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) });
            SCRATCH.with(|cell| {
                // take/set rather than a RefCell borrow: nothing here can panic on re-entry.
                let mut scratch = cell.take();
                if scratch.len() < raw + 64 {
                    scratch.resize(raw + 64, 0);
                }
                // Cache-line aligned like the batch rows (see stream::AlignedVec for why).
                let at = scratch.as_ptr().align_offset(64).min(64);
                let src = &mut scratch[at..at + raw];
                let res = self.read_at(r, src, offset).and_then(|mapped| {
                    widen(rec.kind, self.storage, src, out)?;
                    Ok(mapped)
                });
                cell.set(scratch);
                res
            })?
        };
        Ok((r, mapped))
    }

    /// Checks every id, and that `out` holds exactly `ids.len()` rows: a batch that fails here
    /// leaves `out` untouched.
    pub(crate) fn check_batch(&self, ids: &[u64], out_len: usize) -> Result<()> {
        for &id in ids {
            self.check_id(id)?;
        }
        let rb = self.row_bytes();
        if ids.len().checked_mul(rb) != Some(out_len) {
            return Err(Error::config(
                "out",
                format!(
                    "has {out_len} bytes, expected {} rows of {rb} bytes",
                    ids.len()
                ),
            ));
        }
        Ok(())
    }

    /// Decodes `ids` into consecutive rows of `out` (checked by `check_batch`), recording each
    /// row's source in `sources`: the part of a gather any thread may do for a run of rows.
    pub(crate) fn decode_rows(
        &self,
        ids: &[u64],
        out: &mut [u8],
        sources: &mut [RowSource],
    ) -> Result<()> {
        let rb = self.row_bytes();
        for ((row, &id), src) in out.chunks_exact_mut(rb).zip(ids).zip(sources) {
            *src = self.decode_row(id, row)?;
        }
        Ok(())
    }

    /// The end of every gather, once all its rows are decoded: a mapped file cut inside a
    /// window's last page raised no fault, so each file the batch copied rows from is checked
    /// once, and the rows of any that changed are read again (with `pread`).
    pub(crate) fn recheck(&self, ids: &[u64], out: &mut [u8], sources: &[RowSource]) -> Result<()> {
        let mut touched: Vec<usize> = sources.iter().filter(|r| r.1).map(|r| r.0).collect();
        touched.sort_unstable();
        touched.dedup();
        touched.retain(|&r| self.changed(r));
        if touched.is_empty() {
            return Ok(());
        }
        let rb = self.row_bytes();
        for ((row, &id), &(r, mapped)) in out.chunks_exact_mut(rb).zip(ids).zip(sources) {
            if mapped && touched.binary_search(&r).is_ok() {
                self.decode_row(id, row)?;
            }
        }
        Ok(())
    }

    /// Fills `out` (`ids.len()` rows) in parallel on rayon's pool; ids are validated first so a
    /// bad id leaves `out` untouched.
    pub fn gather(&self, ids: &[u64], out: &mut [u8]) -> Result<()> {
        use rayon::prelude::*;
        self.check_batch(ids, out.len())?;
        let rb = self.row_bytes();
        if rb == 0 {
            return Ok(());
        }
        // A few rows per task amortises rayon's scheduling against ~µs row reads. Each row's
        // recording, and whether it was copied from the mapping, come back for the check below.
        let sources: Vec<RowSource> = out
            .par_chunks_mut(rb)
            .zip(ids.par_iter())
            .with_min_len(4)
            .map(|(row, &id)| self.decode_row(id, row))
            .collect::<Result<_>>()?;
        self.recheck(ids, out, &sources)
    }
}

/// Where a gathered row's bytes came from: its recording's index, and whether they were copied
/// from the mapping (the rows `Dataset::recheck` is for).
pub(crate) type RowSource = (usize, bool);

/// Opens a regular file for reading and returns it with its status.
pub(crate) fn open_regular(path: &str) -> Result<(File, std::fs::Metadata)> {
    // stat before open: opening a FIFO (or a device) for reading can block forever.
    let kind = std::fs::metadata(path)
        .map_err(|e| Error::data(path, "data file", format!("cannot be inspected ({e})")))?;
    if !kind.is_file() {
        return Err(Error::data(path, "data file", "is not a regular file"));
    }
    let file = File::open(path).map_err(|e| {
        let msg = if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) {
            format!(
                "cannot be opened: no file descriptor is left ({e}); raise the open-file \
                 limit (ulimit -n) or lower max_open_files"
            )
        } else {
            format!("cannot be opened ({e})")
        };
        Error::data(path, "data file", msg)
    })?;
    let meta = file
        .metadata()
        .map_err(|e| Error::data(path, "data file", format!("cannot be inspected ({e})")))?;
    if !meta.is_file() {
        return Err(Error::data(path, "data file", "is not a regular file"));
    }
    Ok((file, meta))
}

/// Opens a data file and returns it with its status and its length in samples of `kind`.
fn open_data(path: &str, kind: Kind) -> Result<(File, std::fs::Metadata, u64)> {
    let (file, meta) = open_regular(path)?;
    let (len, sb) = (meta.len(), kind.sample_bytes() as u64);
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
    Ok((file, meta, len / sb))
}

impl Recording {
    /// Bytes of the data file when it was opened.
    pub fn bytes(&self) -> u64 {
        self.samples * self.kind.sample_bytes() as u64
    }

    /// Whether the file is mapped (rows are copied from the mapping while it is sound).
    pub fn is_mapped(&self) -> bool {
        self.map.as_ref().is_some_and(|m| !m.poisoned())
    }

    /// Opens the file again by path (its descriptor was evicted from the pool): it must be the
    /// file opened at dataset open, else [`Error::Replaced`].
    fn reopen(&self) -> Result<File> {
        if self.windows == 0 {
            return Err(Error::Internal(format!(
                "{}: read from a recording that has no windows",
                self.path
            )));
        }
        let (file, meta) = open_regular(&self.path)?;
        if FileId::of(&meta) != self.id {
            return Err(Error::Replaced {
                file: self.path.clone(),
            });
        }
        Ok(file)
    }
}

impl Dataset {
    /// Recording `r`'s open data file (opened again when the pool had evicted it).
    fn file(&self, r: usize) -> Result<Held<'_>> {
        let rec = &self.recordings[r];
        self.files.get(r, || rec.reopen())
    }

    /// Descriptors held now, and the most the dataset holds.
    pub fn open_files(&self) -> (usize, usize) {
        (self.files.open_files(), self.files.cap())
    }

    /// For a mapped file: true when the file is now shorter than the mapping, or its status
    /// changed since open (a cut the file was then regrown past: zeros where the data was, at
    /// the old length). The mapping is then poisoned (every later read of it uses `pread`, which
    /// sees the file as it is). One `fstat` of the descriptor the pool holds, or, when it
    /// holds none, one `stat` of the path, which must then still name the mapped file (the
    /// mapping keeps its inode alive, so the identity cannot be reused). Unmapped files: false
    /// (their `pread`s see a truncation themselves).
    fn changed(&self, r: usize) -> bool {
        let rec = &self.recordings[r];
        let Some(map) = &rec.map else {
            return false;
        };
        if map.poisoned() {
            return true; // rows read while it was sound are read again
        }
        let meta = match self.files.peek(r) {
            Ok(Some(f)) => f.metadata(),
            Ok(None) => std::fs::metadata(&rec.path),
            Err(_) => return true,
        };
        // An unreadable status is treated as a change: the re-read reports what is wrong.
        let changed = match meta {
            Ok(m) => FileId::of(&m) != rec.id || m.len() < rec.bytes() || stamp(&m) != rec.stamp,
            Err(_) => true,
        };
        if changed {
            map.poison();
        }
        changed
    }

    /// Reads exactly `buf.len()` bytes of recording `r` at `offset`: from the mapping while it
    /// is sound (true), else (or when the copy faulted) with `pread` (false), where a short read
    /// is `LengthChanged`.
    fn read_at(&self, r: usize, buf: &mut [u8], offset: u64) -> Result<bool> {
        let rec = &self.recordings[r];
        if let Some(map) = &rec.map {
            if map.copy_to(offset, buf) {
                return Ok(true);
            }
        }
        let file = self.file(r)?;
        read_exact_at(&file, buf, offset)
            .map(|()| false)
            .map_err(|e| read_error(&rec.path, &file, rec.bytes(), e))
    }
}

/// `pread` until `buf` is full; `UnexpectedEof` when the file ends first.
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    #[cfg(unix)]
    {
        std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
    }
    #[cfg(windows)]
    {
        use std::os::windows::fs::FileExt;
        let (mut buf, mut offset) = (buf, offset);
        while !buf.is_empty() {
            match file.seek_read(buf, offset) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    let rest = buf;
                    buf = &mut rest[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// The error of a failed read of `path`, which had `expected` bytes when opened: a short read
/// (the file shrank) is `LengthChanged` with the length it has now.
pub(crate) fn read_error(path: &str, file: &File, expected: u64, e: io::Error) -> Error {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        if let Ok(m) = file.metadata() {
            return Error::LengthChanged {
                file: path.to_owned(),
                expected,
                found: m.len(),
            };
        }
    }
    Error::data(path, "data file", format!("cannot be read ({e})"))
}

/// Converts a row read straight from the file into the storage dtype, in place (same width).
fn convert_in_place(kind: Kind, storage: Storage, buf: &mut [u8]) -> Result<()> {
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
fn widen(kind: Kind, storage: Storage, src: &[u8], out: &mut [u8]) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{open_plain, TempDir};

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
            let ds = open_plain(&[p], &[k], 3, 3).unwrap();
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
            let ds = open_plain(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
            assert_eq!(ds.storage(), Storage::Int16);
            assert_eq!(i16s(&row(&ds, 0)), want16, "{kind}");
        }
        let wantf: Vec<f32> = vals.iter().map(|&v| v as f32 * 0.5).collect();
        for (name, bytes, kind) in [("le.f32", &f32le, "cf32_le"), ("be.f32", &f32be, "cf32_be")] {
            let ds = open_plain(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
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
        let ds = open_plain(&paths, &kinds, 3, 3).unwrap();
        assert_eq!(ds.storage(), Storage::Float32);
        assert_eq!(ds.num_windows(), 6);
        for (id, f) in files.iter().enumerate() {
            let want: Vec<f32> = vals.iter().map(|&v| v as f32 * f.2).collect();
            assert_eq!(f32s(&row(&ds, id as u64)), want, "{}", f.1);
        }
        // ci8 + cu8 stay int8.
        let ds = open_plain(&[paths[0], paths[1]], &["ci8", "cu8"], 3, 3).unwrap();
        assert_eq!(ds.storage(), Storage::Int8);
    }

    #[test]
    fn errors_name_file_and_field() {
        let t = TempDir::new("errors");
        let p = t.file("x.sigmf-data", &[0u8; 1001]);
        let e = open_plain(&[&p], &["ci16_le"], 1, 1).err().unwrap();
        assert!(matches!(e, Error::Data { .. }));
        assert_eq!(
            e.to_string(),
            format!("{p}: data length 1001 bytes is not a whole number of ci16_le samples (4 bytes each)")
        );
        let e = open_plain(&[&p], &["ri16_le"], 1, 1).err().unwrap();
        assert!(
            e.to_string()
                .starts_with(&format!("{p}: datatype 'ri16_le' is not supported")),
            "{e}"
        );
        let missing = t.0.join("missing.sigmf-data");
        let missing = missing.to_str().unwrap();
        let e = open_plain(&[missing], &["ci8"], 1, 1).err().unwrap();
        assert!(
            matches!(e, Error::Data { .. }) && e.to_string().starts_with(missing),
            "{e}"
        );
        let dir = t.0.to_str().unwrap();
        assert!(matches!(
            open_plain(&[dir], &["ci8"], 1, 1),
            Err(Error::Data { .. })
        ));
        let ok = t.file("ok", &[0u8; 8]);
        assert!(
            matches!(open_plain(&[&ok], &["ci8"], 0, 1), Err(Error::Config { ref key, .. }) if key == "window")
        );
        assert!(
            matches!(open_plain(&[&ok], &["ci8"], 1, 0), Err(Error::Config { ref key, .. }) if key == "stride")
        );
        assert!(
            matches!(open_plain(&[&ok], &["ci8", "ci8"], 1, 1), Err(Error::Config { ref key, .. }) if key == "kinds")
        );
        // Shorter than the window everywhere: no windows at all.
        assert!(matches!(
            open_plain(&[&ok], &["ci8"], 5, 1),
            Err(Error::NoWindows { .. })
        ));
        let empty: [&str; 0] = [];
        assert!(matches!(
            open_plain(&empty, &empty, 5, 1),
            Err(Error::NoWindows { .. })
        ));
        // Out-of-range id.
        let ds = open_plain(&[&ok], &["ci8"], 1, 1).unwrap();
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
        let ds = open_plain(&paths, &["ci8"; 5], 4, 3).unwrap();
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

    #[test]
    fn capture_segment_arithmetic() {
        let seg = |starts: &[u64], n: u64| capture_segments("f", starts, n).unwrap();
        assert_eq!(seg(&[], 10), [(0, 10)]);
        assert_eq!(seg(&[0], 10), [(0, 10)]);
        assert_eq!(seg(&[0, 4, 7], 10), [(0, 4), (4, 3), (7, 3)]);
        // A first capture after 0: the samples before it are a leading segment of their own.
        assert_eq!(seg(&[3, 5], 10), [(0, 3), (3, 2), (5, 5)]);
        // A capture at the very end of the data is empty.
        assert_eq!(seg(&[0, 10], 10), [(0, 10), (10, 0)]);
        assert_eq!(seg(&[], 0), [(0, 0)]);
        for (starts, bad) in [
            (&[0u64, 0][..], 1),
            (&[0, 5, 3][..], 2),
            (&[0, 11][..], 1),
            (&[11][..], 0),
        ] {
            let e = capture_segments("/d/x.sigmf-data", starts, 10).unwrap_err();
            let want = format!("/d/x.sigmf-data: captures[{bad}].core:sample_start ");
            assert!(
                matches!(e, Error::Data { .. }) && e.to_string().starts_with(&want),
                "{starts:?}: {e}"
            );
        }
        assert_eq!(window_count(10, 4, 3), 3);
        assert_eq!(window_count(4, 4, 3), 1);
        assert_eq!(window_count(3, 4, 3), 0);
        assert_eq!(window_count(0, 4, 1), 0);
        assert_eq!(window_count(u64::MAX, 1, 1), u64::MAX);
    }

    #[test]
    fn a_selection_reads_the_base_windows_it_names() {
        let t = TempDir::new("select");
        let a = t.file("a", &ramp(40));
        let b = t.file("b", &ramp(9));
        let caps: [&[u64]; 2] = [&[0, 10, 13, 30], &[0]];
        let open = || Dataset::open(&[&a, &b], &["ci8", "ci8"], &caps, 4, 3).unwrap();
        let base = open();
        assert_eq!(base.num_windows(), 13);
        assert_eq!(base.selection(), None);
        // Unsorted, with a repeat: order is kept, a repeat is one more window.
        let table = vec![12u64, 0, 7, 3, 7, 11];
        let sel = open().select(table.clone()).unwrap();
        assert_eq!(sel.num_windows(), table.len() as u64);
        assert_eq!(sel.base_windows(), 13);
        assert_eq!(sel.selection(), Some(&table[..]));
        // Recordings and segments keep their base counts.
        let counts = |d: &Dataset| d.recordings().iter().map(|r| r.windows).collect::<Vec<_>>();
        assert_eq!(counts(&sel), counts(&base));
        assert_eq!(sel.segments(), base.segments());
        for (i, &b) in table.iter().enumerate() {
            assert_eq!(
                sel.locate(i as u64).unwrap(),
                base.locate(b).unwrap(),
                "id {i}"
            );
            assert_eq!(row(&sel, i as u64), row(&base, b), "id {i}");
        }
        let ids: Vec<u64> = (0..table.len() as u64).rev().collect();
        let mut got = vec![0u8; ids.len() * sel.row_bytes()];
        sel.gather(&ids, &mut got).unwrap();
        let want: Vec<u8> = ids
            .iter()
            .flat_map(|&i| row(&base, table[i as usize]))
            .collect();
        assert_eq!(got, want);
        // Ids past the selection are out of range, though below the base count.
        assert!(matches!(
            sel.locate(6),
            Err(Error::Index {
                what: "window id",
                index: 6,
                len: 6
            })
        ));
        let mut out = vec![0u8; 2 * sel.row_bytes()];
        assert!(matches!(
            sel.gather(&[0, 6], &mut out),
            Err(Error::Index { .. })
        ));
        // A new selection replaces the old one, in base ids.
        let again = sel.select(vec![1]).unwrap();
        assert_eq!(again.num_windows(), 1);
        assert_eq!(row(&again, 0), row(&base, 1));
    }

    #[test]
    fn empty_and_out_of_range_selections_are_errors() {
        let t = TempDir::new("select-bad");
        let a = t.file("a", &ramp(40));
        let open = || open_plain(&[&a], &["ci8"], 4, 4).unwrap(); // 10 windows
        let e = open().select(Vec::new()).err().unwrap();
        assert!(
            matches!(&e, Error::Config { key, .. } if key == "select"),
            "{e}"
        );
        assert!(e.to_string().contains("selects no window"), "{e}");
        let e = open().select(vec![0, 9, 10, 3]).err().unwrap();
        assert!(
            matches!(
                e,
                Error::Index {
                    what: "selected window id",
                    index: 10,
                    len: 10
                }
            ),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "selected window id 10 is out of range [0, 10)"
        );
        assert!(open().select(vec![u64::MAX]).is_err());
        assert_eq!(open().select(vec![9]).unwrap().num_windows(), 1);
    }

    #[test]
    fn a_stream_over_a_selection_yields_each_selected_window_once_per_epoch() {
        use crate::stream::Stream;
        use std::sync::Arc;
        let t = TempDir::new("select-stream");
        let a = t.file("a", &ramp(400));
        let b = t.file("b", &ramp(250));
        let open = || open_plain(&[&a, &b], &["ci8", "ci8"], 8, 5).unwrap();
        let base = open();
        let table: Vec<u64> = (0..base.num_windows()).filter(|i| i % 3 != 1).collect();
        let n = table.len() as u64;
        let sel = Arc::new(open().select(table.clone()).unwrap());
        for depth in [0, 2] {
            // batch 7 does not divide n: batches straddle epochs.
            let mut s = Stream::new(sel.clone(), 7, 11, 0, 1, depth).unwrap();
            let mut ids = Vec::new();
            let mut rows = Vec::new();
            while (ids.len() as u64) < 3 * n {
                let mut buf = s.next_batch().unwrap();
                ids.extend_from_slice(s.last_ids());
                rows.extend_from_slice(buf.as_bytes_mut());
            }
            let rb = sel.row_bytes();
            for (k, &id) in ids.iter().enumerate() {
                assert!(id < n, "id {id}");
                // The row is the base window the selection names.
                assert_eq!(rows[k * rb..(k + 1) * rb], row(&base, table[id as usize]));
            }
            for e in 0..3 {
                let mut epoch = ids[(e * n) as usize..((e + 1) * n) as usize].to_vec();
                epoch.sort_unstable();
                assert_eq!(epoch, (0..n).collect::<Vec<_>>(), "epoch {e}");
            }
            // Seek lands on the same batch as iteration.
            let mut r = Stream::new(sel.clone(), 7, 11, 0, 1, depth).unwrap();
            r.seek(14).unwrap();
            r.next_batch().unwrap();
            assert_eq!(r.last_ids(), &ids[14..21]);
        }
    }

    /// ci8 recording whose sample k is (k, -k) (mod 256).
    fn ramp(n: u64) -> Vec<u8> {
        (0..n)
            .flat_map(|k| [k as u8, (k as u8).wrapping_neg()])
            .collect()
    }

    #[test]
    fn windows_never_cross_a_capture_boundary() {
        let t = TempDir::new("captures");
        let a = t.file("a", &ramp(40));
        let b = t.file("b", &ramp(9));
        // a: captures at 0, 10, 13, 30 -> segments [0,10) [10,13) [13,30) [30,40);
        // window 4, stride 3 -> 3 + 0 + 5 + 3 windows. b: one capture, 2 windows.
        let caps: [&[u64]; 2] = [&[0, 10, 13, 30], &[0]];
        let ds = Dataset::open(&[&a, &b], &["ci8", "ci8"], &caps, 4, 3).unwrap();
        let starts_a = [0u64, 3, 6, 13, 16, 19, 22, 25, 30, 33, 36];
        let mut want: Vec<(usize, u64)> = starts_a.iter().map(|&s| (0, s)).collect();
        want.extend([(1, 0), (1, 3)]);
        assert_eq!(ds.num_windows(), want.len() as u64);
        assert_eq!(
            ds.recordings()
                .iter()
                .map(|r| r.windows)
                .collect::<Vec<_>>(),
            [11, 2]
        );
        assert_eq!(ds.recordings()[0].segments, 0..4);
        assert_eq!(ds.recordings()[1].segments, 4..5);
        let bounds = [0u64, 10, 13, 30, 40];
        for (id, &(r, s)) in want.iter().enumerate() {
            assert_eq!(ds.locate(id as u64).unwrap(), (r, s), "id {id}");
            if r == 0 {
                let seg = bounds.partition_point(|&b| b <= s) - 1;
                assert!(
                    s + 4 <= bounds[seg + 1],
                    "window {id} at {s} crosses a capture"
                );
            }
            let exp: Vec<u8> = (s..s + 4)
                .flat_map(|k| [k as u8, (k as u8).wrapping_neg()])
                .collect();
            assert_eq!(row(&ds, id as u64), exp, "id {id}");
        }
        // One capture at 0 (or none) is exactly the unsegmented id space.
        let none: [&[u64]; 2] = [&[], &[]];
        let flat = Dataset::open(&[&a, &b], &["ci8", "ci8"], &none, 4, 3).unwrap();
        let plain = open_plain(&[&a, &b], &["ci8", "ci8"], 4, 3).unwrap();
        assert_eq!(flat.num_windows(), 13 + 2);
        for id in 0..flat.num_windows() {
            assert_eq!(flat.locate(id).unwrap(), plain.locate(id).unwrap());
            assert_eq!(
                flat.locate(id).unwrap(),
                (usize::from(id >= 13), (id % 13) * 3)
            );
        }
        // A leading segment before a late first capture; captures too short for a window.
        let caps: [&[u64]; 1] = [&[5, 7, 38]];
        let ds = Dataset::open(&[&a], &["ci8"], &caps, 4, 4).unwrap();
        let got: Vec<u64> = (0..ds.num_windows())
            .map(|i| ds.locate(i).unwrap().1)
            .collect();
        assert_eq!(got, [0, 7, 11, 15, 19, 23, 27, 31]);
        // Bad capture starts name the data file and the capture.
        let caps: [&[u64]; 1] = [&[0, 41]];
        let e = Dataset::open(&[&a], &["ci8"], &caps, 4, 4).err().unwrap();
        assert!(
            e.to_string()
                .starts_with(&format!("{a}: captures[1].core:sample_start 41 is beyond")),
            "{e}"
        );
        let caps: [&[u64]; 0] = [];
        assert!(matches!(
            Dataset::open(&[&a], &["ci8"], &caps, 4, 4),
            Err(Error::Config { ref key, .. }) if key == "captures"
        ));
    }

    #[test]
    fn a_file_truncated_while_open_is_an_error_and_recovers() {
        let t = TempDir::new("truncate");
        let full = ramp(100);
        let p = t.file("a", &full);
        let q = t.file("q", &[0u8; 8 * 10]); // cf32: makes storage float32, so ci8 is widened
        for (paths, kinds) in [
            (vec![&p], vec!["ci8"]),
            (vec![&p, &q], vec!["ci8", "cf32_le"]),
        ] {
            std::fs::write(&p, &full).unwrap();
            let ds = open_plain(&paths, &kinds, 10, 10).unwrap();
            let before: Vec<Vec<u8>> = (0..10).map(|i| row(&ds, i)).collect();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(95 * 2)
                .unwrap();
            // Windows inside what is left still read; the last one comes up short.
            assert_eq!(row(&ds, 8), before[8]);
            let mut out = vec![0u8; ds.row_bytes()];
            let e = ds.fill_row(9, &mut out).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{p}: data file changed length while being read (expected 200 bytes, found 190)")
            );
            let mut all = vec![0u8; 10 * ds.row_bytes()];
            let ids: Vec<u64> = (0..10).collect();
            assert!(matches!(
                ds.gather(&ids, &mut all),
                Err(Error::LengthChanged { .. })
            ));
            // Restored: the same open dataset reads again.
            std::fs::write(&p, &full).unwrap();
            ds.gather(&ids, &mut all).unwrap();
            assert_eq!(all, before.concat());
        }
    }

    fn open_mapped(p: &str, kind: &str, window: u64) -> Dataset {
        let ds = Dataset::open_with(
            &[p],
            &[kind],
            &[[0u64]],
            window,
            window,
            ReadPolicy {
                map_min_bytes: 0,
                ..ReadPolicy::default()
            },
        )
        .unwrap();
        assert!(ds.recordings()[0].is_mapped());
        ds
    }

    #[test]
    fn mapped_and_pread_readers_give_the_same_bytes() {
        let t = TempDir::new("mapped-same");
        let full = ramp(3 * 4096 + 17);
        let p = t.file("a", &full);
        let q = t.file("q", &[0u8; 8 * 10]); // cf32: ci8 widened to float32 from the mapping
        for (paths, kinds) in [
            (vec![&p], vec!["ci8"]),
            (vec![&p, &q], vec!["ci8", "cf32_le"]),
        ] {
            let caps = vec![[0u64]; paths.len()];
            let open = |min| {
                let policy = ReadPolicy {
                    map_min_bytes: min,
                    ..ReadPolicy::default()
                };
                Dataset::open_with(&paths, &kinds, &caps, 100, 37, policy).unwrap()
            };
            let (mapped, plain) = (open(0), open(u64::MAX));
            assert!(mapped.recordings()[0].is_mapped() && !plain.recordings()[0].is_mapped());
            // q has no window of 100 samples: nothing reads it, so it is never mapped.
            assert!(paths.len() == 1 || !mapped.recordings()[1].is_mapped());
            let ids: Vec<u64> = (0..mapped.num_windows()).rev().collect();
            let mut a = vec![0u8; ids.len() * mapped.row_bytes()];
            let mut b = a.clone();
            mapped.gather(&ids, &mut a).unwrap();
            plain.gather(&ids, &mut b).unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn a_mapped_file_truncated_inside_or_past_a_page_is_an_error_and_recovers() {
        let t = TempDir::new("mapped-truncate");
        let full = ramp(6 * 1024); // 12288 bytes = 3 pages; ci8 windows of 1024 = 2048 bytes
        let p = t.file("a", &full);
        // 12188: the last window ends inside the last page (no fault, a zero tail);
        // 5000: window 2 ends in the page holding the new end, windows 3-5 fault.
        for cut in [12188u64, 5000] {
            std::fs::write(&p, &full).unwrap();
            let ds = open_mapped(&p, "ci8", 1024);
            let ids: Vec<u64> = (0..6).collect();
            let mut before = vec![0u8; 6 * ds.row_bytes()];
            ds.gather(&ids, &mut before).unwrap();
            std::fs::OpenOptions::new()
                .write(true)
                .open(&p)
                .unwrap()
                .set_len(cut)
                .unwrap();
            let mut out = vec![0u8; 6 * ds.row_bytes()];
            let e = ds.gather(&ids, &mut out).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("{p}: data file changed length while being read (expected 12288 bytes, found {cut})")
            );
            let mut one = vec![0u8; ds.row_bytes()];
            assert!(matches!(
                ds.fill_row(5, &mut one),
                Err(Error::LengthChanged { .. })
            ));
            assert!(
                !ds.recordings()[0].is_mapped(),
                "poisoned: pread from now on"
            );
            // Windows inside what is left still read (now with pread).
            ds.fill_row(0, &mut one).unwrap();
            assert_eq!(one, before[..ds.row_bytes()]);
            // Restored in place: the same open dataset reads the right bytes again.
            std::fs::write(&p, &full).unwrap();
            ds.gather(&ids, &mut out).unwrap();
            assert_eq!(out, before);
        }
    }

    #[test]
    fn a_mapped_file_cut_and_regrown_reads_as_pread_reads_it() {
        let t = TempDir::new("mapped-regrow");
        let full = ramp(6 * 1024);
        let p = t.file("a", &full);
        let ds = open_mapped(&p, "ci8", 1024);
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.set_len(12188).unwrap(); // inside the last page: a later copy would not fault
        f.set_len(12288).unwrap(); // regrown: the same length, zeros past the cut
        let ids: Vec<u64> = (0..6).collect();
        let mut got = vec![0u8; 6 * ds.row_bytes()];
        ds.gather(&ids, &mut got).unwrap();
        let plain = Dataset::open_with(
            &[&p],
            &["ci8"],
            &[[0u64]],
            1024,
            1024,
            ReadPolicy {
                map_min_bytes: u64::MAX,
                ..ReadPolicy::default()
            },
        )
        .unwrap();
        let mut want = vec![0u8; 6 * plain.row_bytes()];
        plain.gather(&ids, &mut want).unwrap();
        assert_eq!(got, want);
        assert!(
            !ds.recordings()[0].is_mapped(),
            "its status changed: pread from now on"
        );
    }

    /// `n` ci8 recordings `r0, r1, ...` of 256 samples (4 windows of 64).
    fn ramp_files(t: &TempDir, n: usize) -> Vec<String> {
        (0..n)
            .map(|i| t.file(&format!("r{i}"), &ramp(256)))
            .collect()
    }

    fn open_pooled(paths: &[&str], map_min_bytes: u64, max_open_files: usize) -> Dataset {
        let caps = vec![[0u64]; paths.len()];
        let policy = ReadPolicy {
            map_min_bytes,
            max_open_files,
        };
        Dataset::open_with(paths, &vec!["ci8"; paths.len()], &caps, 64, 64, policy).unwrap()
    }

    #[test]
    fn a_pool_smaller_than_the_dataset_reads_every_row_as_the_open_one_does() {
        let t = TempDir::new("pool-same");
        let data: Vec<Vec<u8>> = (0..9).map(|i| ramp(128 * 10 + i * 128)).collect();
        let paths: Vec<String> = (0..9).map(|i| t.file(&format!("r{i}"), &data[i])).collect();
        let paths: Vec<&str> = paths.iter().map(|p| p.as_str()).collect();
        let all = open_pooled(&paths, u64::MAX, usize::MAX);
        assert_eq!(all.open_files().0, 9);
        // pread only, mapped only, and r4..r8 mapped (3584 bytes or more), 2 descriptors.
        for min in [u64::MAX, 0, 3584] {
            let pooled = open_pooled(&paths, min, 2);
            // Kept at open while there was room, mapped files not (their rows need none).
            let unmapped = pooled
                .recordings()
                .iter()
                .filter(|r| !r.is_mapped())
                .count();
            assert_eq!(pooled.open_files(), (unmapped.min(2), 2));
            let n = all.num_windows();
            // Shuffled, several times round: every row evicts and reopens.
            let ids: Vec<u64> = (0..3 * n).map(|k| (k * 7 + 3) % n).collect();
            let mut a = vec![0u8; ids.len() * all.row_bytes()];
            let mut b = a.clone();
            all.gather(&ids, &mut a).unwrap();
            pooled.gather(&ids, &mut b).unwrap();
            assert_eq!(a, b, "map_min_bytes {min}");
            assert!(pooled.open_files().0 <= 2);
        }
    }

    #[test]
    fn a_file_replaced_or_deleted_while_out_of_the_pool_is_an_error_naming_it() {
        let t = TempDir::new("pool-replaced");
        let files = ramp_files(&t, 3);
        let paths: Vec<&str> = files.iter().map(|p| p.as_str()).collect();
        for min in [u64::MAX, 0] {
            let ds = open_pooled(&paths, min, 1);
            let mut row = vec![0u8; ds.row_bytes()];
            ds.fill_row(0, &mut row).unwrap(); // r0 holds the one descriptor (it was kept)
                                               // r1 is replaced the way rsync and most writers replace a file: a new file renamed
                                               // over it (the same bytes, another inode).
            let tmp = t.file("r1.tmp", &ramp(256));
            std::fs::rename(&tmp, paths[1]).unwrap();
            let e = ds.fill_row(4, &mut row).err().unwrap();
            assert!(
                matches!(&e, Error::Replaced { file } if file == paths[1]),
                "map_min_bytes {min}: {e}"
            );
            // r2 deleted: opening it again fails, naming it.
            std::fs::remove_file(paths[2]).unwrap();
            let e = ds.fill_row(8, &mut row).err().unwrap();
            assert!(e.to_string().starts_with(paths[2]), "{e}");
            assert!(e.to_string().contains("cannot be inspected"), "{e}");
            // ... and written again: a new file, though ext4 may give it the freed inode number
            // (a pread file's evicted descriptor no longer holds it): its birth time tells.
            std::fs::write(paths[2], ramp(256)).unwrap();
            let e = ds.fill_row(8, &mut row).err().unwrap();
            assert!(
                matches!(&e, Error::Replaced { file } if file == paths[2]),
                "map_min_bytes {min}: {e}"
            );
            // The file that was never replaced still reads.
            ds.fill_row(1, &mut row).unwrap();
            std::fs::write(paths[2], ramp(256)).unwrap();
            std::fs::write(paths[1], ramp(256)).unwrap();
        }
    }

    #[test]
    fn a_file_truncated_while_out_of_the_pool_is_length_changed() {
        let t = TempDir::new("pool-truncated");
        let files = ramp_files(&t, 2);
        let paths: Vec<&str> = files.iter().map(|p| p.as_str()).collect();
        let ds = open_pooled(&paths, u64::MAX, 1);
        let mut row = vec![0u8; ds.row_bytes()];
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(paths[1])
            .unwrap();
        f.set_len(100).unwrap();
        let e = ds.fill_row(7, &mut row).err().unwrap();
        assert!(
            matches!(&e, Error::LengthChanged { file, expected: 512, found: 100 } if file == paths[1]),
            "{e}"
        );
        f.set_len(0).unwrap();
        drop(f);
        std::fs::write(paths[1], ramp(256)).unwrap(); // restored in place: the same inode
        ds.fill_row(7, &mut row).unwrap();
    }
}
