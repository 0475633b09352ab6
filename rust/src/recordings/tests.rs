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

fn policy(map_min_bytes: u64) -> ReadPolicy {
    ReadPolicy {
        map_min_bytes,
        ..ReadPolicy::default()
    }
}

/// Every row of `ds`, in id order.
fn all_rows(ds: &Dataset) -> Vec<u8> {
    let ids: Vec<u64> = (0..ds.num_windows()).collect();
    let mut out = vec![0u8; ids.len() * ds.row_bytes()];
    ds.gather(&ids, &mut out).unwrap();
    out
}

/// The layout of a plain single-channel file of `samples` samples of `sb` bytes cut at SigMF
/// capture starts `starts`, as the Python side cuts it: each capture runs to the next one (or
/// the end), and samples before a late first capture are a leading run of their own.
fn captures(starts: &[u64], samples: u64, sb: u64) -> Option<Layout> {
    let mut bounds = Vec::new();
    if starts.first().is_none_or(|&s| s > 0) {
        bounds.push(0);
    }
    bounds.extend_from_slice(starts);
    bounds.push(samples);
    let runs = bounds
        .windows(2)
        .map(|w| Run {
            start: w[0],
            samples: w[1] - w[0],
            byte: w[0] * sb,
        })
        .collect();
    Some(Layout {
        file_bytes: samples * sb,
        channels: 1,
        channel: 0,
        runs,
    })
}

/// One kind's test data: 5 complex samples (10 scalars) of raw bytes, with the values they
/// must decode to, as the kind's own storage dtype (native bytes) and as float32.
struct Case {
    kind: String,
    raw: Vec<u8>,
    own: Vec<u8>,
    float: Vec<f32>,
}

impl Case {
    fn new(kind: &str, raw: Vec<u8>, own: Vec<u8>, float: Vec<f32>) -> Case {
        assert_eq!(float.len(), 10, "{kind}");
        assert_eq!(
            raw.len(),
            10 * Kind::parse(kind).unwrap().elem_bytes(),
            "{kind}"
        );
        Case {
            kind: kind.to_owned(),
            raw,
            own,
            float,
        }
    }

    fn kind(&self) -> Kind {
        Kind::parse(&self.kind).unwrap()
    }
}

