//! Native data path of iqtrain: recordings read with positioned reads, full-content digests,
//! the seeded epoch permutation, the global sample stream and parallel batch assembly (into
//! pooled buffers, or a ring of caller-owned ones: `ring.rs`). Pure Rust; the Python bindings
//! live in `python.rs` behind the `python` feature so `cargo test` needs no interpreter.

pub mod aligned;
pub mod digest;
pub mod error;
pub mod files;
pub mod job;
pub mod mapped;
pub mod permutation;
pub mod recordings;
pub mod ring;
pub mod stream;

#[cfg(feature = "python")]
mod python;

pub use digest::{digest_file, digest_files};
pub use error::{Error, Result};
pub use permutation::{feistel_index, Permutation};
pub use recordings::{capture_segments, window_count, Dataset, Kind, ReadPolicy, Segment, Storage};
pub use ring::{RawBuf, Ring, Slots};
pub use stream::{Batch, Buffer, Stream, StreamSpec};

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

    /// `Dataset::open` with one capture at sample 0 per recording (no capture boundaries).
    pub fn open_plain<P: AsRef<str>, K: AsRef<str>>(
        paths: &[P],
        kinds: &[K],
        window: u64,
        stride: u64,
    ) -> crate::Result<crate::Dataset> {
        let captures = vec![[0u64]; paths.len()];
        crate::Dataset::open(paths, kinds, &captures, window, stride)
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
