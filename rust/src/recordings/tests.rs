use super::*;
use crate::error::Error;
use crate::testutil::{open_plain, TempDir};

fn row(ds: &Dataset, id: u64) -> Vec<u8> {
    let mut out = vec![0u8; ds.row_bytes()];
    ds.fill_row(id, &mut out).unwrap();
    out
}

fn i16s(b: &[u8]) -> Vec<i16> {
    b.chunks_exact(2)
        .map(|c| i16::from_ne_bytes([c[0], c[1]]))
        .collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_ne_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn every_kind_decodes() {
    let t = TempDir::new("kinds");
    // 3 complex samples each: values -2..=3 as I/Q pairs.
    let vals: [i32; 6] = [-2, -1, 0, 1, 2, 3];
    let ci8: Vec<u8> = vals.iter().map(|&v| v as i8 as u8).collect();
    let cu8: Vec<u8> = vals.iter().map(|&v| (v + 128) as u8).collect();
    let i16le: Vec<u8> = vals
        .iter()
        .flat_map(|&v| (v as i16 * 1000).to_le_bytes())
        .collect();
    let i16be: Vec<u8> = vals
        .iter()
        .flat_map(|&v| (v as i16 * 1000).to_be_bytes())
        .collect();
    let f32le: Vec<u8> = vals
        .iter()
        .flat_map(|&v| (v as f32 * 0.5).to_le_bytes())
        .collect();
    let f32be: Vec<u8> = vals
        .iter()
        .flat_map(|&v| (v as f32 * 0.5).to_be_bytes())
        .collect();

    let int8 = |p: &str, k: &str| {
        let ds = open_plain(&[p], &[k], 3, 3).unwrap();
        assert_eq!(ds.storage(), Storage::Int8);
        row(&ds, 0)
            .iter()
            .map(|&b| b as i8 as i32)
            .collect::<Vec<_>>()
    };
    assert_eq!(int8(&t.file("a.ci8", &ci8), "ci8"), vals);
    assert_eq!(int8(&t.file("a.cu8", &cu8), "cu8"), vals);

    let want16: Vec<i16> = vals.iter().map(|&v| v as i16 * 1000).collect();
    for (name, bytes, kind) in [("le.i16", &i16le, "ci16_le"), ("be.i16", &i16be, "ci16_be")] {
        let ds = open_plain(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
        assert_eq!(ds.storage(), Storage::Int16);
        assert_eq!(i16s(&row(&ds, 0)), want16, "{kind}");
    }
    let wantf: Vec<f32> = vals.iter().map(|&v| v as f32 * 0.5).collect();
    for (name, bytes, kind) in [("le.f32", &f32le, "cf32_le"), ("be.f32", &f32be, "cf32_be")] {
        let ds = open_plain(&[t.file(name, bytes)], &[kind], 3, 1).unwrap();
        assert_eq!(ds.storage(), Storage::Float32);
        assert_eq!(f32s(&row(&ds, 0)), wantf, "{kind}");
    }

    // Mixed: every kind promoted by value to f32, recordings in the given order.
    let files = [
        (t.file("m.ci8", &ci8), "ci8", 1.0f32),
        (t.file("m.cu8", &cu8), "cu8", 1.0),
        (t.file("m.le16", &i16le), "ci16_le", 1000.0),
        (t.file("m.be16", &i16be), "ci16_be", 1000.0),
        (t.file("m.lef", &f32le), "cf32_le", 0.5),
        (t.file("m.bef", &f32be), "cf32_be", 0.5),
    ];
    let paths: Vec<&str> = files.iter().map(|f| f.0.as_str()).collect();
    let kinds: Vec<&str> = files.iter().map(|f| f.1).collect();
    let ds = open_plain(&paths, &kinds, 3, 3).unwrap();
    assert_eq!(ds.storage(), Storage::Float32);
    assert_eq!(ds.num_windows(), 6);
    for (id, f) in files.iter().enumerate() {
        let want: Vec<f32> = vals.iter().map(|&v| v as f32 * f.2).collect();
        assert_eq!(f32s(&row(&ds, id as u64)), want, "{}", f.1);
    }
    // ci8 + cu8 stay int8.
    let ds = open_plain(&[paths[0], paths[1]], &["ci8", "cu8"], 3, 3).unwrap();
    assert_eq!(ds.storage(), Storage::Int8);
}

#[test]
fn errors_name_file_and_field() {
    let t = TempDir::new("errors");
    let p = t.file("x.sigmf-data", &[0u8; 1001]);
    let e = open_plain(&[&p], &["ci16_le"], 1, 1).err().unwrap();
    assert!(matches!(e, Error::Data { .. }));
    assert_eq!(
        e.to_string(),
        format!(
            "{p}: data length 1001 bytes is not a whole number of ci16_le samples (4 bytes each)"
        )
    );
    let e = open_plain(&[&p], &["ri16_le"], 1, 1).err().unwrap();
    assert!(
        e.to_string()
            .starts_with(&format!("{p}: datatype 'ri16_le' is not supported")),
        "{e}"
    );
    let missing = t.0.join("missing.sigmf-data");
    let missing = missing.to_str().unwrap();
    let e = open_plain(&[missing], &["ci8"], 1, 1).err().unwrap();
    assert!(
        matches!(e, Error::Data { .. }) && e.to_string().starts_with(missing),
        "{e}"
    );
    let dir = t.0.to_str().unwrap();
    assert!(matches!(
        open_plain(&[dir], &["ci8"], 1, 1),
        Err(Error::Data { .. })
    ));
    let ok = t.file("ok", &[0u8; 8]);
    assert!(
        matches!(open_plain(&[&ok], &["ci8"], 0, 1), Err(Error::Config { ref key, .. }) if key == "window")
    );
    assert!(
        matches!(open_plain(&[&ok], &["ci8"], 1, 0), Err(Error::Config { ref key, .. }) if key == "stride")
    );
    assert!(
        matches!(open_plain(&[&ok], &["ci8", "ci8"], 1, 1), Err(Error::Config { ref key, .. }) if key == "kinds")
    );
    // Shorter than the window everywhere: no windows at all.
    assert!(matches!(
        open_plain(&[&ok], &["ci8"], 5, 1),
        Err(Error::NoWindows { .. })
    ));
    let empty: [&str; 0] = [];
    assert!(matches!(
        open_plain(&empty, &empty, 5, 1),
        Err(Error::NoWindows { .. })
    ));
    // Out-of-range id.
    let ds = open_plain(&[&ok], &["ci8"], 1, 1).unwrap();
    assert!(matches!(ds.locate(4), Err(Error::Index { .. })));
    let mut out = vec![0u8; 4];
    assert!(matches!(
        ds.gather(&[0, 9], &mut out),
        Err(Error::Index { .. })
    ));
    assert_eq!(out, [0u8; 4]);
}

#[test]
fn window_location_with_stride_and_short_recordings() {
    let t = TempDir::new("locate");
    // ci8: sample k of recording r has I = 10*r + k (mod 128), Q = -I.
    let rec = |r: i32, samples: i32| -> Vec<u8> {
        (0..samples)
            .flat_map(|k| {
                let i = (10 * r + k) as i8;
                [i as u8, i.wrapping_neg() as u8]
            })
            .collect()
    };
    // window 4, stride 3: 10 samples -> 3 windows (starts 0,3,6); 3 samples -> 0; 4 -> 1; 0 -> 0.
    let paths = [
        t.file("r0", &rec(0, 10)),
        t.file("r1", &rec(1, 3)),
        t.file("r2", &rec(2, 4)),
        t.file("r3", &[]),
        t.file("r4", &rec(4, 12)),
    ];
    let ds = open_plain(&paths, &["ci8"; 5], 4, 3).unwrap();
    let counts: Vec<u64> = ds.recordings().iter().map(|r| r.windows).collect();
    assert_eq!(counts, [3, 0, 1, 0, 3]);
    let samples: Vec<u64> = ds.recordings().iter().map(|r| r.samples).collect();
    assert_eq!(samples, [10, 3, 4, 0, 12]);
    assert_eq!(ds.num_windows(), 7);
    let want = [(0, 0), (0, 3), (0, 6), (2, 0), (4, 0), (4, 3), (4, 6)];
    for (id, &(r, s)) in want.iter().enumerate() {
        assert_eq!(ds.locate(id as u64).unwrap(), (r, s), "id {id}");
        let got = row(&ds, id as u64);
        let exp: Vec<u8> = (0..4)
            .flat_map(|k| {
                let i = (10 * r as i32 + s as i32 + k) as i8;
                [i as u8, i.wrapping_neg() as u8]
            })
            .collect();
        assert_eq!(got, exp, "id {id}");
    }
    // gather = rows in id order.
    let ids = [6u64, 0, 3, 3];
    let mut out = vec![0u8; ids.len() * ds.row_bytes()];
    ds.gather(&ids, &mut out).unwrap();
    let exp: Vec<u8> = ids.iter().flat_map(|&i| row(&ds, i)).collect();
    assert_eq!(out, exp);
}

#[test]
fn capture_segment_arithmetic() {
    let seg = |starts: &[u64], n: u64| capture_segments("f", starts, n).unwrap();
    assert_eq!(seg(&[], 10), [(0, 10)]);
    assert_eq!(seg(&[0], 10), [(0, 10)]);
    assert_eq!(seg(&[0, 4, 7], 10), [(0, 4), (4, 3), (7, 3)]);
    // A first capture after 0: the samples before it are a leading segment of their own.
    assert_eq!(seg(&[3, 5], 10), [(0, 3), (3, 2), (5, 5)]);
    // A capture at the very end of the data is empty.
    assert_eq!(seg(&[0, 10], 10), [(0, 10), (10, 0)]);
    assert_eq!(seg(&[], 0), [(0, 0)]);
    for (starts, bad) in [
        (&[0u64, 0][..], 1),
        (&[0, 5, 3][..], 2),
        (&[0, 11][..], 1),
        (&[11][..], 0),
    ] {
        let e = capture_segments("/d/x.sigmf-data", starts, 10).unwrap_err();
        let want = format!("/d/x.sigmf-data: captures[{bad}].core:sample_start ");
        assert!(
            matches!(e, Error::Data { .. }) && e.to_string().starts_with(&want),
            "{starts:?}: {e}"
        );
    }
    assert_eq!(window_count(10, 4, 3), 3);
    assert_eq!(window_count(4, 4, 3), 1);
    assert_eq!(window_count(3, 4, 3), 0);
    assert_eq!(window_count(0, 4, 1), 0);
    assert_eq!(window_count(u64::MAX, 1, 1), u64::MAX);
}

#[test]
fn a_selection_reads_the_base_windows_it_names() {
    let t = TempDir::new("select");
    let a = t.file("a", &ramp(40));
    let b = t.file("b", &ramp(9));
    let caps: [&[u64]; 2] = [&[0, 10, 13, 30], &[0]];
    let open = || Dataset::open(&[&a, &b], &["ci8", "ci8"], &caps, 4, 3).unwrap();
    let base = open();
    assert_eq!(base.num_windows(), 13);
    assert_eq!(base.selection(), None);
    // Unsorted, with a repeat: order is kept, a repeat is one more window.
    let table = vec![12u64, 0, 7, 3, 7, 11];
    let sel = open().select(table.clone()).unwrap();
    assert_eq!(sel.num_windows(), table.len() as u64);
    assert_eq!(sel.base_windows(), 13);
    assert_eq!(sel.selection(), Some(&table[..]));
    // Recordings and segments keep their base counts.
    let counts = |d: &Dataset| d.recordings().iter().map(|r| r.windows).collect::<Vec<_>>();
    assert_eq!(counts(&sel), counts(&base));
    assert_eq!(sel.segments(), base.segments());
    for (i, &b) in table.iter().enumerate() {
        assert_eq!(
            sel.locate(i as u64).unwrap(),
            base.locate(b).unwrap(),
            "id {i}"
        );
        assert_eq!(row(&sel, i as u64), row(&base, b), "id {i}");
    }
    let ids: Vec<u64> = (0..table.len() as u64).rev().collect();
    let mut got = vec![0u8; ids.len() * sel.row_bytes()];
    sel.gather(&ids, &mut got).unwrap();
    let want: Vec<u8> = ids
        .iter()
        .flat_map(|&i| row(&base, table[i as usize]))
        .collect();
    assert_eq!(got, want);
    // Ids past the selection are out of range, though below the base count.
    assert!(matches!(
        sel.locate(6),
        Err(Error::Index {
            what: "window id",
            index: 6,
            len: 6
        })
    ));
    let mut out = vec![0u8; 2 * sel.row_bytes()];
    assert!(matches!(
        sel.gather(&[0, 6], &mut out),
        Err(Error::Index { .. })
    ));
    // A new selection replaces the old one, in base ids.
    let again = sel.select(vec![1]).unwrap();
    assert_eq!(again.num_windows(), 1);
    assert_eq!(row(&again, 0), row(&base, 1));
}

#[test]
fn empty_and_out_of_range_selections_are_errors() {
    let t = TempDir::new("select-bad");
    let a = t.file("a", &ramp(40));
    let open = || open_plain(&[&a], &["ci8"], 4, 4).unwrap(); // 10 windows
    let e = open().select(Vec::new()).err().unwrap();
    assert!(
        matches!(&e, Error::Config { key, .. } if key == "select"),
        "{e}"
    );
    assert!(e.to_string().contains("selects no window"), "{e}");
    let e = open().select(vec![0, 9, 10, 3]).err().unwrap();
    assert!(
        matches!(
            e,
            Error::Index {
                what: "selected window id",
                index: 10,
                len: 10
            }
        ),
        "{e}"
    );
    assert_eq!(
        e.to_string(),
        "selected window id 10 is out of range [0, 10)"
    );
    assert!(open().select(vec![u64::MAX]).is_err());
    assert_eq!(open().select(vec![9]).unwrap().num_windows(), 1);
}

/// ci8 recording whose sample k is (k, -k) (mod 256).
fn ramp(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|k| [k as u8, (k as u8).wrapping_neg()])
        .collect()
}

#[test]
fn windows_never_cross_a_capture_boundary() {
    let t = TempDir::new("captures");
    let a = t.file("a", &ramp(40));
    let b = t.file("b", &ramp(9));
    // a: captures at 0, 10, 13, 30 -> segments [0,10) [10,13) [13,30) [30,40);
    // window 4, stride 3 -> 3 + 0 + 5 + 3 windows. b: one capture, 2 windows.
    let caps: [&[u64]; 2] = [&[0, 10, 13, 30], &[0]];
    let ds = Dataset::open(&[&a, &b], &["ci8", "ci8"], &caps, 4, 3).unwrap();
    let starts_a = [0u64, 3, 6, 13, 16, 19, 22, 25, 30, 33, 36];
    let mut want: Vec<(usize, u64)> = starts_a.iter().map(|&s| (0, s)).collect();
    want.extend([(1, 0), (1, 3)]);
    assert_eq!(ds.num_windows(), want.len() as u64);
    assert_eq!(
        ds.recordings()
            .iter()
            .map(|r| r.windows)
            .collect::<Vec<_>>(),
        [11, 2]
    );
    assert_eq!(ds.recordings()[0].segments, 0..4);
    assert_eq!(ds.recordings()[1].segments, 4..5);
    let bounds = [0u64, 10, 13, 30, 40];
    for (id, &(r, s)) in want.iter().enumerate() {
        assert_eq!(ds.locate(id as u64).unwrap(), (r, s), "id {id}");
        if r == 0 {
            let seg = bounds.partition_point(|&b| b <= s) - 1;
            assert!(
                s + 4 <= bounds[seg + 1],
                "window {id} at {s} crosses a capture"
            );
        }
        let exp: Vec<u8> = (s..s + 4)
            .flat_map(|k| [k as u8, (k as u8).wrapping_neg()])
            .collect();
        assert_eq!(row(&ds, id as u64), exp, "id {id}");
    }
    // One capture at 0 (or none) is exactly the unsegmented id space.
    let none: [&[u64]; 2] = [&[], &[]];
    let flat = Dataset::open(&[&a, &b], &["ci8", "ci8"], &none, 4, 3).unwrap();
    let plain = open_plain(&[&a, &b], &["ci8", "ci8"], 4, 3).unwrap();
    assert_eq!(flat.num_windows(), 13 + 2);
    for id in 0..flat.num_windows() {
        assert_eq!(flat.locate(id).unwrap(), plain.locate(id).unwrap());
        assert_eq!(
            flat.locate(id).unwrap(),
            (usize::from(id >= 13), (id % 13) * 3)
        );
    }
    // A leading segment before a late first capture; captures too short for a window.
    let caps: [&[u64]; 1] = [&[5, 7, 38]];
    let ds = Dataset::open(&[&a], &["ci8"], &caps, 4, 4).unwrap();
    let got: Vec<u64> = (0..ds.num_windows())
        .map(|i| ds.locate(i).unwrap().1)
        .collect();
    assert_eq!(got, [0, 7, 11, 15, 19, 23, 27, 31]);
    // Bad capture starts name the data file and the capture.
    let caps: [&[u64]; 1] = [&[0, 41]];
    let e = Dataset::open(&[&a], &["ci8"], &caps, 4, 4).err().unwrap();
    assert!(
        e.to_string()
            .starts_with(&format!("{a}: captures[1].core:sample_start 41 is beyond")),
        "{e}"
    );
    let caps: [&[u64]; 0] = [];
    assert!(matches!(
        Dataset::open(&[&a], &["ci8"], &caps, 4, 4),
        Err(Error::Config { ref key, .. }) if key == "captures"
    ));
}

#[test]
fn a_file_truncated_while_open_is_an_error_and_recovers() {
    let t = TempDir::new("truncate");
    let full = ramp(100);
    let p = t.file("a", &full);
    let q = t.file("q", &[0u8; 8 * 10]); // cf32: makes storage float32, so ci8 is widened
    for (paths, kinds) in [
        (vec![&p], vec!["ci8"]),
        (vec![&p, &q], vec!["ci8", "cf32_le"]),
    ] {
        std::fs::write(&p, &full).unwrap();
        let ds = open_plain(&paths, &kinds, 10, 10).unwrap();
        let before: Vec<Vec<u8>> = (0..10).map(|i| row(&ds, i)).collect();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(95 * 2)
            .unwrap();
        // Windows inside what is left still read; the last one comes up short.
        assert_eq!(row(&ds, 8), before[8]);
        let mut out = vec![0u8; ds.row_bytes()];
        let e = ds.fill_row(9, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{p}: data file changed length while being read (expected 200 bytes, found 190)"
            )
        );
        let mut all = vec![0u8; 10 * ds.row_bytes()];
        let ids: Vec<u64> = (0..10).collect();
        assert!(matches!(
            ds.gather(&ids, &mut all),
            Err(Error::LengthChanged { .. })
        ));
        // Restored: the same open dataset reads again.
        std::fs::write(&p, &full).unwrap();
        ds.gather(&ids, &mut all).unwrap();
        assert_eq!(all, before.concat());
    }
}

