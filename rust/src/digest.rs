//! Content digests: the BLAKE3 of every byte of a recording's dataset
//! (docs/design.md "Dataset identity"). For a loose data file that is the whole file; for a
//! member of an archive it is the member's byte region `[base, base + size)` of the archive
//! file, hashed as an input of its own (input offset 0 at `base`), so a member's digest is the
//! BLAKE3 of its bytes wherever they are stored. No cache: every call reads every byte.
//!
//! Files are read with plain positioned reads, never memory-mapped: a file truncated during the
//! digest makes a read come up short, reported as [`Error::LengthChanged`] naming the file, where
//! a mapped page would kill the process with SIGBUS. Each region is read in [`CHUNK`] pieces and
//! a piece is hashed (with blake3's multi-threaded `update_rayon`) while the next one is read;
//! files are digested in parallel on rayon's pool. Memory: two chunk buffers per file in flight.
//!
//! A large region's digest can be shared out: [`pieces`] cuts it into subtrees, each hashed on
//! its own ([`digest_piece`], maybe on another host) and merged back ([`merge_pieces`]).

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
/// A file that shrinks or grows while being read is [`Error::LengthChanged`] too. The whole-file
/// case of [`digest_region`].
pub fn digest_file(path: &str, expected_len: Option<u64>) -> Result<blake3::Hash> {
    digest_at(path, expected_len, 0, None)
}

/// BLAKE3 of bytes `[base, base + size)` of `path`, hashed as a standalone input. The file must
/// have `file_len` bytes (else [`Error::LengthChanged`], before anything is read); a region
/// outside `file_len` is a config error (`region`). A read that comes up short is
/// [`Error::LengthChanged`], and so, when the region ends at the end of the file, is a byte
/// readable past it (the file grew).
pub fn digest_region(path: &str, file_len: u64, base: u64, size: u64) -> Result<blake3::Hash> {
    digest_at(path, Some(file_len), base, Some(size))
}

/// The region `[base, base + size)` of `path` (`size` None: to the end of the file), the file's
/// length checked against `expected_len` when given.
fn digest_at(
    path: &str,
    expected_len: Option<u64>,
    base: u64,
    size: Option<u64>,
) -> Result<blake3::Hash> {
    if let Some(len) = expected_len {
        region_size(path, len, base, size)?; // a bad argument before any I/O
    }
    let (file, len) = open_checked(path, expected_len)?;
    let size = region_size(path, len, base, size)?;
    let hasher = hash_range(path, &file, len, base, size, 0)?;
    if base + size == len {
        check_end(path, &file, len)?;
    }
    Ok(hasher.finalize())
}

