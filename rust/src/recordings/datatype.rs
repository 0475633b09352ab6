//! The SigMF sample formats a recording may have, and the dtypes batches are stored in.

/// On-disk complex sample format (SigMF `core:datatype`, complex, one channel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ci8,
    Cu8,
    Ci16Le,
    Ci16Be,
    Cf32Le,
    Cf32Be,
}

pub const KIND_NAMES: [&str; 6] = ["ci8", "cu8", "ci16_le", "ci16_be", "cf32_le", "cf32_be"];

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        Some(match s {
            "ci8" => Kind::Ci8,
            "cu8" => Kind::Cu8,
            "ci16_le" => Kind::Ci16Le,
            "ci16_be" => Kind::Ci16Be,
            "cf32_le" => Kind::Cf32Le,
            "cf32_be" => Kind::Cf32Be,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ci8 => "ci8",
            Kind::Cu8 => "cu8",
            Kind::Ci16Le => "ci16_le",
            Kind::Ci16Be => "ci16_be",
            Kind::Cf32Le => "cf32_le",
            Kind::Cf32Be => "cf32_be",
        }
    }

    /// Bytes of one complex sample (I and Q).
    pub fn sample_bytes(self) -> usize {
        2 * self.storage().elem_bytes()
    }

    /// The storage dtype this kind has when all recordings share its family.
    pub fn storage(self) -> Storage {
        match self {
            Kind::Ci8 | Kind::Cu8 => Storage::Int8,
            Kind::Ci16Le | Kind::Ci16Be => Storage::Int16,
            Kind::Cf32Le | Kind::Cf32Be => Storage::Float32,
        }
    }
}

/// The dtype of assembled batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    Int8,
    Int16,
    Float32,
}

impl Storage {
    pub fn name(self) -> &'static str {
        match self {
            Storage::Int8 => "int8",
            Storage::Int16 => "int16",
            Storage::Float32 => "float32",
        }
    }

    pub fn elem_bytes(self) -> usize {
        match self {
            Storage::Int8 => 1,
            Storage::Int16 => 2,
            Storage::Float32 => 4,
        }
    }
}