fn open_mapped(p: &str, kind: &str, window: u64) -> Dataset {
    let ds = Dataset::open_with(
        &[p],
        &[kind],
        &[[0u64]],
        window,
        window,
        ReadPolicy {
            map_min_bytes: 0,
            ..ReadPolicy::default()
        },
    )
    .unwrap();
    assert!(ds.recordings()[0].is_mapped());
    ds
}

#[test]
fn mapped_and_pread_readers_give_the_same_bytes() {
    let t = TempDir::new("mapped-same");
    let full = ramp(3 * 4096 + 17);
    let p = t.file("a", &full);
    let q = t.file("q", &[0u8; 8 * 10]); // cf32: ci8 widened to float32 from the mapping
    for (paths, kinds) in [
        (vec![&p], vec!["ci8"]),
        (vec![&p, &q], vec!["ci8", "cf32_le"]),
    ] {
        let caps = vec![[0u64]; paths.len()];
        let open = |min| {
            let policy = ReadPolicy {
                map_min_bytes: min,
                ..ReadPolicy::default()
            };
            Dataset::open_with(&paths, &kinds, &caps, 100, 37, policy).unwrap()
        };
        let (mapped, plain) = (open(0), open(u64::MAX));
        assert!(mapped.recordings()[0].is_mapped() && !plain.recordings()[0].is_mapped());
        // q has no window of 100 samples: nothing reads it, so it is never mapped.
        assert!(paths.len() == 1 || !mapped.recordings()[1].is_mapped());
        let ids: Vec<u64> = (0..mapped.num_windows()).rev().collect();
        let mut a = vec![0u8; ids.len() * mapped.row_bytes()];
        let mut b = a.clone();
        mapped.gather(&ids, &mut a).unwrap();
        plain.gather(&ids, &mut b).unwrap();
        assert_eq!(a, b);
    }
}