fn ne<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// Every kind, with extremes and values that round. The expected values are written out (not
/// computed the way the decoder computes them) where a conversion rounds.
fn cases() -> Vec<Case> {
    let mut out = Vec::new();
    let i8v: [i8; 10] = [-128, -1, 0, 1, 127, 5, -5, 100, -100, 64];
    out.push(Case::new(
        "ci8",
        ne(&i8v, i8::to_ne_bytes),
        ne(&i8v, i8::to_ne_bytes),
        i8v.map(f32::from).to_vec(),
    ));
    let u8v: [u8; 10] = [0, 127, 128, 255, 1, 200, 254, 129, 64, 192];
    let u8w: [i8; 10] = [-128, -1, 0, 127, -127, 72, 126, 1, -64, 64];
    out.push(Case::new(
        "cu8",
        u8v.to_vec(),
        ne(&u8w, i8::to_ne_bytes),
        u8w.map(f32::from).to_vec(),
    ));
    let i16v: [i16; 10] = [i16::MIN, -1, 0, 1, i16::MAX, 1234, -1234, 256, -256, 1];
    let u16v: [u16; 10] = [0, 32767, 32768, 65535, 1, 40000, 256, 65280, 12345, 54321];
    let u16w: [i16; 10] = [
        -32768, -1, 0, 32767, -32767, 7232, -32512, 32512, -20423, 21553,
    ];
    let i32v: [i32; 10] = [
        i32::MIN,
        i32::MAX,
        0,
        -1,
        16_777_217,
        16_777_219,
        -16_777_219,
        16_777_221,
        123_456_789,
        2_147_483_520,
    ];
    let i32w: [f32; 10] = [
        -2_147_483_648.0,
        2_147_483_648.0,
        0.0,
        -1.0,
        16_777_216.0, // a tie: to even
        16_777_220.0, // a tie: to even (up)
        -16_777_220.0,
        16_777_220.0, // a tie: to even (down)
        123_456_792.0,
        2_147_483_520.0,
    ];
    let h = 1u32 << 31;
    let u32v: [u32; 10] = [
        0,
        u32::MAX,
        h,
        h - 1,
        h + 16_777_217,
        1,
        h + 16_777_219,
        h - 16_777_219,
        3_000_000_000,
        123,
    ];
    let u32w: [f32; 10] = [
        -2_147_483_648.0,
        2_147_483_648.0, // 2^31 - 1 rounds up
        0.0,
        -1.0,
        16_777_216.0,
        -2_147_483_648.0, // -(2^31 - 1) rounds to -2^31
        16_777_220.0,
        -16_777_220.0,
        852_516_352.0,
        -2_147_483_520.0, // -2147483525
    ];
    let f32v: [f32; 10] = [
        f32::MIN,
        f32::MAX,
        -0.0,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.5,
        f32::MIN_POSITIVE,
        f32::from_bits(1), // the smallest subnormal
        -3.25,
    ];
    let max = f64::from(f32::MAX);
    let f64v: [f64; 10] = [
        1.0 + 2f64.powi(-24), // halfway between 1 and the next float32: to even (1)
        1.0 + 3.0 * 2f64.powi(-24), // halfway: to even (1 + 2^-22)
        1e300,
        -1e300,
        f64::NAN,
        max * (1.0 + 2f64.powi(-30)), // just above float32's largest: rounds down to it
        0.1,
        -1e-50,                       // underflows to -0
        max * (1.0 + 2f64.powi(-24)), // past halfway to the next power: infinity
        2f64.powi(-149),              // float32's smallest subnormal, exactly
    ];
    let f64w: [f32; 10] = [
        1.0,
        1.0 + 2f32.powi(-22),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MAX,
        0.1,
        -0.0,
        f32::INFINITY,
        f32::from_bits(1),
    ];
    for be in [false, true] {
        let o = if be { "be" } else { "le" };
        macro_rules! enc {
            ($v:expr) => {
                $v.iter()
                    .flat_map(|x| if be { x.to_be_bytes() } else { x.to_le_bytes() })
                    .collect::<Vec<u8>>()
            };
        }
        out.push(Case::new(
            &format!("ci16_{o}"),
            enc!(i16v),
            ne(&i16v, i16::to_ne_bytes),
            i16v.map(f32::from).to_vec(),
        ));
        out.push(Case::new(
            &format!("cu16_{o}"),
            enc!(u16v),
            ne(&u16w, i16::to_ne_bytes),
            u16w.map(f32::from).to_vec(),
        ));
        out.push(Case::new(
            &format!("ci32_{o}"),
            enc!(i32v),
            ne(&i32w, f32::to_ne_bytes),
            i32w.to_vec(),
        ));
        out.push(Case::new(
            &format!("cu32_{o}"),
            enc!(u32v),
            ne(&u32w, f32::to_ne_bytes),
            u32w.to_vec(),
        ));
        out.push(Case::new(
            &format!("cf32_{o}"),
            enc!(f32v),
            ne(&f32v, f32::to_ne_bytes),
            f32v.to_vec(),
        ));
        out.push(Case::new(
            &format!("cf64_{o}"),
            enc!(f64v),
            ne(&f64w, f32::to_ne_bytes),
            f64w.to_vec(),
        ));
    }
    let mut names: Vec<&str> = out.iter().map(|c| c.kind.as_str()).collect();
    names.sort_unstable();
    let mut all = KIND_NAMES.to_vec();
    all.sort_unstable();
    assert_eq!(names, all, "a case for every kind");
    out
}

/// float32 values equal bit for bit, or both NaN.
fn same_f32(got: &[f32], want: &[f32]) -> bool {
    got.len() == want.len()
        && got
            .iter()
            .zip(want)
            .all(|(g, w)| g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()))
}

/// Asserts a row of `storage` equals the case's values (bit for bit; NaN as NaN).
fn check_row(got: &[u8], storage: Storage, own: &[u8], float: &[f32], what: &str) {
    if storage == Storage::Float32 {
        assert!(
            same_f32(&f32s(got), float),
            "{what}: {:?} != {float:?}",
            f32s(got)
        );
        if own.len() == got.len() && !float.iter().any(|v| v.is_nan()) {
            assert_eq!(got, own, "{what}");
        }
    } else {
        assert_eq!(got, own, "{what}");
    }
}

