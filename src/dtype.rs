//! Element types of tensor data, with the numeric codes that ckpt writes to disk.
//!
//! The codes are part of the on-disk format (docs/format.md) and never change; the order of the
//! variants in this file does not matter. Code 0 is reserved for "opaque bytes" (no dtype), which
//! callers represent as `Option<Dtype>::None`.

use std::fmt;

/// A tensor element type of the safetensors format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[allow(missing_docs)] // the variant names are the safetensors dtype names
pub enum Dtype {
    Bool = 1,
    U8 = 2,
    I8 = 3,
    F8E5M2 = 4,
    F8E4M3 = 5,
    I16 = 6,
    U16 = 7,
    F16 = 8,
    Bf16 = 9,
    I32 = 10,
    U32 = 11,
    F32 = 12,
    F64 = 13,
    I64 = 14,
    U64 = 15,
}

/// Every dtype, in code order.
pub const ALL_DTYPES: [Dtype; 15] = [
    Dtype::Bool,
    Dtype::U8,
    Dtype::I8,
    Dtype::F8E5M2,
    Dtype::F8E4M3,
    Dtype::I16,
    Dtype::U16,
    Dtype::F16,
    Dtype::Bf16,
    Dtype::I32,
    Dtype::U32,
    Dtype::F32,
    Dtype::F64,
    Dtype::I64,
    Dtype::U64,
];

impl Dtype {
    /// Size of one element in bytes.
    pub const fn size(self) -> usize {
        match self {
            Dtype::Bool | Dtype::U8 | Dtype::I8 | Dtype::F8E5M2 | Dtype::F8E4M3 => 1,
            Dtype::I16 | Dtype::U16 | Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::I32 | Dtype::U32 | Dtype::F32 => 4,
            Dtype::F64 | Dtype::I64 | Dtype::U64 => 8,
        }
    }

    /// Whether the codec moves the sign bit out of the exponent for this type
    /// (exponent extraction, docs/format.md). True for the 2-, 4- and 8-byte floats.
    pub const fn extracts_exponent(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64)
    }

    /// The name used in safetensors headers (`"BF16"`, `"F8_E4M3"`, ...).
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U8 => "U8",
            Dtype::I8 => "I8",
            Dtype::F8E5M2 => "F8_E5M2",
            Dtype::F8E4M3 => "F8_E4M3",
            Dtype::I16 => "I16",
            Dtype::U16 => "U16",
            Dtype::F16 => "F16",
            Dtype::Bf16 => "BF16",
            Dtype::I32 => "I32",
            Dtype::U32 => "U32",
            Dtype::F32 => "F32",
            Dtype::F64 => "F64",
            Dtype::I64 => "I64",
            Dtype::U64 => "U64",
        }
    }

    /// Parses a safetensors dtype name; `None` for names ckpt does not know.
    pub fn from_safetensors_name(name: &str) -> Option<Dtype> {
        ALL_DTYPES.iter().copied().find(|d| d.safetensors_name() == name)
    }

    /// The on-disk code of this dtype.
    pub const fn code(self) -> u8 {
        self as u8
    }

    /// Looks up an on-disk code; `None` for 0 (opaque bytes) and unknown codes.
    pub(crate) fn from_code(code: u8) -> Option<Dtype> {
        ALL_DTYPES.iter().copied().find(|d| d.code() == code)
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.safetensors_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_pinned() {
        let pinned: Vec<(u8, &str, usize)> =
            ALL_DTYPES.iter().map(|d| (d.code(), d.safetensors_name(), d.size())).collect();
        assert_eq!(
            pinned,
            vec![
                (1, "BOOL", 1),
                (2, "U8", 1),
                (3, "I8", 1),
                (4, "F8_E5M2", 1),
                (5, "F8_E4M3", 1),
                (6, "I16", 2),
                (7, "U16", 2),
                (8, "F16", 2),
                (9, "BF16", 2),
                (10, "I32", 4),
                (11, "U32", 4),
                (12, "F32", 4),
                (13, "F64", 8),
                (14, "I64", 8),
                (15, "U64", 8),
            ]
        );
        for d in ALL_DTYPES {
            assert_eq!(Dtype::from_code(d.code()), Some(d));
            assert_eq!(Dtype::from_safetensors_name(d.safetensors_name()), Some(d));
        }
        assert_eq!(Dtype::from_code(0), None);
        assert_eq!(Dtype::from_code(16), None);
        assert_eq!(Dtype::from_safetensors_name("bf16"), None);
    }
}
