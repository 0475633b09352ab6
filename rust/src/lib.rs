//! Native data path of iqtrain: recordings read by the byte layouts the caller gives (positioned
//! reads or guarded maps), content digests of files and of regions of files, the seeded epoch
//! permutation, the global sample stream and parallel batch assembly (into a ring of buffers,
//! the caller's or the stream's own: `stream/ring.rs`). Pure Rust; the Python bindings live in
//! `python.rs` behind the `python` feature so `cargo test` needs no interpreter.
//!
//! The modules are private; the `pub use` lines below are the crate's one surface, and
//! `python.rs` uses nothing else. Modules import one way (a module uses only those below it):
//!
//! ```text
//! python
//! stream       mod (Stream) -> ring -> job | spec -> buffer
//! digest | recordings   dataset -> segments | decode -> datatype
//! permutation | io      mapped -> aligned; files; pread
//! error
//! ```
mod digest;
mod error;
mod io;
mod permutation;
mod recordings;
mod stream;

#[cfg(feature = "python")]
mod python;

pub use digest::{
    digest_file, digest_files, digest_piece, digest_pieces, digest_region, merge_pieces, pieces,
    Piece, CHUNK,
};
pub use error::{Error, Result};
pub use io::{bytes_mut, AlignedVec, Plain};
pub use permutation::{feistel_index, Permutation};
pub use recordings::{
    window_count, Dataset, Kind, Layout, ReadPolicy, Recording, Run, Segment, Storage, KIND_NAMES,
};
pub use stream::{Buffer, BufferPool, RawBuf, Ring, Slots, Stream, StreamSpec};

#[cfg(test)]
pub(crate) mod testutil {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A fresh directory under the system temp dir, removed on drop.
    pub struct TempDir(pub PathBuf);

    impl TempDir {
        pub fn new(tag: &str) -> TempDir {
            static N: AtomicU64 = AtomicU64::new(0);
            let p = std::env::temp_dir().join(format!(
                "iqtrain-native-{tag}-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            TempDir(p)
        }

        pub fn file(&self, name: &str, bytes: &[u8]) -> String {
            let p = self.0.join(name);
            std::fs::write(&p, bytes).unwrap();
            p.to_str().unwrap().to_owned()
        }
    }

    /// `Dataset::open` with no layouts: every recording a plain file, one run covering it.
    pub fn open_plain<P: AsRef<str>, K: AsRef<str>>(
        paths: &[P],
        kinds: &[K],
        window: u64,
        stride: u64,
    ) -> crate::Result<crate::Dataset> {
        crate::Dataset::open(paths, kinds, &vec![None; paths.len()], window, stride)
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
