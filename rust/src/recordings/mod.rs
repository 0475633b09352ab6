//! Recordings: SigMF data files, their datatypes, byte layouts, segments, window location and
//! row decode.
//!
//! The caller owns the SigMF semantics (captures, headers and trailers, archives, channels) and
//! hands each recording's byte layout ([`Layout`]) to the dataset: the data file's length, its
//! interleaved channels and the one read, and its runs. A run is `samples` consecutive sample
//! frames from a byte offset (one capture segment; bytes between or after runs are never read),
//! and is windowed on its own: a run of `len` samples contributes `(len - window) / stride + 1`
//! windows (0 when shorter) starting at multiples of `stride` from the run's first sample, so no
//! window crosses a capture boundary (a retune, or a `core:global_index` jump marking dropped
//! samples) or a recording. Without a layout a recording is a plain single-channel file of whole
//! samples, one run covering it. Several recordings may name the same file (members of one
//! archive). Window ids enumerate recordings in the given order, then their runs, then windows.
//! A prefix sum over segments (runs) locates any id by binary search, so opening costs
//! O(segments), not O(windows).
//!
//! All 14 complex SigMF datatypes are read ([`KIND_NAMES`]); batches are stored as int8, int16
//! or float32, converted by value (`decode`).
//!
//! A dataset may be restricted to chosen windows ([`Dataset::select`]): a table of base window
//! ids (the numbering above) that `locate` maps every id through, so rows, gathers and streams
//! see only the selected windows, each id still O(1) to locate.
//!
//! Samples of a recording whose runs span at least [`ReadPolicy::map_min_bytes`] bytes are
//! copied out of a guarded memory map of that span (`io/mapped.rs`); others (and any mapping
//! that saw a fault) are read with positioned reads (`pread`). Either way a data file truncated
//! while a training run reads it is reported as [`Error::LengthChanged`] naming the file, never as a
//! SIGBUS: a fault in a guarded copy is absorbed and the row re-read with `pread`, which comes up
//! short; the lengths of the mapped files a gather touched are checked after it (a truncation
//! inside a window's last page raises no fault).
//!
//! A dataset holds at most [`ReadPolicy::max_open_files`] descriptors (`io/files.rs`): more
//! recordings than that are opened again by path when read, and must still be the file opened
//! at dataset open.
//!
//! Files: `datatype` (kinds and storage dtypes), `segments` (layouts, runs and window counts),
//! `decode` (raw samples into the storage dtype), `dataset` (the dataset and its row reads).

mod dataset;
mod datatype;
mod decode;
mod segments;
#[cfg(test)]
mod tests;

pub(crate) use dataset::RowSource;
pub use dataset::{Dataset, ReadPolicy, Recording};
pub use datatype::{Kind, Storage, KIND_NAMES};
pub use segments::{window_count, Layout, Run, Segment};
