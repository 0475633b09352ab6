//! Reading bytes: cache-line aligned buffers and their copies (`aligned`), positioned reads
//! (`pread`), the open-file pool (`files`) and guarded read-only maps (`mapped`). Below
//! everything that knows what the bytes mean (`recordings`, `digest`, `stream`).

mod aligned;
mod files;
mod mapped;
mod pread;

pub(crate) use aligned::copy_bytes;
#[cfg(test)]
pub(crate) use aligned::piecewise;
pub use aligned::{bytes_mut, AlignedVec, Plain};
pub use files::{FileId, FilePool, Held};
pub use mapped::{Mapping, DEFAULT_MAP_MIN_BYTES, MAX_MAPPED};
pub(crate) use pread::{open_regular, read_error, read_exact_at};
