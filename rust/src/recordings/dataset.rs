//! The dataset: recordings, their segments and window ids, and the reads of its rows (guarded
//! map or `pread`, through the open-file pool).

use std::cell::Cell;
use std::fs::File;
use std::ops::Range;

use super::datatype::{Kind, Storage, KIND_NAMES};
use super::decode::{convert_in_place, widen};
use super::segments::{capture_segments, window_count, Segment};
use crate::error::{Error, Result};
use crate::io::{
    open_regular, read_error, read_exact_at, FileId, FilePool, Held, Mapping,
    DEFAULT_MAP_MIN_BYTES, MAX_MAPPED,
};

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
                // Cache-line aligned like the batch rows (see `io/aligned.rs` `AlignedVec` for why).
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
