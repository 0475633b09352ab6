//! Full-content digests: the BLAKE3 of every byte of each data file (docs/design.md section 1,
//! dataset identity). No cache: every call reads every byte.
//!
//! Files are read with plain positioned reads, never memory-mapped: a file truncated during the
//! digest makes a read come up short, reported as [`Error::LengthChanged`] naming the file, where
//! a mapped page would kill the process with SIGBUS. Each file is read in [`CHUNK`] pieces and a
//! piece is hashed (with blake3's multi-threaded `update_rayon`) while the next one is read;
//! files are digested in parallel on rayon's pool. Memory: two chunk buffers per file in flight.

use rayon::prelude::*;

use crate::error::{Error, Result};
use crate::io::{open_regular, read_error, read_exact_at, AlignedVec};

/// Bytes read per positioned read and hashed per `update_rayon` call.
pub const CHUNK: usize = 1 << 20;

/// Below this, `update_rayon` is slower than `update` (blake3's documented rule of thumb for
/// x86_64: 128 KiB).
const RAYON_MIN: usize = 128 << 10;

/// BLAKE3 of the full content of `path`. With `expected_len`, a file of another length is
/// [`Error::LengthChanged`] before anything is read; without it the length at open is expected.
/// A file that shrinks or grows while being read is [`Error::LengthChanged`] too.
pub fn digest_file(path: &str, expected_len: Option<u64>) -> Result<blake3::Hash> {
    let (file, len) = open_checked(path, expected_len)?;
    let hasher = hash_range(path, &file, len, 0, len)?;
    check_end(path, &file, len)?;
    Ok(hasher.finalize())
}

/// Opens `path` and checks its length against `expected_len` (when given).
fn open_checked(path: &str, expected_len: Option<u64>) -> Result<(std::fs::File, u64)> {
    let (file, meta) = open_regular(path)?;
    let len = meta.len();
    if let Some(expected) = expected_len.filter(|&e| e != len) {
        return Err(Error::LengthChanged {
            file: path.to_owned(),
            expected,
            found: len,
        });
    }
    Ok((file, len))
}

/// A hasher fed bytes `[offset, offset + n)` of `file` (of `len` bytes), its input offset set
/// to `offset` so a piece of a larger file yields that subtree's chaining value.
fn hash_range(
    path: &str,
    file: &std::fs::File,
    len: u64,
    offset: u64,
    n: u64,
) -> Result<blake3::Hasher> {
    use blake3::hazmat::HasherExt;
    let end = offset + n;
    let cap = usize::try_from(n).map_or(CHUNK, |l| l.min(CHUNK));
    // Cache-line aligned: unaligned read buffers made the kernel's copy 3-5x slower here.
    let mut cur = AlignedVec::<u8>::zeroed(cap)?;
    let mut next = AlignedVec::<u8>::zeroed(cap)?;
    // Fills buf with the (at most CHUNK) bytes at `off`; 0 at the end of the range.
    let read = |buf: &mut [u8], off: u64| -> Result<usize> {
        let k = (end - off).min(cap as u64) as usize;
        read_exact_at(file, &mut buf[..k], off).map_err(|e| read_error(path, file, len, e))?;
        Ok(k)
    };
    let mut hasher = blake3::Hasher::new();
    hasher.set_input_offset(offset);
    let mut off = offset;
    let mut k = read(&mut cur, off)?;
    while k > 0 {
        off += k as u64;
        let piece = &cur[..k];
        let (_, r) = rayon::join(
            || {
                if piece.len() >= RAYON_MIN {
                    hasher.update_rayon(piece);
                } else {
                    hasher.update(piece);
                }
            },
            || read(&mut next, off),
        );
        k = r?;
        std::mem::swap(&mut cur, &mut next);
    }
    Ok(hasher)
}

/// A byte past the length read means the file grew: the digest would not be its content.
fn check_end(path: &str, file: &std::fs::File, len: u64) -> Result<()> {
    match read_exact_at(file, &mut [0u8; 1], len) {
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(()),
        Err(e) => Err(read_error(path, file, len, e)),
        Ok(()) => Err(Error::LengthChanged {
            file: path.to_owned(),
            expected: len,
            found: file.metadata().map_or(len + 1, |m| m.len()),
        }),
    }
}

