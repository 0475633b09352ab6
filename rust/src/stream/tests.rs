use std::sync::Mutex;

use super::*;
use crate::io::AlignedVec;
use crate::permutation::Permutation;
use crate::testutil::{open_plain, TempDir};

/// ci16_le dataset whose sample k of recording r is (r*1000 + k, -(r*1000 + k)).
fn dataset(t: &TempDir, lens: &[i32], window: u64, stride: u64) -> Arc<Dataset> {
    let paths: Vec<String> = lens
        .iter()
        .enumerate()
        .map(|(r, &len)| {
            let bytes: Vec<u8> = (0..len)
                .flat_map(|k| {
                    let v = (r as i32 * 1000 + k) as i16;
                    [v.to_le_bytes(), (-v).to_le_bytes()].concat()
                })
                .collect();
            t.file(&format!("r{r}.sigmf-data"), &bytes)
        })
        .collect();
    Arc::new(open_plain(&paths, &vec!["ci16_le"; paths.len()], window, stride).unwrap())
}

fn take(s: &mut Stream, k: usize) -> Vec<(Vec<u64>, Buffer)> {
    (0..k)
        .map(|_| {
            let b = s.next_batch().unwrap();
            (s.last_ids().to_vec(), b)
        })
        .collect()
}

#[test]
fn spec_validation() {
    assert!(
        matches!(StreamSpec::new(10, 0, 0, 0, 1), Err(Error::Config { ref key, .. }) if key == "batch_size")
    );
    assert!(
        matches!(StreamSpec::new(10, 6, 0, 0, 4), Err(Error::Config { ref key, .. }) if key == "batch_size")
    );
    assert!(
        matches!(StreamSpec::new(10, 8, 0, 4, 4), Err(Error::Config { ref key, .. }) if key == "rank")
    );
    assert!(
        matches!(StreamSpec::new(10, 8, 0, 0, 0), Err(Error::Config { ref key, .. }) if key == "world_size")
    );
    let s = StreamSpec::new(10, 8, 0, 0, 1).unwrap();
    assert!(
        matches!(s.batch_ids(u64::MAX - 3), Err(Error::Config { ref key, .. }) if key == "samples_consumed")
    );
}

#[test]
fn epochs_cover_every_window_once_and_batches_straddle() {
    let spec = StreamSpec::new(37, 8, 5, 0, 1).unwrap();
    // 37 * 8 samples = exactly 8 epochs; batch 4 straddles epochs 0 and 1 (samples 32..40).
    let all: Vec<u64> = (0..37)
        .flat_map(|k| spec.batch_ids(k * 8).unwrap())
        .collect();
    for e in 0..8 {
        let mut ep: Vec<u64> = all[e * 37..(e + 1) * 37].to_vec();
        let p = Permutation::new(37, 5, e as u64);
        assert_eq!(ep, (0..37).map(|i| p.index(i)).collect::<Vec<_>>());
        ep.sort_unstable();
        assert_eq!(ep, (0..37).collect::<Vec<_>>());
    }
    assert_ne!(all[..37], all[37..74]);
}

#[test]
fn seek_equals_iteration_and_prefetch_is_invisible() {
    let t = TempDir::new("seek");
    let ds = dataset(&t, &[50, 3, 71, 20], 8, 5);
    let n = ds.num_windows();
    assert_eq!(n, 9 + 13 + 3);
    let mut reference = Stream::new(ds.clone(), 6, 42, 0, 1, 0).unwrap();
    let want = take(&mut reference, 20); // 120 samples: several epochs, straddling batches
    assert_eq!(reference.samples_consumed(), 120);
    assert_eq!(reference.batches_consumed(), 20);
    for depth in [1usize, 2, 5] {
        let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
        assert!(s.last_ids().is_empty());
        assert_eq!(take(&mut s, 20), want, "prefetch {depth}");
    }
    // Recycled (scribbled-on) buffers never leak into later batches.
    for depth in [0usize, 3] {
        let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
        for (k, w) in want.iter().enumerate() {
            let mut b = s.next_batch().unwrap();
            assert_eq!((s.last_ids(), &b), (&w.0[..], &w.1), "k={k} depth={depth}");
            b.as_bytes_mut().fill(0x55);
            s.pool().give(b);
        }
    }
    for k in [0usize, 1, 4, 7, 19] {
        for depth in [0usize, 2] {
            let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
            take(&mut s, 3); // seek must drop whatever was prefetched
            s.seek(6 * k as u64).unwrap();
            assert!(s.last_ids().is_empty());
            assert_eq!(s.batches_consumed(), k as u64);
            assert_eq!(take(&mut s, 1)[0], want[k], "k={k} depth={depth}");
        }
    }
    // Each row is the window its id names.
    let (ids, buf) = &want[0];
    let Buffer::I16(v) = buf else { panic!("dtype") };
    for (j, &id) in ids.iter().enumerate() {
        let mut row = vec![0u8; ds.row_bytes()];
        ds.fill_row(id, &mut row).unwrap();
        let row: Vec<i16> = row
            .chunks_exact(2)
            .map(|c| i16::from_ne_bytes([c[0], c[1]]))
            .collect();
        assert_eq!(&v[j * 16..(j + 1) * 16], &row[..]);
    }
}

