//! GGUF metadata values.

use super::types::GgufValueType;

/// One metadata value, as typed in the file.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // one variant per GGUF value type
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    U64(u64),
    I64(i64),
    F64(f64),
    /// An array; all elements have type `elem_type` (GGUF arrays are homogeneous).
    Array {
        elem_type: GgufValueType,
        values: Vec<GgufValue>,
    },
}

impl GgufValue {
    /// The value's GGUF type.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            Self::U8(_) => GgufValueType::U8,
            Self::I8(_) => GgufValueType::I8,
            Self::U16(_) => GgufValueType::U16,
            Self::I16(_) => GgufValueType::I16,
            Self::U32(_) => GgufValueType::U32,
            Self::I32(_) => GgufValueType::I32,
            Self::F32(_) => GgufValueType::F32,
            Self::Bool(_) => GgufValueType::Bool,
            Self::String(_) => GgufValueType::String,
            Self::U64(_) => GgufValueType::U64,
            Self::I64(_) => GgufValueType::I64,
            Self::F64(_) => GgufValueType::F64,
            Self::Array { .. } => GgufValueType::Array,
        }
    }

    /// Any integer type as `i128` (lossless for every GGUF integer); `None` otherwise.
    pub fn as_int(&self) -> Option<i128> {
        Some(match *self {
            Self::U8(v) => v.into(),
            Self::I8(v) => v.into(),
            Self::U16(v) => v.into(),
            Self::I16(v) => v.into(),
            Self::U32(v) => v.into(),
            Self::I32(v) => v.into(),
            Self::U64(v) => v.into(),
            Self::I64(v) => v.into(),
            _ => return None,
        })
    }

    /// A non-negative integer that fits `u64`; `None` for other types or negative values.
    pub fn as_u64(&self) -> Option<u64> {
        self.as_int().and_then(|v| u64::try_from(v).ok())
    }

    /// A float or integer as `f64`. An `F32` is converted through its shortest decimal form,
    /// so `1e-5f32` gives `1e-5` (as HF's `config.json` says), not `9.99999974e-6`.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Self::F32(v) => v.to_string().parse().ok(),
            Self::F64(v) => Some(v),
            _ => self.as_int().map(|v| v as f64),
        }
    }

    /// A bool.
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Self::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            Self::Array { values, .. } => Some(values),
            _ => None,
        }
    }

    /// A short description for error messages: the type, and the value when it is short.
    pub fn describe(&self) -> String {
        match self {
            Self::Array { elem_type, values } => format!("array of {} {elem_type:?}", values.len()),
            Self::String(s) if s.len() > 60 => format!("string of {} bytes", s.len()),
            Self::String(s) => format!("string {s:?}"),
            other => format!("{other:?}"),
        }
    }
}
