//! The dataset: recordings, their layouts, segments and window ids, and the reads of its rows
//! (guarded map or `pread`, through the open-file pool).

use std::cell::Cell;
use std::fs::File;
use std::ops::Range;

use super::datatype::{Kind, Storage, KIND_NAMES};
use super::decode::{convert_frames, convert_in_place};
use super::segments::{window_count, Layout, Run, Segment};
use crate::error::{Error, Result};
use crate::io::{
    open_regular, read_error, read_exact_at, FileId, FilePool, Held, Mapping,
    DEFAULT_MAP_MIN_BYTES, MAX_MAPPED,
};

/// How rows are read: recordings whose runs (those with a window) span at least
/// `map_min_bytes` bytes of their data file have that span mapped (at most [`MAX_MAPPED`] of
/// them), the rest are read with `pread`. `u64::MAX` maps nothing. At most `max_open_files` data
/// files are open at once (`usize::MAX`: every recording with a window stays open).
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

/// One recording: its data file (open in the dataset's pool while any window reads from it),
/// its layout and its segments.
pub struct Recording {
    pub path: String,
    pub kind: Kind,
    /// Samples in its runs (every sample of the file when it has no layout).
    pub samples: u64,
    pub windows: u64,
    /// This recording's entries in [`Dataset::segments`], one per run.
    pub segments: Range<usize>,
    /// Interleaved channels in the file's sample frames, and the one read.
    pub channels: u64,
    pub channel: u64,
    /// The data file's length, which it must keep ([`Layout::file_bytes`]).
    file_bytes: u64,
    /// Bytes of one sample frame: `channels * kind.sample_bytes()`.
    frame: u64,
    /// Raw bytes of one window (`window * frame`); 0 when the recording has no window.
    raw_row: usize,
    /// The data file's device and inode at open: a file opened again must be this one.
    id: Option<FileId>,
    /// The guarded mapping of its runs' bytes rows are copied from, when the policy maps it.
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
    /// Opens every data file, validates kinds, layouts, lengths and window geometry.
    ///
    /// `layouts[r]` is recording `r`'s byte layout ([`Layout`]: its file's length, channels and
    /// runs, each run a segment windowed on its own). `None` is a plain single-channel file of
    /// whole samples, one run covering it.
    pub fn open<P: AsRef<str>, K: AsRef<str>>(
        paths: &[P],
        kinds: &[K],
        layouts: &[Option<Layout>],
        window: u64,
        stride: u64,
    ) -> Result<Dataset> {
        Self::open_with(paths, kinds, layouts, window, stride, ReadPolicy::default())
    }

