//! GGUF value types and ggml tensor types (ids, names, block sizes).

/// The type tag of a GGUF metadata value (`enum gguf_type` in ggml's `gguf.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    /// `uint8_t` (tag 0).
    U8,
    /// `int8_t` (tag 1).
    I8,
    /// `uint16_t` (tag 2).
    U16,
    /// `int16_t` (tag 3).
    I16,
    /// `uint32_t` (tag 4).
    U32,
    /// `int32_t` (tag 5).
    I32,
    /// `float` (tag 6).
    F32,
    /// `bool`, one byte, 0 or 1 (tag 7).
    Bool,
    /// UTF-8 string: `uint64_t` byte length, then the bytes, no terminator (tag 8).
    String,
    /// Array: `uint32_t` element type, `uint64_t` count, then the elements (tag 9).
    Array,
    /// `uint64_t` (tag 10).
    U64,
    /// `int64_t` (tag 11).
    I64,
    /// `double` (tag 12).
    F64,
}

impl GgufValueType {
    /// The type for a tag read from the file.
    pub fn from_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::U8,
            1 => Self::I8,
            2 => Self::U16,
            3 => Self::I16,
            4 => Self::U32,
            5 => Self::I32,
            6 => Self::F32,
            7 => Self::Bool,
            8 => Self::String,
            9 => Self::Array,
            10 => Self::U64,
            11 => Self::I64,
            12 => Self::F64,
            _ => return None,
        })
    }

    /// Fewest bytes one value of this type takes in the file (used to reject absurd counts
    /// before allocating): the fixed size for scalars, 8 for a string (its length), 12 for an
    /// array (element type + count).
    pub fn min_size(self) -> u64 {
        match self {
            Self::U8 | Self::I8 | Self::Bool => 1,
            Self::U16 | Self::I16 => 2,
            Self::U32 | Self::I32 | Self::F32 => 4,
            Self::U64 | Self::I64 | Self::F64 | Self::String => 8,
            Self::Array => 12,
        }
    }
}

/// A ggml tensor type (`enum ggml_type` in `ggml.h`), with the block geometry from
/// `ggml-common.h`. Every type a GGUF file may hold is listed so that tensor sizes can be
/// checked; only [`GgmlType::is_supported`] ones are dequantised.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // the variants are ggml's type names
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    IQ2XXS,
    IQ2XS,
    IQ3XXS,
    IQ1S,
    IQ4NL,
    IQ3S,
    IQ2S,
    IQ4XS,
    I8,
    I16,
    I32,
    I64,
    F64,
    IQ1M,
    BF16,
    TQ1_0,
    TQ2_0,
    MXFP4,
    NVFP4,
    Q1_0,
}