#[test]
fn a_mapped_file_truncated_inside_or_past_a_page_is_an_error_and_recovers() {
    let t = TempDir::new("mapped-truncate");
    let full = ramp(6 * 1024); // 12288 bytes = 3 pages; ci8 windows of 1024 = 2048 bytes
    let p = t.file("a", &full);
    // 12188: the last window ends inside the last page (no fault, a zero tail);
    // 5000: window 2 ends in the page holding the new end, windows 3-5 fault.
    for cut in [12188u64, 5000] {
        std::fs::write(&p, &full).unwrap();
        let ds = open_mapped(&p, "ci8", 1024);
        let ids: Vec<u64> = (0..6).collect();
        let mut before = vec![0u8; 6 * ds.row_bytes()];
        ds.gather(&ids, &mut before).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(cut)
            .unwrap();
        let mut out = vec![0u8; 6 * ds.row_bytes()];
        let e = ds.gather(&ids, &mut out).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("{p}: data file changed length while being read (expected 12288 bytes, found {cut})")
        );
        let mut one = vec![0u8; ds.row_bytes()];
        assert!(matches!(
            ds.fill_row(5, &mut one),
            Err(Error::LengthChanged { .. })
        ));
        assert!(
            !ds.recordings()[0].is_mapped(),
            "poisoned: pread from now on"
        );
        // Windows inside what is left still read (now with pread).
        ds.fill_row(0, &mut one).unwrap();
        assert_eq!(one, before[..ds.row_bytes()]);
        // Restored in place: the same open dataset reads the right bytes again.
        std::fs::write(&p, &full).unwrap();
        ds.gather(&ids, &mut out).unwrap();
        assert_eq!(out, before);
    }
}