    /// [`Dataset::open`] with an explicit [`ReadPolicy`].
    pub fn open_with<P: AsRef<str>, K: AsRef<str>>(
        paths: &[P],
        kinds: &[K],
        layouts: &[Option<Layout>],
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
        for (key, len) in [("kinds", kinds.len()), ("layouts", layouts.len())] {
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
        for (r, ((p, kind), layout)) in paths.iter().zip(parsed).zip(layouts).enumerate() {
            let path = p.as_ref();
            let (file, meta, layout, frame) = open_data(path, kind, layout.as_ref())?;
            let first = segments.len();
            let (mut samples, mut windows) = (0u64, 0u64);
            // The bytes of the runs that have a window: what a mapping must cover.
            let mut span = (u64::MAX, 0u64);
            for run in &layout.runs {
                let w = window_count(run.samples, window, stride);
                total = total.checked_add(w).ok_or_else(|| {
                    Error::data(path, "data length", "overflows the 2^64 window id space")
                })?;
                windows += w; // <= total
                              // Runs may overlap: their samples may add up to more than the file holds.
                samples = samples.saturating_add(run.samples);
                prefix.push(total);
                segments.push(Segment {
                    recording: r,
                    start: run.start,
                    samples: run.samples,
                    byte: run.byte,
                    windows: w,
                });
                if w > 0 {
                    span = (
                        span.0.min(run.byte),
                        span.1.max(run.byte + run.samples * frame),
                    );
                }
            }
            // window * frame <= run.samples * frame <= file bytes when there is a window.
            let raw_row = if windows > 0 {
                usize::try_from(window * frame)
                    .ok()
                    .filter(|&b| b <= isize::MAX as usize - 64)
                    .ok_or_else(|| {
                        Error::config(
                            "window",
                            format!("{window} samples of {frame}-byte frames is too large"),
                        )
                    })?
            } else {
                0
            };
            let map =
                (windows > 0 && span.1 - span.0 >= policy.map_min_bytes && mapped < MAX_MAPPED)
                    .then(|| Mapping::new(&file, span.0, span.1 - span.0))
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
                channels: layout.channels,
                channel: layout.channel,
                file_bytes: layout.file_bytes,
                frame,
                raw_row,
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
    /// Every segment (one per run), recordings in order, each recording's runs in order.
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

    /// `(recording index, first sample index)` of window `id`; `id` must be valid. The index
    /// is its run's [`Run::start`] plus the window's offset in the run. With a selection, `id`
    /// indexes the selection, which names the base window located.
    pub fn locate(&self, id: u64) -> Result<(usize, u64)> {
        let (s, k) = self.place(id)?;
        let seg = &self.segments[s];
        // start + samples fits in u64 (checked at open) and k * stride < samples.
        Ok((seg.recording, seg.start + k * self.stride))
    }

    /// The segment of window `id` (an index into [`Dataset::segments`]) and the window's index
    /// within that segment.
    fn place(&self, id: u64) -> Result<(usize, u64)> {
        self.check_id(id)?;
        let id = match &self.selection {
            // In range: check_id bounds id by the table's length.
            Some(table) => table[id as usize],
            None => id,
        };
        // First segment whose prefix end exceeds id; segments without windows have equal
        // bounds and are skipped by the strict comparison. O(log segments).
        let s = self.prefix.partition_point(|&p| p <= id) - 1;
        Ok((s, id - self.prefix[s]))
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
        let (s, k) = self.place(id)?;
        if out.len() != self.row_bytes() {
            return Err(Error::config(
                "out",
                format!("row has {} bytes, expected {}", out.len(), self.row_bytes()),
            ));
        }
        let seg = &self.segments[s];
        let r = seg.recording;
        let rec = &self.recordings[r];
        // In range by construction: k * stride + window <= seg.samples, and the segment's
        // frames [byte, byte + samples * frame) are inside the file (checked at open).
        let offset = seg.byte + k * self.stride * rec.frame;
        let mapped = if rec.channels == 1 && rec.kind.elem_bytes() == self.storage.elem_bytes() {
            // Same element width as the storage: read straight into the row, fix up in place.
            let mapped = self.read_at(r, out, offset)?;
            convert_in_place(rec.kind, self.storage, out)?;
            mapped
        } else {
            // Widening to float32 (mixed datatypes), narrowing cf64, or one channel of several:
            // the raw frames go through a per-thread scratch row, kept between calls so the
            // hot path does not allocate.
            thread_local!(static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) });
            let raw = rec.raw_row;
            let at = rec.channel as usize * rec.kind.sample_bytes(); // < frame <= raw
            SCRATCH.with(|cell| {
                // take/set rather than a RefCell borrow: nothing here can panic on re-entry.
                let mut scratch = cell.take();
                let res = grow(&mut scratch, raw + 64).and_then(|()| {
                    // Cache-line aligned like the batch rows (see `io/aligned.rs` `AlignedVec`
                    // for why).
                    let a = scratch.as_ptr().align_offset(64).min(64);
                    let src = &mut scratch[a..a + raw];
                    let mapped = self.read_at(r, src, offset)?;
                    convert_frames(rec.kind, self.storage, src, rec.frame as usize, at, out)?;
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

/// Grows a scratch buffer to at least `len` bytes; an allocation failure is an error, not an
/// abort.
fn grow(buf: &mut Vec<u8>, len: usize) -> Result<()> {
    if buf.len() < len {
        buf.clear();
        buf.try_reserve_exact(len).map_err(|_| Error::Alloc {
            what: "a row's raw bytes",
            bytes: len as u128,
        })?;
        buf.resize(len, 0);
    }
    Ok(())
}

/// Opens recording `path`'s data file and checks it against its layout (without one: that it
/// holds whole samples of `kind`, one run covering it). Returns the file, its status, the layout
/// the recording is read by and its frame bytes. Errors name the file and the field:
/// `channel` (no channels, or a channel out of range), `segment {i}` (run `i` outside the file),
/// `data length` (a plain file of partial samples); a file of another length than the layout's
/// is [`Error::LengthChanged`].
fn open_data(
    path: &str,
    kind: Kind,
    layout: Option<&Layout>,
) -> Result<(File, std::fs::Metadata, Layout, u64)> {
    let sb = kind.sample_bytes() as u64;
    let frame = match layout {
        None => sb,
        Some(l) => frame_bytes(path, kind, l)?,
    };
    let (file, meta) = open_regular(path)?;
    let len = meta.len();
    let Some(layout) = layout else {
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
        let run = Run {
            start: 0,
            samples: len / sb,
            byte: 0,
        };
        let plain = Layout {
            file_bytes: len,
            channels: 1,
            channel: 0,
            runs: vec![run],
        };
        return Ok((file, meta, plain, sb));
    };
    if len != layout.file_bytes {
        return Err(Error::LengthChanged {
            file: path.to_owned(),
            expected: layout.file_bytes,
            found: len,
        });
    }
    for (i, run) in layout.runs.iter().enumerate() {
        let field = format!("segment {i}");
        if run.start.checked_add(run.samples).is_none() {
            return Err(Error::data(
                path,
                &field,
                format!(
                    "starts at sample {} and has {} samples: its sample indices pass 2^64",
                    run.start, run.samples
                ),
            ));
        }
        let end = run
            .samples
            .checked_mul(frame)
            .and_then(|b| b.checked_add(run.byte));
        match end {
            Some(end) if end <= len => {}
            Some(end) => {
                return Err(Error::data(
                    path,
                    &field,
                    format!(
                        "bytes [{}, {end}) ({} samples of {frame}-byte frames) are not inside \
                         the file ({len} bytes)",
                        run.byte, run.samples
                    ),
                ))
            }
            None => {
                return Err(Error::data(
                    path,
                    &field,
                    format!(
                        "of {} samples of {frame}-byte frames at byte {} ends past 2^64 bytes, \
                         outside the file ({len} bytes)",
                        run.samples, run.byte
                    ),
                ))
            }
        }
    }
    Ok((file, meta, layout.clone(), frame))
}

/// The bytes of one sample frame of `layout`'s channels, checking its channel.
fn frame_bytes(path: &str, kind: Kind, layout: &Layout) -> Result<u64> {
    let (channels, channel) = (layout.channels, layout.channel);
    if channels == 0 {
        return Err(Error::data(
            path,
            "channel",
            format!("{channel} cannot be read: the layout has 0 channels (must be >= 1)"),
        ));
    }
    if channel >= channels {
        return Err(Error::data(
            path,
            "channel",
            format!(
                "{channel} is out of range: the data has {channels} channels (0 to {})",
                channels - 1
            ),
        ));
    }
    channels
        .checked_mul(kind.sample_bytes() as u64)
        .ok_or_else(|| {
            Error::data(
                path,
                "channel",
                format!(
                    "{channel} cannot be read: {channels} channels of {} samples overflow a \
                     frame",
                    kind.name()
                ),
            )
        })
}

impl Recording {
    /// Bytes of the data file when it was opened (its layout's `file_bytes`): the length it
    /// must keep.
    pub fn bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Bytes of one sample frame (`channels * kind.sample_bytes()`).
    pub fn frame_bytes(&self) -> u64 {
        self.frame
    }

    /// The file bytes `[start, end)` the mapping covers (from a page boundary), if mapped.
    #[cfg(test)]
    pub(super) fn mapped_range(&self) -> Option<(u64, u64)> {
        self.map.as_ref().map(Mapping::range)
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

    /// For a mapped file: true when the file is now shorter than it was at open, or its status
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
            Ok(m) => FileId::of(&m) != rec.id || m.len() < rec.file_bytes || stamp(&m) != rec.stamp,
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
            .map_err(|e| read_error(&rec.path, &file, rec.file_bytes, e))
    }
}
