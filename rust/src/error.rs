//! The one error type of the crate. `python.rs` maps each variant to its own Python class
//! (`iqtrain.errors`), so callers can tell bad data from bad arguments without parsing text.

/// Everything that can go wrong in the native data path. Messages name the file and field
/// (data) or the argument (config) so a user can act on them without a traceback.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A recording cannot be used. Displays as `FILE: FIELD MSG`, e.g.
    /// `/r/x.sigmf-data: data length 1001 bytes is not a whole number of ci16_le samples (4 bytes each)`.
    #[error("{file}: {field} {msg}")]
    Data {
        file: String,
        field: String,
        msg: String,
    },
    /// A data file no longer has the length it had when it was opened: it was truncated (or
    /// extended) while being read. Reported by the positioned reads instead of the SIGBUS a
    /// memory map would raise, so a run ends with one line naming the file.
    #[error("{file}: data file changed length while being read (expected {expected} bytes, found {found})")]
    LengthChanged {
        file: String,
        expected: u64,
        found: u64,
    },
    /// A data file opened again by path (its descriptor had been closed to stay within
    /// `max_open_files`) is not the file the dataset opened: another file took its path.
    #[error("{file}: data file was replaced while being read (another file now has its path)")]
    Replaced { file: String },
    /// The recordings are readable but together yield no window at all.
    #[error("dataset: no window of {window} samples fits in any of the {recordings} recordings (longest: {longest} samples)")]
    NoWindows {
        recordings: usize,
        window: u64,
        longest: u64,
    },
    /// A stream position or cursor does not belong to this dataset.
    #[error("{0}")]
    CursorMismatch(String),
    /// An argument is missing, mistyped or out of range, or a call comes out of turn; `key`
    /// names it (a ValueError in Python).
    #[error("{key}: {msg}")]
    Config { key: String, msg: String },
    /// An index (window id, permutation position) is outside its range.
    #[error("{what} {index} is out of range [0, {len})")]
    Index {
        what: &'static str,
        index: u64,
        len: u64,
    },
    /// A buffer could not be allocated (reported instead of aborting the process).
    #[error("cannot allocate {bytes} bytes for {what}")]
    Alloc { what: &'static str, bytes: u128 },
    /// The prefetch thread could not be started or stopped unexpectedly.
    #[error("prefetch thread: {0}")]
    Thread(String),
    /// A broken internal invariant (a bug), reported instead of panicking across FFI.
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn data(file: &str, field: &str, msg: impl Into<String>) -> Self {
        Error::Data {
            file: file.to_owned(),
            field: field.to_owned(),
            msg: msg.into(),
        }
    }

    pub(crate) fn config(key: &str, msg: impl Into<String>) -> Self {
        Error::Config {
            key: key.to_owned(),
            msg: msg.into(),
        }
    }
}
