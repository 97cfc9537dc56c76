//! The GGUF container: header, metadata, tensor infos, data section.
//!
//! Layout (ggml `docs/gguf.md`, little-endian):
//! ```text
//! "GGUF" | u32 version (2 or 3) | u64 tensor_count | u64 kv_count
//! kv_count x { string key | u32 value_type | value }
//! tensor_count x { string name | u32 n_dims | n_dims x u64 ne | u32 ggml_type | u64 offset }
//! padding to `general.alignment` (default 32)
//! data section: each tensor at data_offset + offset
//! ```
//! A string is a `u64` byte length then UTF-8 bytes; an array is a `u32` element type, a
//! `u64` count, then the elements. Dims are listed innermost first (`ne[0]` is the row
//! length).
//!
//! Every length and count is checked against the bytes left in the file before anything is
//! allocated, so a corrupt header cannot make us allocate more than the file's size.

use std::collections::{HashMap, HashSet};

use super::dequant::byte_size;
use super::types::{GgmlType, GgufValueType};
use super::value::GgufValue;

/// Default `general.alignment` of the data section.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// `GGML_MAX_DIMS`.
const MAX_DIMS: u32 = 4;
/// Deepest nesting of arrays we accept (ggml itself writes none).
const MAX_ARRAY_DEPTH: usize = 4;
/// Longest metadata array we accept (vocabularies have well under a million entries).
pub const MAX_ARRAY_LEN: u64 = 1 << 24;
/// Longest metadata string we accept, in bytes (chat templates are a few KiB).
pub const MAX_STRING_LEN: u64 = 1 << 26;
/// Most entries reserved up front for a list whose length the file states (it grows further
/// only as entries are actually read).
const MAX_RESERVE: u64 = 1 << 16;

/// One tensor's entry in the file header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// The GGUF tensor name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dims as stored: innermost (row length, `ne[0]`) first.
    pub dims: Vec<u64>,
    /// Storage type.
    pub ggml_type: GgmlType,
    /// Offset from the start of the data section, in bytes.
    pub offset: u64,
    /// Size of the data, in bytes.
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Shape outermost first (PyTorch / HF order): the reverse of [`GgufTensorInfo::dims`],
    /// so a linear weight with dims `[in, out]` has shape `[out, in]`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }
}

/// The parsed header of a GGUF file.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub metadata: Vec<(String, GgufValue)>,
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: u64,
    pub data_offset: u64,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8], String> {
        if n > self.remaining() {
            return Err(format!(
                "truncated: {what} needs {n} bytes at offset {}, but the file ends at {}",
                self.pos,
                self.buf.len()
            ));
        }
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &str) -> Result<u32, String> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, String> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.u64(what)?;
        if len > MAX_STRING_LEN {
            return Err(format!(
                "{what}: string length {len} at offset {} exceeds the limit of {MAX_STRING_LEN} bytes",
                self.pos - 8
            ));
        }
        if len > self.remaining() {
            return Err(format!(
                "{what}: string length {len} at offset {} exceeds the {} bytes left in the file",
                self.pos - 8,
                self.remaining()
            ));
        }
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|e| format!("{what}: string is not UTF-8 ({e})"))
    }

    fn value(&mut self, ty: GgufValueType, what: &str, depth: usize) -> Result<GgufValue, String> {
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(self.array::<1>(what)?[0]),
            GgufValueType::I8 => GgufValue::I8(self.array::<1>(what)?[0] as i8),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(what)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(what)?)),
            GgufValueType::U32 => GgufValue::U32(self.u32(what)?),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(what)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(what)?)),
            GgufValueType::U64 => GgufValue::U64(self.u64(what)?),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(what)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(what)?)),
            GgufValueType::Bool => match self.array::<1>(what)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(format!("{what}: bool byte is {b}, expected 0 or 1")),
            },
            GgufValueType::String => GgufValue::String(self.string(what)?),
            GgufValueType::Array => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(format!(
                        "{what}: arrays nested deeper than {MAX_ARRAY_DEPTH}"
                    ));
                }
                let id = self.u32(what)?;
                let elem_type = GgufValueType::from_id(id)
                    .ok_or_else(|| format!("{what}: unknown array element type {id}"))?;
                let count = self.u64(what)?;
                if count > MAX_ARRAY_LEN {
                    return Err(format!(
                        "{what}: array of {count} elements exceeds the limit of {MAX_ARRAY_LEN}"
                    ));
                }
                let need = count.checked_mul(elem_type.min_size());
                if need.is_none_or(|n| n > self.remaining()) {
                    return Err(format!(
                        "{what}: array of {count} {elem_type:?} cannot fit in the {} bytes left in the file",
                        self.remaining()
                    ));
                }
                let mut values = Vec::with_capacity(count.min(MAX_RESERVE) as usize);
                for _ in 0..count {
                    values.push(self.value(elem_type, what, depth + 1)?);
                }
                GgufValue::Array { elem_type, values }
            }
        })
    }
}