/// Samples `[k..] ++ [..k]` of 5-sample data of `sample` bytes per sample.
fn rotated(data: &[u8], k: usize) -> Vec<u8> {
    let sample = data.len() / 5;
    (0..5)
        .flat_map(|j| data[(j + k) % 5 * sample..((j + k) % 5 + 1) * sample].to_vec())
        .collect()
}

#[test]
fn every_kind_decodes_by_value() {
    let t = TempDir::new("kinds");
    let cases = cases();
    assert_eq!(
        KIND_NAMES.map(|n| Kind::parse(n).unwrap().name()),
        KIND_NAMES
    );
    // Alone: the kind's own storage dtype, read straight into the row.
    for c in &cases {
        let p = t.file(&c.kind, &c.raw);
        let ds = open_plain(&[&p], &[&c.kind], 5, 1).unwrap();
        assert_eq!(ds.storage(), c.kind().storage(), "{}", c.kind);
        assert_eq!(ds.num_windows(), 1);
        check_row(&row(&ds, 0), ds.storage(), &c.own, &c.float, &c.kind);
    }
    // Mixed: every kind promoted by value to float32, recordings in the given order.
    let paths: Vec<String> = cases
        .iter()
        .map(|c| t.file(&format!("m.{}", c.kind), &c.raw))
        .collect();
    let kinds: Vec<&str> = cases.iter().map(|c| c.kind.as_str()).collect();
    let ds = open_plain(&paths, &kinds, 5, 1).unwrap();
    assert_eq!(ds.storage(), Storage::Float32);
    assert_eq!(ds.num_windows(), cases.len() as u64);
    for (id, c) in cases.iter().enumerate() {
        check_row(
            &row(&ds, id as u64),
            Storage::Float32,
            &[],
            &c.float,
            &c.kind,
        );
    }
    // One family keeps its dtype; two families widen to float32.
    let by = |names: &[&str]| {
        let idx: Vec<usize> = names
            .iter()
            .map(|n| kinds.iter().position(|k| k == n).unwrap())
            .collect();
        let p: Vec<&str> = idx.iter().map(|&i| paths[i].as_str()).collect();
        let ds = open_plain(&p, names, 5, 1).unwrap();
        for (id, &i) in idx.iter().enumerate() {
            let c = &cases[i];
            check_row(
                &row(&ds, id as u64),
                ds.storage(),
                &c.own,
                &c.float,
                &c.kind,
            );
        }
        ds.storage()
    };
    assert_eq!(by(&["ci8", "cu8"]), Storage::Int8);
    assert_eq!(
        by(&["ci16_le", "cu16_be", "ci16_be", "cu16_le"]),
        Storage::Int16
    );
    assert_eq!(
        by(&["ci32_le", "cu32_be", "cf32_be", "cf64_le", "cf64_be"]),
        Storage::Float32
    );
    assert_eq!(by(&["cu8", "ci16_le"]), Storage::Float32);
    assert_eq!(by(&["cu16_be", "cf32_le"]), Storage::Float32);
}