#[test]
fn rank_slices_concatenate_to_the_global_batch() {
    let t = TempDir::new("ranks");
    let ds = dataset(&t, &[64, 40], 4, 3);
    let mut one = Stream::new(ds.clone(), 8, 9, 0, 1, 0).unwrap();
    let want = take(&mut one, 12);
    for w in [1u64, 2, 4] {
        let mut ranks: Vec<Stream> = (0..w)
            .map(|r| Stream::new(ds.clone(), 8, 9, r, w, 2).unwrap())
            .collect();
        for (k, (ids, buf)) in want.iter().enumerate() {
            let mut cat_ids = Vec::new();
            let mut cat = Vec::new();
            for s in ranks.iter_mut() {
                let Buffer::I16(v) = s.next_batch().unwrap() else {
                    panic!("dtype")
                };
                cat_ids.extend_from_slice(s.last_ids());
                cat.extend_from_slice(&v);
            }
            assert_eq!(&cat_ids, ids, "W={w} batch {k}");
            let Buffer::I16(want) = buf else {
                panic!("dtype")
            };
            assert_eq!(&cat[..], &want[..], "W={w} batch {k}");
        }
    }
    // A cursor saved at W=4 resumes at W=2 (and at another batch size) on the next sample.
    let mut w4: Vec<Stream> = (0..4)
        .map(|r| Stream::new(ds.clone(), 8, 9, r, 4, 1).unwrap())
        .collect();
    for s in w4.iter_mut() {
        take(s, 5);
    }
    let cursor = w4[0].samples_consumed();
    assert_eq!(cursor, 40);
    let mut w2: Vec<Stream> = (0..2)
        .map(|r| Stream::new(ds.clone(), 8, 9, r, 2, 2).unwrap())
        .collect();
    let mut ids = Vec::new();
    for s in w2.iter_mut() {
        s.seek(cursor).unwrap();
        s.next_batch().unwrap();
        ids.extend_from_slice(s.last_ids());
    }
    assert_eq!(ids, want[5].0);
    let mut b4 = Stream::new(ds.clone(), 4, 9, 0, 1, 0).unwrap();
    b4.seek(cursor + 4).unwrap();
    b4.next_batch().unwrap();
    assert_eq!(b4.last_ids(), &want[5].0[4..]);
}

#[test]
fn huge_sparse_dataset_opens_fast() {
    let t = TempDir::new("sparse");
    // 2^31 ci8 samples (4 GiB sparse), window 2, stride 2: 2^30 > 10^9 windows.
    let p = t.0.join("big.sigmf-data");
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(1u64 << 32).unwrap();
    let start = std::time::Instant::now();
    let ds = Arc::new(open_plain(&[p.to_str().unwrap()], &["ci8"], 2, 2).unwrap());
    assert_eq!(ds.num_windows(), 1 << 30);
    let mut s = Stream::new(ds, 256, 1, 0, 1, 2).unwrap();
    let Buffer::I8(v) = s.next_batch().unwrap() else {
        panic!("dtype")
    };
    assert_eq!(v.len(), 256 * 4);
    assert!(s.last_ids().iter().all(|&i| i < 1 << 30));
    assert!(start.elapsed().as_secs_f64() < 1.0, "{:?}", start.elapsed());
}