/// `(ggml id, type, name, elements per block, bytes per block)`; ids and sizes as in
/// `ggml.h` / `ggml-common.h` (cross-checked with `gguf.constants.GGML_QUANT_SIZES` of the
/// `gguf` Python package 0.19; `Q8_1` is 36 bytes as in current `ggml-common.h`).
const TABLE: &[(u32, GgmlType, &str, u64, u64)] = &[
    (0, GgmlType::F32, "F32", 1, 4),
    (1, GgmlType::F16, "F16", 1, 2),
    (2, GgmlType::Q4_0, "Q4_0", 32, 18),
    (3, GgmlType::Q4_1, "Q4_1", 32, 20),
    (6, GgmlType::Q5_0, "Q5_0", 32, 22),
    (7, GgmlType::Q5_1, "Q5_1", 32, 24),
    (8, GgmlType::Q8_0, "Q8_0", 32, 34),
    (9, GgmlType::Q8_1, "Q8_1", 32, 36),
    (10, GgmlType::Q2K, "Q2_K", 256, 84),
    (11, GgmlType::Q3K, "Q3_K", 256, 110),
    (12, GgmlType::Q4K, "Q4_K", 256, 144),
    (13, GgmlType::Q5K, "Q5_K", 256, 176),
    (14, GgmlType::Q6K, "Q6_K", 256, 210),
    (15, GgmlType::Q8K, "Q8_K", 256, 292),
    (16, GgmlType::IQ2XXS, "IQ2_XXS", 256, 66),
    (17, GgmlType::IQ2XS, "IQ2_XS", 256, 74),
    (18, GgmlType::IQ3XXS, "IQ3_XXS", 256, 98),
    (19, GgmlType::IQ1S, "IQ1_S", 256, 50),
    (20, GgmlType::IQ4NL, "IQ4_NL", 32, 18),
    (21, GgmlType::IQ3S, "IQ3_S", 256, 110),
    (22, GgmlType::IQ2S, "IQ2_S", 256, 82),
    (23, GgmlType::IQ4XS, "IQ4_XS", 256, 136),
    (24, GgmlType::I8, "I8", 1, 1),
    (25, GgmlType::I16, "I16", 1, 2),
    (26, GgmlType::I32, "I32", 1, 4),
    (27, GgmlType::I64, "I64", 1, 8),
    (28, GgmlType::F64, "F64", 1, 8),
    (29, GgmlType::IQ1M, "IQ1_M", 256, 56),
    (30, GgmlType::BF16, "BF16", 1, 2),
    (34, GgmlType::TQ1_0, "TQ1_0", 256, 54),
    (35, GgmlType::TQ2_0, "TQ2_0", 256, 66),
    (39, GgmlType::MXFP4, "MXFP4", 32, 17),
    (40, GgmlType::NVFP4, "NVFP4", 64, 36),
    (41, GgmlType::Q1_0, "Q1_0", 128, 18),
];

/// The types [`super::dequantize`] reads, for error messages (the names of the
/// [`GgmlType::is_supported`] types).
pub const SUPPORTED_TYPES: &str =
    "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS";

impl GgmlType {
    fn row(self) -> &'static (u32, GgmlType, &'static str, u64, u64) {
        // Every variant has exactly one row; the fallback is never taken.
        TABLE.iter().find(|r| r.1 == self).unwrap_or(&TABLE[0])
    }

    /// The type for a ggml id read from the file; `None` for ids ggml does not define (or
    /// has retired, such as 4 and 5).
    pub fn from_id(id: u32) -> Option<Self> {
        TABLE.iter().find(|r| r.0 == id).map(|r| r.1)
    }

    /// The ggml id.
    pub fn id(self) -> u32 {
        self.row().0
    }

    /// ggml's name (`"Q4_K"`, `"BF16"`, ...).
    pub fn name(self) -> &'static str {
        self.row().2
    }

    /// Elements per block (1 for plain types, 32 for `Q*_0`/`Q*_1`, 256 for k-quants).
    pub fn block_size(self) -> u64 {
        self.row().3
    }

    /// Bytes per block.
    pub fn type_size(self) -> u64 {
        self.row().4
    }

    /// Whether [`super::dequantize`] reads this type.
    pub fn is_supported(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q8_0
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q5_1
                | Self::Q2K
                | Self::Q3K
                | Self::Q4K
                | Self::Q5K
                | Self::Q6K
                | Self::IQ4NL
                | Self::IQ4XS
        )
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_round_trips_ids() {
        for &(id, ty, name, bs, ts) in TABLE {
            assert_eq!(GgmlType::from_id(id), Some(ty));
            assert_eq!(ty.id(), id);
            assert_eq!(ty.name(), name);
            assert_eq!((ty.block_size(), ty.type_size()), (bs, ts));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn supported_list_matches_is_supported() {
        let listed: Vec<&str> = SUPPORTED_TYPES.split(", ").collect();
        for &(_, ty, name, _, _) in TABLE {
            assert_eq!(ty.is_supported(), listed.contains(&name), "{name}");
        }
        assert_eq!(
            listed.len(),
            TABLE.iter().filter(|r| r.1.is_supported()).count()
        );
    }
}