#[test]
fn one_channel_of_interleaved_frames_decodes_for_every_kind() {
    // channels 1, 2 and 3, a 3-byte header and a 5-byte trailer: channel c of sample j holds
    // the case's sample (j + c) % 5, so each channel reads the case rotated by c.
    let t = TempDir::new("channels");
    let cases = cases();
    for channels in 1..=3u64 {
        let mut paths = Vec::new();
        let mut layouts = Vec::new();
        for c in &cases {
            let sb = c.kind().sample_bytes();
            let mut raw = vec![0xA5u8; 3];
            for j in 0..5 {
                for ch in 0..channels as usize {
                    raw.extend_from_slice(&rotated(&c.raw, ch)[j * sb..(j + 1) * sb]);
                }
            }
            raw.extend_from_slice(&[0x5Au8; 5]);
            let p = t.file(&format!("{}.{channels}", c.kind), &raw);
            for channel in 0..channels {
                paths.push(p.clone());
                layouts.push(Some(Layout {
                    file_bytes: raw.len() as u64,
                    channels,
                    channel,
                    runs: vec![Run {
                        start: 0,
                        samples: 5,
                        byte: 3,
                    }],
                }));
            }
        }
        for map_min_bytes in [0, u64::MAX] {
            // Alone (each recording its own dataset, so its own storage) and mixed.
            let mut r = 0;
            for c in &cases {
                for channel in 0..channels as usize {
                    let ds = Dataset::open_with(
                        &[&paths[r]],
                        &[&c.kind],
                        &layouts[r..r + 1],
                        5,
                        5,
                        policy(map_min_bytes),
                    )
                    .unwrap();
                    assert_eq!(ds.recordings()[0].is_mapped(), map_min_bytes == 0);
                    assert_eq!(
                        ds.recordings()[0].frame_bytes(),
                        channels * c.kind().sample_bytes() as u64
                    );
                    let what = format!("{} channel {channel} of {channels}", c.kind);
                    let own = rotated(&c.own, channel);
                    let float = rotated(&ne(&c.float, f32::to_ne_bytes), channel);
                    check_row(&row(&ds, 0), ds.storage(), &own, &f32s(&float), &what);
                    r += 1;
                }
            }
            let kinds: Vec<&str> = cases
                .iter()
                .flat_map(|c| vec![c.kind.as_str(); channels as usize])
                .collect();
            let ds =
                Dataset::open_with(&paths, &kinds, &layouts, 5, 5, policy(map_min_bytes)).unwrap();
            assert_eq!(ds.storage(), Storage::Float32);
            let rows = all_rows(&ds);
            let mut r = 0;
            for c in &cases {
                for channel in 0..channels as usize {
                    let float = rotated(&ne(&c.float, f32::to_ne_bytes), channel);
                    let got = &rows[r * ds.row_bytes()..(r + 1) * ds.row_bytes()];
                    let what = format!("mixed {} channel {channel} of {channels}", c.kind);
                    check_row(got, Storage::Float32, &[], &f32s(&float), &what);
                    r += 1;
                }
            }
        }
    }
}

/// ci16_le sample of value v: (v, -v).
fn ci16(v: i16) -> [u8; 4] {
    let [a, b] = v.to_le_bytes();
    let [c, d] = (-v).to_le_bytes();
    [a, b, c, d]
}

#[test]
fn runs_read_from_their_byte_offsets() {
    // A 100-byte header, run A (10 samples), 7 bytes between, run B (8 samples), a run too
    // short for a window, an empty run at the very end, and 13 trailing bytes.
    let t = TempDir::new("runs");
    let mut raw = vec![0xEEu8; 100];
    raw.extend((1000..1010).flat_map(ci16));
    raw.extend([0xDD; 7]);
    raw.extend((2000..2008).flat_map(ci16));
    raw.extend((3000..3003).flat_map(ci16));
    raw.extend([0xCC; 13]);
    let p = t.file("a.sigmf-data", &raw);
    let q = t.file("q", &[0u8; 8 * 4]); // cf32: makes storage float32, so ci16 is widened
    let len = raw.len() as u64;
    let layout = Layout {
        file_bytes: len,
        channels: 1,
        channel: 0,
        runs: vec![
            Run {
                start: 0,
                samples: 10,
                byte: 100,
            },
            Run {
                start: 500,
                samples: 8,
                byte: 147,
            },
            Run {
                start: 900,
                samples: 3,
                byte: 179,
            },
            Run {
                start: 903,
                samples: 0,
                byte: len,
            },
        ],
    };
    // window 4, stride 3: A -> windows at 0, 3, 6; B -> 0, 3.
    let want = [
        (0u64, 1000i16),
        (3, 1003),
        (6, 1006),
        (500, 2000),
        (503, 2003),
    ];
    for (paths, kinds) in [
        (vec![&p], vec!["ci16_le"]),
        (vec![&p, &q], vec!["ci16_le", "cf32_le"]),
    ] {
        let layouts = vec![Some(layout.clone()); 1]
            .into_iter()
            .chain((1..paths.len()).map(|_| None))
            .collect::<Vec<_>>();
        for map_min_bytes in [0, u64::MAX] {
            let ds =
                Dataset::open_with(&paths, &kinds, &layouts, 4, 3, policy(map_min_bytes)).unwrap();
            let rec = &ds.recordings()[0];
            assert_eq!(rec.is_mapped(), map_min_bytes == 0);
            assert_eq!((rec.samples, rec.windows, rec.bytes()), (21, 5, len));
            assert_eq!((rec.channels, rec.channel, rec.frame_bytes()), (1, 0, 4));
            assert_eq!(
                ds.segments()[..4],
                [
                    Segment {
                        recording: 0,
                        start: 0,
                        samples: 10,
                        byte: 100,
                        windows: 3
                    },
                    Segment {
                        recording: 0,
                        start: 500,
                        samples: 8,
                        byte: 147,
                        windows: 2
                    },
                    Segment {
                        recording: 0,
                        start: 900,
                        samples: 3,
                        byte: 179,
                        windows: 0
                    },
                    Segment {
                        recording: 0,
                        start: 903,
                        samples: 0,
                        byte: len,
                        windows: 0
                    },
                ]
            );
            for (id, &(start, v)) in want.iter().enumerate() {
                assert_eq!(ds.locate(id as u64).unwrap(), (0, start), "id {id}");
                let exp: Vec<i16> = (v..v + 4).flat_map(|v| [v, -v]).collect();
                let got = row(&ds, id as u64);
                if ds.storage() == Storage::Int16 {
                    assert_eq!(i16s(&got), exp, "id {id}");
                } else {
                    let exp: Vec<f32> = exp.iter().map(|&v| f32::from(v)).collect();
                    assert_eq!(f32s(&got), exp, "id {id}");
                }
            }
        }
    }
}

