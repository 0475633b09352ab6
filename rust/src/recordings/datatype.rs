//! The SigMF sample formats a recording may have, and the dtypes batches are stored in.

/// On-disk complex sample format (SigMF `core:datatype`, complex): a pair of I and Q scalars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Ci8,
    Cu8,
    Ci16Le,
    Ci16Be,
    Cf32Le,
    Cf32Be,
    Cu16Le,
    Cu16Be,
    Ci32Le,
    Ci32Be,
    Cu32Le,
    Cu32Be,
    Cf64Le,
    Cf64Be,
}

/// Every kind, in the order of [`KIND_NAMES`] (and of the variants' declaration).
const KINDS: [Kind; 14] = [
    Kind::Ci8,
    Kind::Cu8,
    Kind::Ci16Le,
    Kind::Ci16Be,
    Kind::Cf32Le,
    Kind::Cf32Be,
    Kind::Cu16Le,
    Kind::Cu16Be,
    Kind::Ci32Le,
    Kind::Ci32Be,
    Kind::Cu32Le,
    Kind::Cu32Be,
    Kind::Cf64Le,
    Kind::Cf64Be,
];

/// The canonical SigMF names of every supported kind.
pub const KIND_NAMES: [&str; 14] = [
    "ci8", "cu8", "ci16_le", "ci16_be", "cf32_le", "cf32_be", "cu16_le", "cu16_be", "ci32_le",
    "ci32_be", "cu32_le", "cu32_be", "cf64_le", "cf64_be",
];

/// The scalar type of I and Q in a kind, whatever its byte order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Scalar {
    I8,
    U8,
    I16,
    U16,
    I32,
    U32,
    F32,
    F64,
}

impl Kind {
    pub fn parse(s: &str) -> Option<Kind> {
        KIND_NAMES.iter().position(|&n| n == s).map(|i| KINDS[i])
    }

    pub fn name(self) -> &'static str {
        // The variants are declared in the order of KINDS and KIND_NAMES.
        KIND_NAMES[self as usize]
    }

    /// The scalar type of I and Q.
    pub(crate) fn scalar(self) -> Scalar {
        match self {
            Kind::Ci8 => Scalar::I8,
            Kind::Cu8 => Scalar::U8,
            Kind::Ci16Le | Kind::Ci16Be => Scalar::I16,
            Kind::Cu16Le | Kind::Cu16Be => Scalar::U16,
            Kind::Ci32Le | Kind::Ci32Be => Scalar::I32,
            Kind::Cu32Le | Kind::Cu32Be => Scalar::U32,
            Kind::Cf32Le | Kind::Cf32Be => Scalar::F32,
            Kind::Cf64Le | Kind::Cf64Be => Scalar::F64,
        }
    }

    /// Whether the scalars are stored big-endian (the single-byte kinds are not).
    pub(crate) fn big_endian(self) -> bool {
        matches!(
            self,
            Kind::Ci16Be | Kind::Cu16Be | Kind::Ci32Be | Kind::Cu32Be | Kind::Cf32Be | Kind::Cf64Be
        )
    }

    /// Bytes of one scalar (I or Q) on disk.
    pub fn elem_bytes(self) -> usize {
        match self.scalar() {
            Scalar::I8 | Scalar::U8 => 1,
            Scalar::I16 | Scalar::U16 => 2,
            Scalar::I32 | Scalar::U32 | Scalar::F32 => 4,
            Scalar::F64 => 8,
        }
    }

    /// Bytes of one complex sample (I and Q) on disk.
    pub fn sample_bytes(self) -> usize {
        2 * self.elem_bytes()
    }

    /// The storage dtype this kind has when all recordings share its family: int8 for the 8-bit
    /// kinds, int16 for the 16-bit ones, float32 for the rest (32-bit integers and float64 are
    /// converted by value, rounding to the nearest float32).
    pub fn storage(self) -> Storage {
        match self.scalar() {
            Scalar::I8 | Scalar::U8 => Storage::Int8,
            Scalar::I16 | Scalar::U16 => Storage::Int16,
            Scalar::I32 | Scalar::U32 | Scalar::F32 | Scalar::F64 => Storage::Float32,
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
