//! Capture segments and the windows that fit in them (the module docs of `recordings`).

use crate::error::{Error, Result};

/// A run of samples of one recording that is windowed on its own (one SigMF capture).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index of the recording in [`Dataset::recordings`].
    pub recording: usize,
    /// First sample, counted from the start of the data file.
    pub start: u64,
    pub samples: u64,
    pub windows: u64,
}

/// Windows of `window` samples at multiples of `stride` that fit in `samples` samples.
pub fn window_count(samples: u64, window: u64, stride: u64) -> u64 {
    if samples >= window && window > 0 && stride > 0 {
        (samples - window) / stride + 1
    } else {
        0
    }
}

/// The segments `(start, samples)` of a recording of `samples` samples whose captures start at
/// `starts` (each capture's `core:sample_start`, in metadata order). No captures is one segment
/// covering the file; a first capture after 0 adds a leading segment `[0, starts[0])`. A capture
/// starting exactly at the end of the data gives an empty segment. Errors name the file and
/// `captures[i].core:sample_start`.
pub fn capture_segments(path: &str, starts: &[u64], samples: u64) -> Result<Vec<(u64, u64)>> {
    let field = |i: usize| format!("captures[{i}].core:sample_start");
    let mut out = Vec::with_capacity(starts.len() + 1);
    match starts.first() {
        None => return Ok(vec![(0, samples)]),
        Some(&first) if first > 0 => out.push((0, first.min(samples))),
        Some(_) => {}
    }
    for (i, &s) in starts.iter().enumerate() {
        if i > 0 && s <= starts[i - 1] {
            return Err(Error::data(
                path,
                &field(i),
                format!(
                    "{s} is not after the previous capture's {} (captures must start at strictly increasing samples)",
                    starts[i - 1]
                ),
            ));
        }
        if s > samples {
            return Err(Error::data(
                path,
                &field(i),
                format!("{s} is beyond the end of the data ({samples} samples)"),
            ));
        }
        let end = starts.get(i + 1).map_or(samples, |&e| e.min(samples));
        // end < s only when the next start is out of order or out of range: reported next round.
        out.push((s, end.saturating_sub(s)));
    }
    Ok(out)
}