#[test]
fn a_mapped_file_cut_and_regrown_reads_as_pread_reads_it() {
    let t = TempDir::new("mapped-regrow");
    let full = ramp(6 * 1024);
    let p = t.file("a", &full);
    let ds = open_mapped(&p, "ci8", 1024);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(12188).unwrap(); // inside the last page: a later copy would not fault
    f.set_len(12288).unwrap(); // regrown: the same length, zeros past the cut
    let ids: Vec<u64> = (0..6).collect();
    let mut got = vec![0u8; 6 * ds.row_bytes()];
    ds.gather(&ids, &mut got).unwrap();
    let plain = Dataset::open_with(
        &[&p],
        &["ci8"],
        &[[0u64]],
        1024,
        1024,
        ReadPolicy {
            map_min_bytes: u64::MAX,
            ..ReadPolicy::default()
        },
    )
    .unwrap();
    let mut want = vec![0u8; 6 * plain.row_bytes()];
    plain.gather(&ids, &mut want).unwrap();
    assert_eq!(got, want);
    assert!(
        !ds.recordings()[0].is_mapped(),
        "its status changed: pread from now on"
    );
}

/// `n` ci8 recordings `r0, r1, ...` of 256 samples (4 windows of 64).
fn ramp_files(t: &TempDir, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| t.file(&format!("r{i}"), &ramp(256)))
        .collect()
}

