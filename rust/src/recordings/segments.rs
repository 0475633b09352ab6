//! Byte layouts of recordings, the segments they are cut into and the windows that fit in them
//! (the module docs of `recordings`).

/// One run of samples of a recording that is windowed on its own (one SigMF capture segment):
/// `samples` sample frames, consecutive in the file from byte `byte`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// The run's first sample index (its SigMF sample index): only what
    /// [`Dataset::locate`](super::Dataset::locate) reports, never used to find bytes.
    pub start: u64,
    pub samples: u64,
    /// Byte offset in the file of the run's first sample frame.
    pub byte: u64,
}

/// Where a recording's samples are in its file, as the caller (which owns the SigMF semantics)
/// worked it out: the file's length, its interleaved channels and the one read, and its runs.
/// A frame is `channels * kind.sample_bytes()` bytes; sample `j` of a run is the frame at
/// `run.byte + j * frame`, and the channel's I/Q pair is `channel * kind.sample_bytes()` bytes
/// into it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The file's length when the caller looked: the file must have it at open.
    pub file_bytes: u64,
    /// Interleaved channels per frame (>= 1).
    pub channels: u64,
    /// The channel read (< `channels`).
    pub channel: u64,
    pub runs: Vec<Run>,
}

/// A run of one recording as the dataset windows it: the run, where its bytes are, and its
/// window count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index of the recording in [`Dataset::recordings`](super::Dataset::recordings).
    pub recording: usize,
    /// The run's first sample index ([`Run::start`]).
    pub start: u64,
    pub samples: u64,
    /// Byte offset in the file of the segment's first sample frame ([`Run::byte`]).
    pub byte: u64,
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