#[test]
fn recordings_of_one_file_read_their_own_bytes() {
    // Two members of one archive file: ci8 at byte 50 and cf32_le at byte 91 (unaligned).
    let t = TempDir::new("members");
    let mut raw = vec![0x11u8; 50];
    raw.extend(ramp(20));
    raw.push(0x22);
    let floats: Vec<f32> = (0..20).map(|k| k as f32 * 0.25 - 2.0).collect();
    raw.extend(floats.iter().flat_map(|v| v.to_le_bytes()));
    raw.extend([0x33; 40]);
    let p = t.file("archive.sigmf", &raw);
    let len = raw.len() as u64;
    let member = |samples, byte| {
        Some(Layout {
            file_bytes: len,
            channels: 1,
            channel: 0,
            runs: vec![Run {
                start: 0,
                samples,
                byte,
            }],
        })
    };
    let layouts = [member(20, 50), member(10, 91)];
    for map_min_bytes in [0, u64::MAX] {
        let ds = Dataset::open_with(
            &[&p, &p],
            &["ci8", "cf32_le"],
            &layouts,
            10,
            10,
            policy(map_min_bytes),
        )
        .unwrap();
        assert_eq!(ds.num_windows(), 3);
        assert_eq!(
            ds.open_files().0,
            2,
            "each recording holds its own descriptor"
        );
        let want_ci8 = |k0: i32| -> Vec<f32> {
            (k0..k0 + 10)
                .flat_map(|k| [k as i8 as f32, (k as u8).wrapping_neg() as i8 as f32])
                .collect()
        };
        assert_eq!(f32s(&row(&ds, 0)), want_ci8(0));
        assert_eq!(f32s(&row(&ds, 1)), want_ci8(10));
        assert_eq!(f32s(&row(&ds, 2)), floats);
    }
}