/// The pieces `(offset, bytes)` a file of `len` bytes is hashed in, with pieces of `piece`
/// bytes (a power of two >= 1024, so every piece but a file's last is a complete BLAKE3
/// subtree and the last a node on the tree's right edge: docs/design.md section 1.3): one
/// piece (the whole file) when it fits in one.
pub fn pieces(len: u64, piece: u64) -> Result<Vec<(u64, u64)>> {
    if !piece.is_power_of_two() || piece < blake3::CHUNK_LEN as u64 {
        return Err(Error::config(
            "piece",
            format!("must be a power of two >= 1024, got {piece}"),
        ));
    }
    if len <= piece {
        return Ok(vec![(0, len)]);
    }
    Ok((0..len.div_ceil(piece))
        .map(|i| (i * piece, piece.min(len - i * piece)))
        .collect())
}

/// One piece of a shared digest: the 32 bytes of bytes `[offset, offset + n)` of `path`, which
/// must have `len` bytes. When the piece is the whole file it is the file's BLAKE3 (as
/// [`digest_file`]); otherwise that subtree's chaining value, for [`merge_pieces`]. A file of
/// another length, or one that changes while read, is [`Error::LengthChanged`].
pub fn digest_piece(path: &str, len: u64, offset: u64, n: u64) -> Result<[u8; 32]> {
    use blake3::hazmat::HasherExt;
    if offset.checked_add(n).is_none_or(|end| end > len) {
        return Err(Error::config(
            "piece",
            format!("[{offset}, +{n}) is outside a file of {len} bytes"),
        ));
    }
    let (file, _) = open_checked(path, Some(len))?;
    let hasher = hash_range(path, &file, len, offset, n)?;
    if offset + n == len {
        check_end(path, &file, len)?;
    }
    Ok(if offset == 0 && n == len {
        *hasher.finalize().as_bytes()
    } else {
        hasher.finalize_non_root()
    })
}

/// [`digest_piece`] of every `(path, len, offset, n)`, in parallel; results in the order
/// given. On failure the error of the first failing piece (in that order), as
/// [`digest_files`].
pub fn digest_pieces<P: AsRef<str> + Sync>(pieces: &[(P, u64, u64, u64)]) -> Result<Vec<[u8; 32]>> {
    let results: Vec<Result<[u8; 32]>> = pieces
        .par_iter()
        .map(|(p, len, offset, n)| digest_piece(p.as_ref(), *len, *offset, *n))
        .collect();
    results.into_iter().collect()
}

/// The BLAKE3 of a file of `len` bytes from its pieces' values ([`pieces`]`(len, piece)` order,
/// each from [`digest_piece`]): the tree's upper nodes rebuilt exactly as BLAKE3 splits them
/// (the left subtree is the largest power-of-two number of chunks that leaves the right one
/// non-empty).
pub fn merge_pieces(len: u64, piece: u64, values: &[[u8; 32]]) -> Result<blake3::Hash> {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, Mode};
    let want = pieces(len, piece)?.len();
    if values.len() != want {
        return Err(Error::config(
            "pieces",
            format!(
                "a file of {len} bytes has {want} pieces, got {}",
                values.len()
            ),
        ));
    }
    if want == 1 {
        return Ok(blake3::Hash::from_bytes(values[0]));
    }
    // The value of the subtree over [a, b): a piece, or the merge of its two halves.
    fn node(a: u64, b: u64, piece: u64, values: &[[u8; 32]]) -> [u8; 32] {
        if b - a <= piece {
            return values[(a / piece) as usize];
        }
        let mid = a + left_subtree_len(b - a);
        let (l, r) = (node(a, mid, piece, values), node(mid, b, piece, values));
        merge_subtrees_non_root(&l, &r, Mode::Hash)
    }
    let mid = left_subtree_len(len);
    let (l, r) = (node(0, mid, piece, values), node(mid, len, piece, values));
    Ok(merge_subtrees_root(&l, &r, Mode::Hash))
}