#[test]
fn a_truncated_file_fails_the_batch_from_the_prefetch_thread_and_recovers() {
    let t = TempDir::new("stream-trunc");
    let ds = dataset(&t, &[400], 4, 4); // one ci16 recording, 100 windows
    let path = ds.recordings()[0].path.clone();
    let full = std::fs::read(&path).unwrap();
    let mut reference = Stream::new(ds.clone(), 8, 3, 0, 1, 0).unwrap();
    let want = take(&mut reference, 12);
    for depth in [0usize, 1, 3] {
        std::fs::write(&path, &full).unwrap();
        let mut s = Stream::new(ds.clone(), 8, 3, 0, 1, depth).unwrap();
        take(&mut s, 2); // the prefetch thread is running and has batches queued
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        // Batches assembled before the truncation may still arrive; then the error does.
        let mut failed_at = None;
        for _ in 0..=depth + 1 {
            let pos = s.samples_consumed();
            match s.next_batch() {
                Ok(_) => {}
                Err(e) => {
                    let Error::LengthChanged { file, found, .. } = &e else {
                        panic!("depth {depth}: {e}")
                    };
                    assert_eq!((file, *found), (&path, 0));
                    assert_eq!(s.samples_consumed(), pos, "a failed batch is not consumed");
                    failed_at = Some(pos);
                    break;
                }
            }
        }
        let pos = failed_at.unwrap_or_else(|| panic!("depth {depth}: no error"));
        std::fs::write(&path, &full).unwrap();
        // The same stream continues with exactly the batch that failed.
        let k = (pos / 8) as usize;
        let got = s.next_batch().unwrap();
        assert_eq!(
            (s.last_ids(), &got),
            (&want[k].0[..], &want[k].1),
            "depth {depth}"
        );
    }
}

/// Many batches with the consumer always waiting (it claims rows of the batch being
/// assembled, and completes it when it finishes first): batches from the stream's own ring and
/// from a caller's ring equal the synchronous ones, from mapped files and with pread, with and
/// without rayon helpers.
#[test]
fn cooperative_assembly_equals_synchronous_assembly() {
    let t = TempDir::new("coop");
    let paths: Vec<String> = (0..3)
        .map(|r| {
            let bytes: Vec<u8> = (0..40_000u32).map(|k| (k * 13 + r * 7) as u8).collect();
            t.file(&format!("r{r}.sigmf-data"), &bytes)
        })
        .collect();
    let plain = vec![None; 3];
    for map_min_bytes in [0, u64::MAX] {
        let policy = crate::recordings::ReadPolicy {
            map_min_bytes,
            ..Default::default()
        };
        let ds = Dataset::open_with(&paths, &["ci16_le"; 3], &plain, 64, 48, policy);
        let ds = Arc::new(ds.unwrap());
        let mut reference = Stream::new(ds.clone(), 24, 5, 0, 1, 0).unwrap();
        let want = take(&mut reference, 150);
        for helpers in [None, Some(2)] {
            for depth in [1usize, 2, 3] {
                let mut s = Stream::new(ds.clone(), 24, 5, 0, 1, depth).unwrap();
                if let Some(n) = helpers {
                    s.set_helpers(n);
                }
                for (k, (ids, buf)) in take(&mut s, 150).iter().zip(&want).enumerate() {
                    assert_eq!((&ids.0, &ids.1), (&buf.0, &buf.1), "k={k} d={depth}");
                }
                let mut s = Stream::new(ds.clone(), 24, 5, 0, 1, depth).unwrap();
                let mem = use_ring(&mut s, depth + 1);
                if let Some(n) = helpers {
                    s.set_helpers(n);
                }
                for (k, (ids, buf)) in want.iter().enumerate() {
                    let slot = s.next_slot().unwrap();
                    let Buffer::I16(w) = buf else { panic!("dtype") };
                    assert_eq!(s.last_ids(), &ids[..], "ring k={k} d={depth}");
                    assert_eq!(read(&mem, slot), &w[..], "ring k={k} d={depth}");
                    s.release(slot).unwrap();
                }
                // A helper still queued after the stream is gone claims nothing: it writes
                // nothing.
                drop(s);
            }
        }
    }
}

/// The buffers of a caller's ring, shared with the stream that fills them.
type RingMem = Arc<Mutex<Vec<AlignedVec<u8>>>>;