#[test]
fn layout_errors_name_the_file_and_field() {
    let t = TempDir::new("layout-errors");
    let p = t.file("x.sigmf-data", &[0u8; 1000]);
    let run = |samples, byte| Run {
        start: 0,
        samples,
        byte,
    };
    let layout = |channels, channel, runs: Vec<Run>| Layout {
        file_bytes: 1000,
        channels,
        channel,
        runs,
    };
    let open = |l: Layout| Dataset::open(&[&p], &["ci16_le"], &[Some(l)], 4, 4);
    let err = |l: Layout| open(l).err().unwrap();
    let field_of = |e: &Error| match e {
        Error::Data { file, field, .. } => {
            assert_eq!(file, &p);
            field.clone()
        }
        other => panic!("not a data error: {other}"),
    };
    // Bad channels.
    let e = err(layout(0, 0, vec![run(10, 0)]));
    assert_eq!(field_of(&e), "channel");
    assert_eq!(
        e.to_string(),
        format!("{p}: channel 0 cannot be read: the layout has 0 channels (must be >= 1)")
    );
    let e = err(layout(3, 3, vec![run(10, 0)]));
    assert_eq!(
        e.to_string(),
        format!("{p}: channel 3 is out of range: the data has 3 channels (0 to 2)")
    );
    assert_eq!(field_of(&err(layout(u64::MAX, 0, vec![]))), "channel");
    // Runs outside the file: past the end, overflowing, starting past the end.
    let ok = layout(2, 1, vec![run(125, 0)]); // 125 frames of 8 bytes: exactly the file
    assert_eq!(open(ok).unwrap().num_windows(), 31);
    let e = err(layout(2, 1, vec![run(10, 0), run(125, 1)]));
    assert_eq!(
        e.to_string(),
        format!(
            "{p}: segment 1 bytes [1, 1001) (125 samples of 8-byte frames) are not inside the \
             file (1000 bytes)"
        )
    );
    assert_eq!(
        field_of(&err(layout(1, 0, vec![run(u64::MAX / 2, 0)]))),
        "segment 0"
    );
    assert_eq!(
        field_of(&err(layout(1, 0, vec![run(4, 0), run(0, 1001)]))),
        "segment 1"
    );
    assert_eq!(
        field_of(&err(layout(1, 0, vec![run(1, u64::MAX)]))),
        "segment 0"
    );
    let mut l = layout(1, 0, vec![run(4, 0)]);
    l.runs[0].start = u64::MAX - 2;
    assert_eq!(field_of(&err(l)), "segment 0");
    // Another length than the layout's: the file changed since the caller looked.
    let mut l = layout(1, 0, vec![run(4, 0)]);
    l.file_bytes = 1024;
    let e = err(l);
    assert!(
        matches!(&e, Error::LengthChanged { file, expected: 1024, found: 1000 } if *file == p),
        "{e}"
    );
    // A layout makes a file of partial samples readable (the plain rule is for plain files).
    let odd = t.file("odd", &[0u8; 1001]);
    assert!(open_plain(&[&odd], &["ci16_le"], 1, 1).is_err());
    let l = Layout {
        file_bytes: 1001,
        channels: 1,
        channel: 0,
        runs: vec![run(250, 1)],
    };
    let ds = Dataset::open(&[&odd], &["ci16_le"], &[Some(l)], 4, 4).unwrap();
    assert_eq!(ds.num_windows(), 62);
    // No runs at all: no windows.
    assert!(matches!(
        open(layout(1, 0, vec![])),
        Err(Error::NoWindows { .. })
    ));
}

#[test]
fn mapped_and_pread_give_the_same_bytes_for_runs_off_page_boundaries() {
    let t = TempDir::new("mapped-layouts");
    let n = 1 << 20;
    let raw: Vec<u8> = (0..n as u32).map(|k| (k * 31 + k / 251) as u8).collect();
    let p = t.file("a", &raw);
    let q = t.file("q", &[0u8; 8 * 10]); // cf32: makes storage float32 (ci16 widened)
    let two = |channels: u64, channel: u64| {
        let frame = 4 * channels;
        let a = 300_000 / frame;
        let b = (n as u64 - 401_003 - 600) / frame;
        Some(Layout {
            file_bytes: n as u64,
            channels,
            channel,
            runs: vec![
                Run {
                    start: 0,
                    samples: a,
                    byte: 1000,
                },
                Run {
                    start: a + 17,
                    samples: b,
                    byte: 401_003,
                },
            ],
        })
    };
    for (channels, channel) in [(1, 0), (2, 1), (3, 0), (3, 2)] {
        for (paths, kinds) in [
            (vec![&p], vec!["ci16_le"]),
            (vec![&p, &q], vec!["ci16_be", "cf32_le"]),
        ] {
            let mut layouts = vec![two(channels, channel)];
            layouts.resize(paths.len(), None);
            let open = |min| Dataset::open_with(&paths, &kinds, &layouts, 1000, 777, policy(min));
            let (mapped, plain) = (open(0).unwrap(), open(u64::MAX).unwrap());
            let rec = &mapped.recordings()[0];
            assert!(rec.is_mapped() && !plain.recordings()[0].is_mapped());
            // The span of the runs, from the page below the first.
            let end = 401_003 + mapped.segments()[1].samples * rec.frame_bytes();
            assert_eq!(rec.mapped_range(), Some((0, end)));
            let ids: Vec<u64> = (0..mapped.num_windows()).rev().collect();
            let mut a = vec![0u8; ids.len() * mapped.row_bytes()];
            let mut b = a.clone();
            mapped.gather(&ids, &mut a).unwrap();
            plain.gather(&ids, &mut b).unwrap();
            assert_eq!(a, b, "{channels} channels, channel {channel}, {kinds:?}");
        }
    }
}