/// Parses the header of a GGUF file held in `buf` and checks every tensor's extent against
/// the file. Errors are messages without the file name (the caller adds it).
pub(crate) fn parse(buf: &[u8]) -> Result<Header, String> {
    let mut c = Cursor { buf, pos: 0 };
    if buf.len() < 4 {
        return Err(format!(
            "truncated: {} bytes, too short for the GGUF magic",
            buf.len()
        ));
    }
    let magic = c.take(4, "magic")?;
    if magic != b"GGUF" {
        return Err(format!(
            "bad magic {:?} (bytes {:02x?}), expected \"GGUF\": not a GGUF file",
            String::from_utf8_lossy(magic),
            magic
        ));
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        1 => return Err("GGUF version 1 is not supported (only versions 2 and 3)".into()),
        v if matches!(v.swap_bytes(), 2 | 3) => {
            return Err(format!(
                "version field reads {v}: a big-endian GGUF (version {}), which is not supported",
                v.swap_bytes()
            ))
        }
        v => {
            return Err(format!(
                "unsupported GGUF version {v} (only versions 2 and 3)"
            ))
        }
    }
    let tensor_count = c.u64("tensor count")?;
    let kv_count = c.u64("metadata count")?;
    // A KV takes at least 8 (key length) + 4 (type) + 1 bytes, a tensor info at least
    // 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset).
    let min = kv_count
        .checked_mul(13)
        .and_then(|k| tensor_count.checked_mul(24).and_then(|t| k.checked_add(t)));
    if min.is_none_or(|m| m > c.remaining()) {
        return Err(format!(
            "header claims {kv_count} metadata entries and {tensor_count} tensors, which cannot \
             fit in the {} bytes of the file (corrupt counts or truncated file)",
            buf.len()
        ));
    }

    let mut metadata = Vec::with_capacity(kv_count.min(MAX_RESERVE) as usize);
    let mut seen = HashSet::new();
    for i in 0..kv_count {
        let key = c
            .string(&format!("metadata key {} of {kv_count}", i + 1))
            .map_err(|e| format!("{e} (header claims {kv_count} metadata entries)"))?;
        let what = format!("metadata `{key}`");
        let id = c.u32(&what)?;
        let ty =
            GgufValueType::from_id(id).ok_or_else(|| format!("{what}: unknown value type {id}"))?;
        let value = c.value(ty, &what, 0)?;
        if !seen.insert(key.clone()) {
            return Err(format!("duplicate metadata key `{key}`"));
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(format!(
                    "general.alignment is {}, expected a power of two",
                    v.describe()
                ))
            }
        },
    };

    let mut tensors: Vec<GgufTensorInfo> =
        Vec::with_capacity(tensor_count.min(MAX_RESERVE) as usize);
    let mut index = HashMap::new();
    for i in 0..tensor_count {
        let at = c.pos;
        let hint = |e: String| {
            format!(
                "tensor info {} of {tensor_count} (at offset {at}): {e} (the header claims \
                 {kv_count} metadata entries and {tensor_count} tensors: a wrong count or a \
                 truncated file?)",
                i + 1
            )
        };
        let name = c.string("tensor name").map_err(hint)?;
        let what = format!("tensor `{name}`");
        let n_dims = c.u32(&what).map_err(hint)?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(hint(format!(
                "{what} has {n_dims} dims, expected 1 to {MAX_DIMS}"
            )));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64(&what).map_err(hint)?);
        }
        let type_id = c.u32(&what).map_err(hint)?;
        let ggml_type = GgmlType::from_id(type_id)
            .ok_or_else(|| hint(format!("{what} has unknown ggml type id {type_id}")))?;
        let offset = c.u64(&what).map_err(hint)?;
        let n = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("{what}: dims {dims:?} overflow the element count"))?;
        if !dims[0].is_multiple_of(ggml_type.block_size()) {
            return Err(format!(
                "{what}: row length {} is not a multiple of the {ggml_type} block size {}",
                dims[0],
                ggml_type.block_size()
            ));
        }
        let n_bytes = byte_size(ggml_type, n).ok_or_else(|| format!("{what}: size overflows"))?;
        if !offset.is_multiple_of(alignment) {
            return Err(format!(
                "{what}: data offset {offset} is not a multiple of the alignment {alignment}"
            ));
        }
        if index.insert(name.clone(), i).is_some() {
            return Err(format!("duplicate tensor name `{name}`"));
        }
        tensors.push(GgufTensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            n_bytes,
        });
    }

    let data_offset = (c.pos as u64).next_multiple_of(alignment);
    let file_len = buf.len() as u64;
    let mut extents: Vec<(u64, u64, &str)> = Vec::with_capacity(tensors.len());
    for t in &tensors {
        let start = data_offset.checked_add(t.offset);
        let end = start.and_then(|s| s.checked_add(t.n_bytes));
        match (start, end) {
            (Some(s), Some(e)) if e <= file_len => extents.push((s, e, &t.name)),
            _ => {
                return Err(format!(
                    "truncated: tensor `{}` ({} {:?}, {} bytes) at data offset {} runs past the \
                     end of the file ({file_len} bytes, data section starts at {data_offset})",
                    t.name, t.ggml_type, t.dims, t.n_bytes, t.offset
                ))
            }
        }
    }
    extents.sort_unstable();
    for w in extents.windows(2) {
        if w[1].0 < w[0].1 {
            return Err(format!(
                "tensors `{}` and `{}` overlap in the data section",
                w[0].2, w[1].2
            ));
        }
    }

    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_offset,
    })
}