/// The size of region `[base, base + size)` (`size` None: to the end) of a file of `len`
/// bytes, which must hold it.
fn region_size(path: &str, len: u64, base: u64, size: Option<u64>) -> Result<u64> {
    let size = size.unwrap_or(len.saturating_sub(base));
    if base.checked_add(size).is_none_or(|end| end > len) {
        return Err(Error::config(
            "region",
            format!("{path}: [{base}, +{size}) is outside a file of {len} bytes"),
        ));
    }
    Ok(size)
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

/// A hasher fed bytes `[at, at + n)` of `file` (of `len` bytes), its input offset set to
/// `input_offset` (a multiple of the BLAKE3 chunk) so a piece of a larger input yields that
/// subtree's chaining value.
fn hash_range(
    path: &str,
    file: &std::fs::File,
    len: u64,
    at: u64,
    n: u64,
    input_offset: u64,
) -> Result<blake3::Hasher> {
    use blake3::hazmat::HasherExt;
    let end = at + n;
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
    hasher.set_input_offset(input_offset);
    let mut off = at;
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

/// The pieces `(offset, bytes)` a region of `len` bytes is hashed in, with pieces of `piece`
/// bytes (a power of two >= 1024, so every piece but a region's last is a complete BLAKE3
/// subtree and the last a node on the tree's right edge: docs/design.md "Shared digests"): one
/// piece (the whole region) when it fits in one. Offsets are within the region.
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

/// One piece of a shared digest: the 32 bytes of the region `[base, base + region)` of `path`
/// (which must have `len` bytes) over its bytes `[offset, offset + n)` (offsets within the
/// region: file bytes `[base + offset, base + offset + n)`). When the piece is the whole region
/// it is the region's BLAKE3 (as [`digest_region`]); otherwise that subtree's chaining value,
/// for [`merge_pieces`]. A file of another length, or one that changes while read, is
/// [`Error::LengthChanged`]. A region outside the file is a config error (`region`), and so
/// (`piece`) is a piece outside the region or one that is not a BLAKE3 subtree (an offset that
/// is not a multiple of 1024, an empty piece, more bytes than a subtree at its offset holds).
pub fn digest_piece(
    path: &str,
    len: u64,
    base: u64,
    region: u64,
    offset: u64,
    n: u64,
) -> Result<[u8; 32]> {
    use blake3::hazmat::{max_subtree_len, HasherExt};
    region_size(path, len, base, Some(region))?;
    let bad = |why: String| {
        Err(Error::config(
            "piece",
            format!("{path}: [{offset}, +{n}) {why}"),
        ))
    };
    if offset.checked_add(n).is_none_or(|end| end > region) {
        return bad(format!("is outside a region of {region} bytes"));
    }
    let whole = offset == 0 && n == region;
    if offset % blake3::CHUNK_LEN as u64 != 0 {
        return bad("does not start on a BLAKE3 chunk (a multiple of 1024)".into());
    }
    if !whole && n == 0 {
        return bad("is empty (only a whole empty region has a value)".into());
    }
    if let Some(max) = max_subtree_len(offset).filter(|&m| n > m) {
        return bad(format!(
            "is more than the {max} bytes of a subtree at its offset"
        ));
    }
    let (file, _) = open_checked(path, Some(len))?;
    let hasher = hash_range(path, &file, len, base + offset, n, offset)?;
    if base + offset + n == len {
        check_end(path, &file, len)?;
    }
    Ok(if whole {
        *hasher.finalize().as_bytes()
    } else {
        hasher.finalize_non_root()
    })
}

/// One piece for [`digest_pieces`]: the arguments of [`digest_piece`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Piece<P> {
    pub path: P,
    /// The file's length.
    pub len: u64,
    /// The region's first byte in the file, and its length.
    pub base: u64,
    pub region: u64,
    /// The piece's offset within the region, and its length.
    pub offset: u64,
    pub size: u64,
}

/// [`digest_piece`] of every piece, in parallel; results in the order given. On failure the
/// error of the first failing piece (in that order), as [`digest_files`].
pub fn digest_pieces<P: AsRef<str> + Sync>(pieces: &[Piece<P>]) -> Result<Vec<[u8; 32]>> {
    let results: Vec<Result<[u8; 32]>> = pieces
        .par_iter()
        .map(|p| digest_piece(p.path.as_ref(), p.len, p.base, p.region, p.offset, p.size))
        .collect();
    results.into_iter().collect()
}

/// The BLAKE3 of a region of `len` bytes from its pieces' values ([`pieces`]`(len, piece)`
/// order, each from [`digest_piece`]): the tree's upper nodes rebuilt exactly as BLAKE3 splits
/// them (the left subtree is the largest power-of-two number of chunks that leaves the right one
/// non-empty).
pub fn merge_pieces(len: u64, piece: u64, values: &[[u8; 32]]) -> Result<blake3::Hash> {
    use blake3::hazmat::{left_subtree_len, merge_subtrees_non_root, merge_subtrees_root, Mode};
    let want = pieces(len, piece)?.len();
    if values.len() != want {
        return Err(Error::config(
            "pieces",
            format!(
                "a region of {len} bytes has {want} pieces, got {}",
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

/// The digest of each path's region, in parallel; results in the order of `paths`.
/// `expected_lens[i]`: the length `paths[i]` must have (default: its length at open).
/// `offsets[i]`, `sizes[i]`: its region `[offset, offset + size)` (defaults: 0, and to the end
/// of the file): the whole file is [`digest_file`], a region [`digest_region`]. A list of
/// another length than `paths` is a config error naming it. On failure the error of the first
/// failing path (in that order) is returned, so it does not depend on timing.
pub fn digest_files<P: AsRef<str> + Sync>(
    paths: &[P],
    expected_lens: Option<&[u64]>,
    offsets: Option<&[u64]>,
    sizes: Option<&[u64]>,
) -> Result<Vec<blake3::Hash>> {
    for (key, list) in [
        ("expected_lengths", expected_lens),
        ("offsets", offsets),
        ("sizes", sizes),
    ] {
        if let Some(e) = list.filter(|e| e.len() != paths.len()) {
            return Err(Error::config(
                key,
                format!("has {} entries but paths has {}", e.len(), paths.len()),
            ));
        }
    }
    let results: Vec<Result<blake3::Hash>> = paths
        .par_iter()
        .enumerate()
        .map(|(i, p)| {
            digest_at(
                p.as_ref(),
                expected_lens.map(|e| e[i]),
                offsets.map_or(0, |o| o[i]),
                sizes.map(|s| s[i]),
            )
        })
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
        assert_eq!(digest_files(&paths, None, None, None).unwrap(), want);
        let lens: Vec<u64> = sizes.iter().map(|&n| n as u64).collect();
        assert_eq!(digest_files(&paths, Some(&lens), None, None).unwrap(), want);
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
        let e = digest_files(&[&ok, &missing], None, None, None).unwrap_err();
        assert!(
            matches!(e, Error::Data { ref file, .. } if *file == missing),
            "{e}"
        );
        // A length other than the dataset saw: the file changed since it was opened.
        let e = digest_files(&[&ok], Some(&[99]), None, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{ok}: data file changed length while being read (expected 99 bytes, found 100)"
            )
        );
        assert!(matches!(
            digest_files(&[&ok], Some(&[1, 2]), None, None),
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
                    .map(|&(o, k)| digest_piece(&p, n as u64, 0, n as u64, o, k).unwrap())
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
            digest_piece(&p, 5000, 0, 5000, 4096, 1000),
            Err(Error::Config { .. })
        ));
        assert!(matches!(
            digest_piece(&p, 4999, 0, 4999, 0, 1024),
            Err(Error::LengthChanged {
                expected: 4999,
                found: 5000,
                ..
            })
        ));
    }

    #[test]
    fn a_region_is_the_blake3_of_its_bytes_and_the_whole_file_is_unchanged() {
        let t = TempDir::new("digest-region");
        let n = 3 * CHUNK + 5000;
        let b = bytes(n, 21);
        let p = t.file("archive", &b);
        let len = n as u64;
        for (base, size) in [
            (0usize, 0usize),
            (0, n),
            (0, 1),
            (1, 0),
            (1, 1),
            (512, 1024),
            (1000, 4096),
            (4096, RAYON_MIN - 1),
            (12345, RAYON_MIN + 1),
            (777, CHUNK - 1),
            (777, CHUNK),
            (777, CHUNK + 1),
            (CHUNK - 1, 2 * CHUNK + 3),
            (CHUNK, n - CHUNK),
            (n - 1, 1),
            (n, 0),
            (1, n - 1),
        ] {
            let want = blake3::hash(&b[base..base + size]);
            let got = digest_region(&p, len, base as u64, size as u64).unwrap();
            assert_eq!(got, want, "[{base}, +{size})");
        }
        // The whole-file case: a file's digest is the BLAKE3 of all of it, as for a loose file.
        let whole = blake3::hash(&b);
        assert_eq!(digest_region(&p, len, 0, len).unwrap(), whole);
        assert_eq!(digest_file(&p, None).unwrap(), whole);
        assert_eq!(digest_file(&p, Some(len)).unwrap(), whole);
        // digest_files with regions; defaults are offset 0 and to the end of the file.
        let q = t.file("loose", &bytes(5000, 22));
        let qb = std::fs::read(&q).unwrap();
        let paths = [&p, &q, &p, &q];
        let got = digest_files(
            &paths,
            Some(&[len, 5000, len, 5000]),
            Some(&[4096, 0, 10, 100]),
            Some(&[1000, 5000, 3 * CHUNK as u64, 4900]),
        )
        .unwrap();
        let want = [
            blake3::hash(&b[4096..5096]),
            blake3::hash(&qb),
            blake3::hash(&b[10..10 + 3 * CHUNK]),
            blake3::hash(&qb[100..]),
        ];
        assert_eq!(got, want);
        let got = digest_files(&paths, None, Some(&[7, 0, 0, 4999]), None).unwrap();
        let want = [
            blake3::hash(&b[7..]),
            blake3::hash(&qb),
            whole,
            blake3::hash(&qb[4999..]),
        ];
        assert_eq!(got, want);
        let got = digest_files(&[&q], None, None, Some(&[10])).unwrap();
        assert_eq!(got, [blake3::hash(&qb[..10])]);
    }

    #[test]
    fn region_errors() {
        let t = TempDir::new("digest-region-err");
        let p = t.file("a", &bytes(5000, 23));
        // Outside the file: a bad argument, named, before any I/O (the length is not checked).
        for (len, base, size) in [(5000, 4000, 1001), (5000, 5001, 0), (9, 0, u64::MAX)] {
            let e = digest_region(&p, len, base, size).unwrap_err();
            assert!(
                matches!(&e, Error::Config { key, .. } if key == "region"),
                "{base} {size}: {e}"
            );
            assert!(e.to_string().contains(&p), "{e}");
        }
        // Another length than the caller saw: LengthChanged, though the region is inside both.
        assert!(matches!(
            digest_region(&p, 4999, 0, 100),
            Err(Error::LengthChanged {
                expected: 4999,
                found: 5000,
                ..
            })
        ));
        assert!(matches!(
            digest_files(&[&p], None, Some(&[5001]), None),
            Err(Error::Config { ref key, .. }) if key == "region"
        ));
        for (key, o, s) in [
            ("offsets", Some(&[0u64, 0][..]), None),
            ("sizes", None, Some(&[1u64, 2, 3][..])),
        ] {
            assert!(matches!(
                digest_files(&[&p], None, o, s),
                Err(Error::Config { key: ref k, .. }) if k == key
            ));
        }
        let missing = t.0.join("missing").to_str().unwrap().to_owned();
        assert!(matches!(
            digest_region(&missing, 10, 0, 5),
            Err(Error::Data { ref file, .. }) if *file == missing
        ));
    }

    #[test]
    fn pieces_of_a_region_merge_to_the_region_digest() {
        let t = TempDir::new("digest-region-pieces");
        let n = 200_000usize;
        let b = bytes(n, 31);
        let p = t.file("archive", &b);
        let len = n as u64;
        for &size in &[0usize, 1, 1023, 1024, 1025, 2048, 4097, 3 * 1024 + 5, 65537] {
            for &base in &[0usize, 1, 1000, 4096, 12345, n - size] {
                let want = blake3::hash(&b[base..base + size]);
                for piece in [1024u64, 2048, 4096, 1 << 20] {
                    let plan = pieces(size as u64, piece).unwrap();
                    let values: Vec<[u8; 32]> = plan
                        .iter()
                        .map(|&(o, k)| {
                            digest_piece(&p, len, base as u64, size as u64, o, k).unwrap()
                        })
                        .collect();
                    let got = merge_pieces(size as u64, piece, &values).unwrap();
                    assert_eq!(got, want, "base={base} size={size} piece={piece}");
                    // The same through digest_pieces.
                    let specs: Vec<Piece<&str>> = plan
                        .iter()
                        .map(|&(offset, k)| Piece {
                            path: p.as_str(),
                            len,
                            base: base as u64,
                            region: size as u64,
                            offset,
                            size: k,
                        })
                        .collect();
                    assert_eq!(digest_pieces(&specs).unwrap(), values);
                }
            }
        }
    }

    #[test]
    fn a_large_region_in_pieces_across_read_chunks() {
        // Pieces larger than a read chunk, at a base that is not chunk aligned.
        let t = TempDir::new("digest-region-big");
        let n = 5 * CHUNK + 3333;
        let b = bytes(n, 41);
        let p = t.file("archive", &b);
        let (base, size) = (777u64, 4 * CHUNK as u64 + 1234);
        let want = blake3::hash(&b[base as usize..(base + size) as usize]);
        assert_eq!(digest_region(&p, n as u64, base, size).unwrap(), want);
        for piece in [1u64 << 20, 2 << 20] {
            let values: Vec<[u8; 32]> = pieces(size, piece)
                .unwrap()
                .iter()
                .map(|&(o, k)| digest_piece(&p, n as u64, base, size, o, k).unwrap())
                .collect();
            assert_eq!(merge_pieces(size, piece, &values).unwrap(), want);
        }
    }

    #[test]
    fn pieces_that_are_not_subtrees_are_config_errors_not_panics() {
        let t = TempDir::new("digest-piece-err");
        let p = t.file("a", &bytes(10_000, 51));
        let piece_err =
            |r: Result<[u8; 32]>| matches!(r, Err(Error::Config { ref key, .. }) if key == "piece");
        // Not on a chunk boundary.
        assert!(piece_err(digest_piece(&p, 10_000, 0, 10_000, 100, 1024)));
        // Empty, and not the whole region.
        assert!(piece_err(digest_piece(&p, 10_000, 0, 10_000, 1024, 0)));
        assert!(piece_err(digest_piece(&p, 10_000, 0, 10_000, 0, 0)));
        // More than the subtree at its offset holds (1024 bytes at chunk 1).
        assert!(piece_err(digest_piece(&p, 10_000, 0, 10_000, 1024, 2048)));
        // Outside the region, though inside the file.
        assert!(piece_err(digest_piece(&p, 10_000, 100, 2000, 1024, 1000)));
        // A region outside the file.
        assert!(matches!(
            digest_piece(&p, 10_000, 9000, 1001, 0, 1001),
            Err(Error::Config { ref key, .. }) if key == "region"
        ));
        // The whole empty region is its BLAKE3.
        assert_eq!(
            digest_piece(&p, 10_000, 5000, 0, 0, 0).unwrap(),
            *blake3::hash(b"").as_bytes()
        );
        // The whole region: its BLAKE3; a piece ending at the end of the file checks it.
        let b = std::fs::read(&p).unwrap();
        assert_eq!(
            digest_piece(&p, 10_000, 3000, 7000, 0, 7000).unwrap(),
            *blake3::hash(&b[3000..]).as_bytes()
        );
    }
}