#[test]
fn a_run_deep_inside_a_big_file_maps_only_its_pages() {
    // A sparse 64 MiB file with 1 MiB of data at 40 MiB + 12345.
    let t = TempDir::new("mapped-deep");
    let p = t.file("big", &[]);
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    let (len, at) = (64u64 << 20, (40u64 << 20) + 12345);
    f.set_len(len).unwrap();
    let data: Vec<u8> = (0..1u32 << 20).map(|k| (k * 7 + k / 509) as u8).collect();
    std::os::unix::fs::FileExt::write_all_at(&f, &data, at).unwrap();
    drop(f);
    let layouts = [Some(Layout {
        file_bytes: len,
        channels: 1,
        channel: 0,
        runs: vec![Run {
            start: 1 << 30,
            samples: (1 << 20) / 8,
            byte: at,
        }],
    })];
    let open = |min| Dataset::open_with(&[&p], &["cf32_be"], &layouts, 4096, 1000, policy(min));
    let (mapped, plain) = (open(0).unwrap(), open(u64::MAX).unwrap());
    let rec = &mapped.recordings()[0];
    assert!(rec.is_mapped());
    assert_eq!(rec.mapped_range(), Some((at & !4095, at + (1 << 20))));
    assert_eq!(mapped.locate(1).unwrap(), (0, (1 << 30) + 1000));
    assert_eq!(all_rows(&mapped), all_rows(&plain));
    let want: Vec<f32> = data[..4096 * 8]
        .chunks_exact(4)
        .map(|c| f32::from_be_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert!(same_f32(&f32s(&row(&mapped, 0)), &want));
    // map_min_bytes is about the runs' span, not the file: 1 MiB is below 2 MiB.
    assert!(!open(2 << 20).unwrap().recordings()[0].is_mapped());
    assert!(open(1 << 20).unwrap().recordings()[0].is_mapped());
}

#[test]
fn a_mapped_run_after_a_header_truncated_is_an_error_and_recovers() {
    // A 5000-byte header, a run of 6 ci8 windows of 1024 samples (bytes [5000, 17288)) and a
    // 3000-byte trailer; the mapping starts at the page at 4096.
    let t = TempDir::new("mapped-layout-truncate");
    let mut full = vec![0x77u8; 5000];
    full.extend(ramp(6 * 1024));
    full.extend([0x88u8; 3000]);
    let len = full.len() as u64;
    let p = t.file("a", &full);
    let layouts = [Some(Layout {
        file_bytes: len,
        channels: 1,
        channel: 0,
        runs: vec![Run {
            start: 0,
            samples: 6 * 1024,
            byte: 5000,
        }],
    })];
    let ids: Vec<u64> = (0..6).collect();
    // 17188: inside the run's last page (no fault, a zero tail); 9000: windows from the page
    // at 12288 on fault; 3000: below the mapping, every window faults.
    for cut in [17188u64, 9000, 3000] {
        std::fs::write(&p, &full).unwrap();
        let ds = Dataset::open_with(&[&p], &["ci8"], &layouts, 1024, 1024, policy(0)).unwrap();
        assert_eq!(ds.recordings()[0].mapped_range(), Some((4096, 17288)));
        let before = all_rows(&ds);
        assert_eq!(before, full[5000..17288]);
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
            format!(
                "{p}: data file changed length while being read (expected {len} bytes, found \
                 {cut})"
            )
        );
        assert!(
            !ds.recordings()[0].is_mapped(),
            "poisoned: pread from now on"
        );
        let mut one = vec![0u8; ds.row_bytes()];
        assert!(matches!(
            ds.fill_row(5, &mut one),
            Err(Error::LengthChanged { .. })
        ));
        if cut > 5000 + 2048 {
            ds.fill_row(0, &mut one).unwrap();
            assert_eq!(one, before[..ds.row_bytes()]);
        }
        // Restored in place: the same open dataset reads the right bytes again.
        std::fs::write(&p, &full).unwrap();
        ds.gather(&ids, &mut out).unwrap();
        assert_eq!(out, before);
    }
    // Only the trailer cut: every run byte is still there, read with pread from now on.
    std::fs::write(&p, &full).unwrap();
    let ds = Dataset::open_with(&[&p], &["ci8"], &layouts, 1024, 1024, policy(0)).unwrap();
    let before = all_rows(&ds);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(18288)
        .unwrap();
    assert_eq!(all_rows(&ds), before);
    assert!(!ds.recordings()[0].is_mapped());
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
fn window_counts() {
    assert_eq!(window_count(10, 4, 3), 3);
    assert_eq!(window_count(4, 4, 3), 1);
    assert_eq!(window_count(3, 4, 3), 0);
    assert_eq!(window_count(0, 4, 1), 0);
    assert_eq!(window_count(u64::MAX, 1, 1), u64::MAX);
    // The runs the helper cuts at capture starts (the Python side's rule).
    let runs = |starts: &[u64], n: u64| {
        captures(starts, n, 1)
            .unwrap()
            .runs
            .iter()
            .map(|r| (r.start, r.samples))
            .collect::<Vec<_>>()
    };
    assert_eq!(runs(&[], 10), [(0, 10)]);
    assert_eq!(runs(&[0, 4, 7], 10), [(0, 4), (4, 3), (7, 3)]);
    assert_eq!(runs(&[3, 5], 10), [(0, 3), (3, 2), (5, 5)]);
    assert_eq!(runs(&[0, 10], 10), [(0, 10), (10, 0)]);
}

#[test]
fn a_selection_reads_the_base_windows_it_names() {
    let t = TempDir::new("select");
    let a = t.file("a", &ramp(40));
    let b = t.file("b", &ramp(9));
    let layouts = [captures(&[0, 10, 13, 30], 40, 2), captures(&[0], 9, 2)];
    let open = || Dataset::open(&[&a, &b], &["ci8", "ci8"], &layouts, 4, 3).unwrap();
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
    // a: captures at 0, 10, 13, 30 -> runs [0,10) [10,13) [13,30) [30,40);
    // window 4, stride 3 -> 3 + 0 + 5 + 3 windows. b: one capture, 2 windows.
    let layouts = [captures(&[0, 10, 13, 30], 40, 2), captures(&[0], 9, 2)];
    let ds = Dataset::open(&[&a, &b], &["ci8", "ci8"], &layouts, 4, 3).unwrap();
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
    // One run covering the file is exactly the plain id space.
    let whole = [captures(&[], 40, 2), captures(&[0], 9, 2)];
    let flat = Dataset::open(&[&a, &b], &["ci8", "ci8"], &whole, 4, 3).unwrap();
    let plain = open_plain(&[&a, &b], &["ci8", "ci8"], 4, 3).unwrap();
    assert_eq!(flat.num_windows(), 13 + 2);
    for id in 0..flat.num_windows() {
        assert_eq!(flat.locate(id).unwrap(), plain.locate(id).unwrap());
        assert_eq!(
            flat.locate(id).unwrap(),
            (usize::from(id >= 13), (id % 13) * 3)
        );
    }
    // A leading run before a late first capture; runs too short for a window.
    let layouts = [captures(&[5, 7, 38], 40, 2)];
    let ds = Dataset::open(&[&a], &["ci8"], &layouts, 4, 4).unwrap();
    let got: Vec<u64> = (0..ds.num_windows())
        .map(|i| ds.locate(i).unwrap().1)
        .collect();
    assert_eq!(got, [0, 7, 11, 15, 19, 23, 27, 31]);
    // A run beyond the data names the data file and the run.
    let mut layout = captures(&[0, 30], 40, 2).unwrap();
    layout.runs[1].samples = 11;
    let e = Dataset::open(&[&a], &["ci8"], &[Some(layout)], 4, 4)
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        format!(
            "{a}: segment 1 bytes [60, 82) (11 samples of 2-byte frames) are not inside the file \
             (80 bytes)"
        )
    );
    let none: [Option<Layout>; 0] = [];
    assert!(matches!(
        Dataset::open(&[&a], &["ci8"], &none, 4, 4),
        Err(Error::Config { ref key, .. }) if key == "layouts"
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
        &[None],
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
        let plain = vec![None; paths.len()];
        let open = |min| {
            let policy = ReadPolicy {
                map_min_bytes: min,
                ..ReadPolicy::default()
            };
            Dataset::open_with(&paths, &kinds, &plain, 100, 37, policy).unwrap()
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
        &[None],
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
    let policy = ReadPolicy {
        map_min_bytes,
        max_open_files,
    };
    let plain = vec![None; paths.len()];
    Dataset::open_with(paths, &vec!["ci8"; paths.len()], &plain, 64, 64, policy).unwrap()
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