/// [`digest_file`] of every path, in parallel; results in the order of `paths`. On failure the
/// error of the first failing path (in that order) is returned, so it does not depend on timing.
pub fn digest_files<P: AsRef<str> + Sync>(
    paths: &[P],
    expected_lens: Option<&[u64]>,
) -> Result<Vec<blake3::Hash>> {
    if let Some(e) = expected_lens.filter(|e| e.len() != paths.len()) {
        return Err(Error::config(
            "expected_lengths",
            format!("has {} entries but paths has {}", e.len(), paths.len()),
        ));
    }
    let results: Vec<Result<blake3::Hash>> = paths
        .par_iter()
        .enumerate()
        .map(|(i, p)| digest_file(p.as_ref(), expected_lens.map(|e| e[i])))
        .collect();
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    /// Deterministic, non-repeating bytes (a repeating pattern could hide an offset mistake).
    fn bytes(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect()
    }

    #[test]
    fn equals_one_shot_blake3_at_chunk_edges() {
        let t = TempDir::new("digest");
        let sizes = [
            0,
            1,
            RAYON_MIN - 1,
            RAYON_MIN,
            CHUNK - 1,
            CHUNK,
            CHUNK + 1,
            3 * CHUNK + 12345,
        ];
        let mut paths = Vec::new();
        let mut want = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let b = bytes(n, i as u64);
            want.push(blake3::hash(&b));
            paths.push(t.file(&format!("f{i}"), &b));
        }
        assert_eq!(digest_files(&paths, None).unwrap(), want);
        let lens: Vec<u64> = sizes.iter().map(|&n| n as u64).collect();
        assert_eq!(digest_files(&paths, Some(&lens)).unwrap(), want);
        // Known answer: BLAKE3 of the empty input.
        assert_eq!(
            want[0].to_hex().as_str(),
            "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
        );
    }

    #[test]
    fn errors_name_the_file() {
        let t = TempDir::new("digest-err");
        let ok = t.file("ok", &bytes(100, 1));
        let missing = t.0.join("missing").to_str().unwrap().to_owned();
        let e = digest_files(&[&ok, &missing], None).unwrap_err();
        assert!(
            matches!(e, Error::Data { ref file, .. } if *file == missing),
            "{e}"
        );
        // A length other than the dataset saw: the file changed since it was opened.
        let e = digest_files(&[&ok], Some(&[99])).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{ok}: data file changed length while being read (expected 99 bytes, found 100)"
            )
        );
        assert!(matches!(
            digest_files(&[&ok], Some(&[1, 2])),
            Err(Error::Config { ref key, .. }) if key == "expected_lengths"
        ));
        let dir = t.0.to_str().unwrap();
        assert!(matches!(digest_file(dir, None), Err(Error::Data { .. })));
    }

    #[test]
    fn truncation_during_the_digest_is_an_error_not_a_signal() {
        let t = TempDir::new("digest-trunc");
        let n = 64 * CHUNK; // 64 MiB: long enough to truncate while the digest runs
        let p = t.file("big", &bytes(n, 7));
        let file = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        let mut truncated = false;
        // The truncation races the reads; retry until it lands mid-digest (usually first try).
        for _ in 0..20 {
            file.set_len(n as u64).unwrap();
            let path = p.clone();
            let h = std::thread::spawn(move || digest_file(&path, None));
            std::thread::sleep(std::time::Duration::from_millis(2));
            file.set_len(n as u64 / 2).unwrap();
            match h.join().unwrap() {
                Err(Error::LengthChanged {
                    file,
                    expected,
                    found,
                }) => {
                    assert_eq!((file, expected), (p.clone(), n as u64));
                    assert_eq!(found, n as u64 / 2);
                    truncated = true;
                    break;
                }
                Ok(_) => continue, // finished before the truncation
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        assert!(truncated, "the truncation never landed during a digest");
        // Grown: longer than expected.
        file.set_len(n as u64).unwrap();
        assert!(matches!(
            digest_file(&p, Some(n as u64 / 2)),
            Err(Error::LengthChanged { .. })
        ));
    }

    #[test]
    fn pieces_merge_to_the_one_shot_hash() {
        let t = TempDir::new("digest-pieces");
        for (i, &n) in [
            0usize,
            1,
            1023,
            1024,
            1025,
            2048,
            4096,
            4097,
            3 * 1024 + 5,
            10_000,
            65537,
        ]
        .iter()
        .enumerate()
        {
            let b = bytes(n, 100 + i as u64);
            let p = t.file(&format!("p{i}"), &b);
            for piece in [1024u64, 2048, 4096, 1 << 20] {
                let plan = pieces(n as u64, piece).unwrap();
                let values: Vec<[u8; 32]> = plan
                    .iter()
                    .map(|&(o, k)| digest_piece(&p, n as u64, o, k).unwrap())
                    .collect();
                let got = merge_pieces(n as u64, piece, &values).unwrap();
                assert_eq!(got, blake3::hash(&b), "n={n} piece={piece}");
            }
        }
        assert!(pieces(10, 1000).is_err() && pieces(10, 512).is_err());
        let p = t.file("x", &bytes(5000, 9));
        assert!(matches!(
            merge_pieces(5000, 1024, &[[0u8; 32]; 3]),
            Err(Error::Config { .. })
        ));
        assert!(matches!(
            digest_piece(&p, 5000, 4096, 1000),
            Err(Error::Config { .. })
        ));
        assert!(matches!(
            digest_piece(&p, 4999, 0, 1024),
            Err(Error::LengthChanged {
                expected: 4999,
                found: 5000,
                ..
            })
        ));
    }
}
