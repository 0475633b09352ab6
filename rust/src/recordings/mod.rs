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
//! memory map (`io/mapped.rs`); smaller files (and any mapping that saw a fault) are read with
//! positioned reads (`pread`). Either way a data file truncated while a run reads it is
//! reported as [`Error::LengthChanged`] naming the file, never as a SIGBUS: a fault in a
//! guarded copy is absorbed and the row re-read with `pread`, which comes up short; the lengths
//! of the mapped files a gather touched are checked after it (a truncation inside a window's
//! last page raises no fault).
//!
//! A dataset holds at most [`ReadPolicy::max_open_files`] descriptors (`io/files.rs`): more
//! recordings than that are opened again by path when read, and must still be the file opened
//! at dataset open.
//!
//! Files: `datatype` (kinds and storage dtypes), `segments` (captures and window counts),
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
pub use segments::{capture_segments, window_count, Segment};