fn open_pooled(paths: &[&str], map_min_bytes: u64, max_open_files: usize) -> Dataset {
    let caps = vec![[0u64]; paths.len()];
    let policy = ReadPolicy {
        map_min_bytes,
        max_open_files,
    };
    Dataset::open_with(paths, &vec!["ci8"; paths.len()], &caps, 64, 64, policy).unwrap()
}

#[test]
fn a_pool_smaller_than_the_dataset_reads_every_row_as_the_open_one_does() {
    let t = TempDir::new("pool-same");
    let data: Vec<Vec<u8>> = (0..9).map(|i| ramp(128 * 10 + i * 128)).collect();
    let paths: Vec<String> = (0..9).map(|i| t.file(&format!("r{i}"), &data[i])).collect();
    let paths: Vec<&str> = paths.iter().map(|p| p.as_str()).collect();
    let all = open_pooled(&paths, u64::MAX, usize::MAX);
    assert_eq!(all.open_files().0, 9);
    // pread only, mapped only, and r4..r8 mapped (3584 bytes or more), 2 descriptors.
    for min in [u64::MAX, 0, 3584] {
        let pooled = open_pooled(&paths, min, 2);
        // Kept at open while there was room, mapped files not (their rows need none).
        let unmapped = pooled
            .recordings()
            .iter()
            .filter(|r| !r.is_mapped())
            .count();
        assert_eq!(pooled.open_files(), (unmapped.min(2), 2));
        let n = all.num_windows();
        // Shuffled, several times round: every row evicts and reopens.
        let ids: Vec<u64> = (0..3 * n).map(|k| (k * 7 + 3) % n).collect();
        let mut a = vec![0u8; ids.len() * all.row_bytes()];
        let mut b = a.clone();
        all.gather(&ids, &mut a).unwrap();
        pooled.gather(&ids, &mut b).unwrap();
        assert_eq!(a, b, "map_min_bytes {min}");
        assert!(pooled.open_files().0 <= 2);
    }
}