/// Hands `s` a ring of `k` aligned batch buffers, which it keeps alive, and returns them: a test
/// reads a buffer (or scribbles on it) only while its slot is held.
fn use_ring(s: &mut Stream, k: usize) -> RingMem {
    let mut mem: Vec<AlignedVec<u8>> = (0..k)
        .map(|_| AlignedVec::zeroed(s.batch_bytes()).unwrap())
        .collect();
    let raw = mem
        .iter_mut()
        .map(|m| RawBuf::new(m.as_mut_ptr(), m.len()).unwrap())
        .collect();
    let mem = Arc::new(Mutex::new(mem));
    // SAFETY: the ring keeps `mem` alive (its keepalive holds a clone; the buffers' heap blocks
    // stay put inside it), so every buffer is valid for writes while the ring lives. Nothing
    // else reaches a buffer but the returned handle, and the tests use it only for a slot they
    // hold (between `next_slot` returning it and `release`), which the ring does not touch.
    unsafe { s.use_ring(raw, Box::new(mem.clone())) }.unwrap();
    mem
}

/// Buffer `slot` of a ring as i16 values.
fn read(mem: &RingMem, slot: usize) -> Vec<i16> {
    as_i16(&mem.lock().unwrap()[slot])
}

fn as_i16(bytes: &[u8]) -> Vec<i16> {
    bytes
        .chunks_exact(2)
        .map(|c| i16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

#[test]
fn caller_ring_batches_equal_next_batch_batches_while_slots_are_held() {
    let t = TempDir::new("ring");
    let ds = dataset(&t, &[50, 3, 71, 20], 8, 5);
    let mut reference = Stream::new(ds.clone(), 6, 42, 0, 1, 0).unwrap();
    let want = take(&mut reference, 24);
    for (depth, nbuf, hold) in [
        (0usize, 1usize, 1usize),
        (0, 3, 3),
        (1, 2, 1),
        (2, 3, 1),
        (2, 5, 3),
        (4, 5, 1),
    ] {
        let mut s = Stream::new(ds.clone(), 6, 42, 0, 1, depth).unwrap();
        if depth == 2 {
            s.next_batch().unwrap(); // the stream's own ring, replaced by the caller's
            s.seek(0).unwrap();
        }
        let mem = use_ring(&mut s, nbuf);
        assert!(s.next_batch().is_err(), "next_batch with a ring");
        let mut held = Vec::new();
        for (k, (ids, buf)) in want.iter().enumerate() {
            let slot = s.next_slot().unwrap();
            assert_eq!(s.last_ids(), &ids[..], "k={k} depth={depth}");
            let Buffer::I16(w) = buf else { panic!("dtype") };
            assert_eq!(read(&mem, slot), &w[..], "k={k} depth={depth}");
            held.push(slot);
            if held.len() == hold {
                // Release out of order, scribbling first: nothing leaks into later batches.
                for &h in held.iter().rev() {
                    mem.lock().unwrap()[h].fill(0x55);
                    s.release(h).unwrap();
                }
                held.clear();
            }
        }
    }
}

#[test]
fn ring_errors_instead_of_deadlock_and_seek_discards_prefetched() {
    let t = TempDir::new("ring-err");
    let ds = dataset(&t, &[64, 40], 4, 3);
    let mut reference = Stream::new(ds.clone(), 4, 9, 0, 1, 0).unwrap();
    let want = take(&mut reference, 10);
    for depth in [0usize, 2] {
        let mut s = Stream::new(ds.clone(), 4, 9, 0, 1, depth).unwrap();
        assert!(s.next_slot().is_err(), "no ring yet");
        assert!(s.release(0).is_err(), "no ring yet");
        // The stream's own ring (next_batch) is not the caller's.
        s.next_batch().unwrap();
        assert_eq!(s.ring_len(), 0);
        assert!(s.next_slot().is_err(), "no caller ring");
        assert!(s.release(0).is_err(), "no caller ring");
        s.seek(0).unwrap();
        let mem = use_ring(&mut s, depth + 1);
        assert_eq!(s.ring_len(), depth + 1);
        let mut held = Vec::new();
        for _ in 0..=depth {
            held.push(s.next_slot().unwrap());
        }
        let e = s.next_slot().unwrap_err().to_string();
        assert!(e.contains("all") && e.contains("held"), "{e}");
        assert_eq!(s.samples_consumed(), 4 * (depth as u64 + 1));
        assert!(s.release(held[0]).is_ok());
        assert!(s.release(held[0]).is_err(), "double release");
        assert!(s.release(depth + 1).is_err(), "out of range");
        // Seek drops prefetched batches; slots still held stay held.
        s.seek(4 * 7).unwrap();
        let slot = s.next_slot().unwrap();
        let Buffer::I16(w) = &want[7].1 else {
            panic!("dtype")
        };
        assert_eq!(
            (s.last_ids(), read(&mem, slot)),
            (&want[7].0[..], w.to_vec())
        );
        for &h in &held[1..] {
            s.release(h).unwrap();
        }
        s.release(slot).unwrap();
        let slot = s.next_slot().unwrap();
        assert_eq!(s.last_ids(), &want[8].0[..]);
        let Buffer::I16(w) = &want[8].1 else {
            panic!("dtype")
        };
        assert_eq!(read(&mem, slot), w.to_vec());
    }
}

#[test]
fn a_truncated_file_fails_a_ring_batch_and_recovers() {
    let t = TempDir::new("ring-trunc");
    let ds = dataset(&t, &[400], 4, 4);
    let path = ds.recordings()[0].path.clone();
    let full = std::fs::read(&path).unwrap();
    let mut reference = Stream::new(ds.clone(), 8, 3, 0, 1, 0).unwrap();
    let want = take(&mut reference, 12);
    for depth in [0usize, 1, 3] {
        std::fs::write(&path, &full).unwrap();
        let mut s = Stream::new(ds.clone(), 8, 3, 0, 1, depth).unwrap();
        let mem = use_ring(&mut s, depth + 2);
        for _ in 0..2 {
            let slot = s.next_slot().unwrap();
            s.release(slot).unwrap();
        }
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(0)
            .unwrap();
        let mut failed_at = None;
        for _ in 0..=depth + 1 {
            let pos = s.samples_consumed();
            match s.next_slot() {
                Ok(slot) => s.release(slot).unwrap(),
                Err(e) => {
                    assert!(matches!(e, Error::LengthChanged { found: 0, .. }), "{e}");
                    assert_eq!(s.samples_consumed(), pos);
                    failed_at = Some(pos);
                    break;
                }
            }
        }
        let pos = failed_at.unwrap_or_else(|| panic!("depth {depth}: no error"));
        std::fs::write(&path, &full).unwrap();
        let k = (pos / 8) as usize;
        let slot = s.next_slot().unwrap();
        let Buffer::I16(w) = &want[k].1 else {
            panic!("dtype")
        };
        assert_eq!(
            (s.last_ids(), read(&mem, slot)),
            (&want[k].0[..], w.to_vec())
        );
    }
}

/// ci8 samples (k, -k) (mod 256), k < n.
fn ci8_ramp(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|k| [k as u8, (k as u8).wrapping_neg()])
        .collect()
}

fn base_row(ds: &Dataset, id: u64) -> Vec<u8> {
    let mut out = vec![0u8; ds.row_bytes()];
    ds.fill_row(id, &mut out).unwrap();
    out
}

#[test]
fn a_stream_over_a_selection_yields_each_selected_window_once_per_epoch() {
    let t = TempDir::new("select-stream");
    let a = t.file("a", &ci8_ramp(400));
    let b = t.file("b", &ci8_ramp(250));
    let open = || open_plain(&[&a, &b], &["ci8", "ci8"], 8, 5).unwrap();
    let base = open();
    let table: Vec<u64> = (0..base.num_windows()).filter(|i| i % 3 != 1).collect();
    let n = table.len() as u64;
    let sel = Arc::new(open().select(table.clone()).unwrap());
    for depth in [0, 2] {
        // batch 7 does not divide n: batches straddle epochs.
        let mut s = Stream::new(sel.clone(), 7, 11, 0, 1, depth).unwrap();
        let mut ids = Vec::new();
        let mut rows = Vec::new();
        while (ids.len() as u64) < 3 * n {
            let mut buf = s.next_batch().unwrap();
            ids.extend_from_slice(s.last_ids());
            rows.extend_from_slice(buf.as_bytes_mut());
        }
        let rb = sel.row_bytes();
        for (k, &id) in ids.iter().enumerate() {
            assert!(id < n, "id {id}");
            // The row is the base window the selection names.
            assert_eq!(
                rows[k * rb..(k + 1) * rb],
                base_row(&base, table[id as usize])
            );
        }
        for e in 0..3 {
            let mut epoch = ids[(e * n) as usize..((e + 1) * n) as usize].to_vec();
            epoch.sort_unstable();
            assert_eq!(epoch, (0..n).collect::<Vec<_>>(), "epoch {e}");
        }
        // Seek lands on the same batch as iteration.
        let mut r = Stream::new(sel.clone(), 7, 11, 0, 1, depth).unwrap();
        r.seek(14).unwrap();
        r.next_batch().unwrap();
        assert_eq!(r.last_ids(), &ids[14..21]);
    }
}