#[test]
fn a_file_replaced_or_deleted_while_out_of_the_pool_is_an_error_naming_it() {
    let t = TempDir::new("pool-replaced");
    let files = ramp_files(&t, 3);
    let paths: Vec<&str> = files.iter().map(|p| p.as_str()).collect();
    for min in [u64::MAX, 0] {
        let ds = open_pooled(&paths, min, 1);
        let mut row = vec![0u8; ds.row_bytes()];
        ds.fill_row(0, &mut row).unwrap(); // r0 holds the one descriptor (it was kept)
                                           // r1 is replaced the way rsync and most writers replace a file: a new file renamed
                                           // over it (the same bytes, another inode).
        let tmp = t.file("r1.tmp", &ramp(256));
        std::fs::rename(&tmp, paths[1]).unwrap();
        let e = ds.fill_row(4, &mut row).err().unwrap();
        assert!(
            matches!(&e, Error::Replaced { file } if file == paths[1]),
            "map_min_bytes {min}: {e}"
        );
        // r2 deleted: opening it again fails, naming it.
        std::fs::remove_file(paths[2]).unwrap();
        let e = ds.fill_row(8, &mut row).err().unwrap();
        assert!(e.to_string().starts_with(paths[2]), "{e}");
        assert!(e.to_string().contains("cannot be inspected"), "{e}");
        // ... and written again: a new file, though ext4 may give it the freed inode number
        // (a pread file's evicted descriptor no longer holds it): its birth time tells.
        std::fs::write(paths[2], ramp(256)).unwrap();
        let e = ds.fill_row(8, &mut row).err().unwrap();
        assert!(
            matches!(&e, Error::Replaced { file } if file == paths[2]),
            "map_min_bytes {min}: {e}"
        );
        // The file that was never replaced still reads.
        ds.fill_row(1, &mut row).unwrap();
        std::fs::write(paths[2], ramp(256)).unwrap();
        std::fs::write(paths[1], ramp(256)).unwrap();
    }
}

#[test]
fn a_file_truncated_while_out_of_the_pool_is_length_changed() {
    let t = TempDir::new("pool-truncated");
    let files = ramp_files(&t, 2);
    let paths: Vec<&str> = files.iter().map(|p| p.as_str()).collect();
    let ds = open_pooled(&paths, u64::MAX, 1);
    let mut row = vec![0u8; ds.row_bytes()];
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(paths[1])
        .unwrap();
    f.set_len(100).unwrap();
    let e = ds.fill_row(7, &mut row).err().unwrap();
    assert!(
        matches!(&e, Error::LengthChanged { file, expected: 512, found: 100 } if file == paths[1]),
        "{e}"
    );
    f.set_len(0).unwrap();
    drop(f);
    std::fs::write(paths[1], ramp(256)).unwrap(); // restored in place: the same inode
    ds.fill_row(7, &mut row).unwrap();
}
