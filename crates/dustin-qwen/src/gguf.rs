//! GGUF (v3, and v2) model files: a small, isolated reader with dequantisation, serving
//! weights in Hugging Face naming and layout.
//!
//! - [`GgufFile::open`] memory-maps the file and parses the header, metadata and tensor infos
//!   (see [`reader`] for the layout); every malformed input is a [`QwenError::Format`] naming
//!   the file and the problem, and no length read from the file is trusted for an allocation
//!   before it is checked against the bytes that hold it;
//! - [`dequantize`] turns F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K,
//!   Q5_K, Q6_K, IQ4_NL and IQ4_XS data into `f32` (block layouts of `ggml-common.h`, see
//!   [`dequant`]); any other ggml type is reported as [`QwenError::UnsupportedDtype`] naming
//!   the tensor, its type and [`SUPPORTED_TYPES`];
//! - [`GgufFile`] implements [`WeightSource`]: `load("model.layers.0.self_attn.q_proj.weight")`
//!   reads `blk.0.attn_q.weight`, dequantises it, reverses GGUF's innermost-first dims to the HF
//!   shape `[out, in]` and, for `general.architecture == "llama"`, undoes llama.cpp's q/k row
//!   permutation ([`names::unpermute_rows`]);
//! - [`config_from_gguf`] and [`tokenizer_from_gguf`] build the [`QwenConfig`](crate::QwenConfig)
//!   and the `tokenizers` tokenizer from the metadata.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use dustin_kernels::cpu_quant::{QuantMatrix, QuantType};
use memmap2::Mmap;

use crate::error::{QwenError, Result};
use crate::weights::{HostTensor, WeightSource};

pub mod dequant;
mod hparams;
pub mod names;
pub mod reader;
mod tokenizer;
pub mod types;
pub mod value;

pub use dequant::{dequantize, DequantError};
pub use hparams::config_from_gguf;
pub use reader::GgufTensorInfo;
pub use tokenizer::{tokenizer_from_gguf, LLAMA3_PATTERN, QWEN2_PATTERN};
pub use types::{GgmlType, GgufValueType, SUPPORTED_TYPES};
pub use value::GgufValue;

/// An open GGUF file: parsed header plus a read-only memory map of the tensor data.
///
/// The map assumes the file is not modified while open (as every mmap-based loader does);
/// truncating it underneath us would fault on access.
pub struct GgufFile {
    path: PathBuf,
    mmap: Bytes,
    header: reader::Header,
    meta_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

/// The bytes of a GGUF file: memory-mapped from disk, or owned (parsed from a byte slice).
enum Bytes {
    Map(Mmap),
    Owned(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Map(m) => m,
            Bytes::Owned(v) => v,
        }
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.header.version)
            .field("metadata", &self.header.metadata.len())
            .field("tensors", &self.header.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Opens and memory-maps a GGUF file, parses its header and checks that every tensor's
    /// data lies inside the file.
    ///
    /// # Errors
    /// [`QwenError::Io`] when the file cannot be opened or mapped; [`QwenError::Format`]
    /// (kind `"GGUF"`, naming the file) for a bad magic, a version other than 2 or 3, a
    /// truncated header, metadata or tensor data, counts or lengths that cannot fit in the
    /// file, an unknown value or ggml type id, duplicate names, or misaligned offsets.
    pub fn open(path: &Path) -> Result<Self> {
        let io = |source| QwenError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            return Err(format_err(path, "empty file".into()));
        }
        // SAFETY: the map is read-only and lives as long as `self`; like every mmap loader we
        // rely on the file not being truncated or rewritten while it is open (documented on
        // `GgufFile`).
        let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
        Self::from_data(path.to_path_buf(), Bytes::Map(mmap))
    }

    /// Parses a GGUF file held in memory; `name` stands for its path in errors. Same checks
    /// and errors as [`GgufFile::open`] (this is the entry point of the GGUF fuzz target).
    ///
    /// # Errors
    /// [`QwenError::Format`] as for [`GgufFile::open`].
    pub fn from_bytes(name: &str, bytes: Vec<u8>) -> Result<Self> {
        if bytes.is_empty() {
            return Err(format_err(Path::new(name), "empty file".into()));
        }
        Self::from_data(PathBuf::from(name), Bytes::Owned(bytes))
    }

    fn from_data(path: PathBuf, mmap: Bytes) -> Result<Self> {
        let header = reader::parse(&mmap).map_err(|msg| format_err(&path, msg))?;
        let meta_index = header
            .metadata
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let tensor_index = header
            .tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Self {
            path,
            mmap,
            header,
            meta_index,
            tensor_index,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.header.version
    }

    /// Alignment of the data section and of every tensor offset, in bytes.
    pub fn alignment(&self) -> u64 {
        self.header.alignment
    }

    /// Byte offset of the data section in the file.
    pub fn data_offset(&self) -> u64 {
        self.header.data_offset
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.header.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// One metadata value.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index
            .get(key)
            .map(|&i| &self.header.metadata[i].1)
    }

    fn typed<'a, T>(
        &'a self,
        key: &str,
        expected: &str,
        f: impl FnOnce(&'a GgufValue) -> Option<T>,
    ) -> Result<Option<T>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => f(v).map(Some).ok_or_else(|| {
                self.config_err(format!(
                    "metadata `{key}` is {}, expected {expected}",
                    v.describe()
                ))
            }),
        }
    }

    /// A non-negative integer of any GGUF integer type.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type or a negative number.
    pub fn get_u64(&self, key: &str) -> Result<Option<u64>> {
        self.typed(key, "a non-negative integer", GgufValue::as_u64)
    }

    /// A float (F32 through its shortest decimal form, see [`GgufValue::as_f64`]) or integer.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type.
    pub fn get_f64(&self, key: &str) -> Result<Option<f64>> {
        self.typed(key, "a number", GgufValue::as_f64)
    }

    /// A bool.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type.
    pub fn get_bool(&self, key: &str) -> Result<Option<bool>> {
        self.typed(key, "a bool", GgufValue::as_bool)
    }

    /// A string.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type.
    pub fn get_str(&self, key: &str) -> Result<Option<&str>> {
        self.typed(key, "a string", GgufValue::as_str)
    }

    /// An array of strings.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type.
    pub fn get_str_array(&self, key: &str) -> Result<Option<Vec<&str>>> {
        self.typed(key, "an array of strings", |v| {
            v.as_array()?.iter().map(GgufValue::as_str).collect()
        })
    }

    /// An array of integers (any GGUF integer type), as `i64`.
    ///
    /// # Errors
    /// [`QwenError::Config`] when the key holds another type.
    pub fn get_i64_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        self.typed(key, "an array of integers", |v| {
            v.as_array()?
                .iter()
                .map(|x| x.as_int().and_then(|i| i64::try_from(i).ok()))
                .collect()
        })
    }

    /// `general.architecture` (`"qwen2"`, `"llama"`, ...).
    ///
    /// # Errors
    /// [`QwenError::Config`] when absent or not a string.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")?
            .ok_or_else(|| self.config_err("missing metadata key `general.architecture`".into()))
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.header.tensors
    }

    /// The info of a tensor by its GGUF name.
    pub fn tensor_info(&self, gguf_name: &str) -> Option<&GgufTensorInfo> {
        self.tensor_index
            .get(gguf_name)
            .map(|&i| &self.header.tensors[i])
    }

    /// The HF names of the tensors this file serves through [`WeightSource`], in file order
    /// (tensors without an HF counterpart, such as `rope_freqs.weight`, are left out).
    pub fn hf_tensor_names(&self) -> Vec<String> {
        self.header
            .tensors
            .iter()
            .filter_map(|t| names::gguf_to_hf(&t.name))
            .collect()
    }

    /// The raw (possibly quantised) bytes of a tensor, by GGUF name.
    ///
    /// # Errors
    /// [`QwenError::MissingTensor`] when absent.
    pub fn tensor_data(&self, gguf_name: &str) -> Result<&[u8]> {
        let t = self
            .tensor_info(gguf_name)
            .ok_or_else(|| QwenError::MissingTensor {
                name: gguf_name.to_string(),
                source_desc: self.describe(),
            })?;
        // `reader::parse` checked data_offset + offset + n_bytes <= file length; `get` keeps
        // this panic-free even so.
        let start = self.header.data_offset.saturating_add(t.offset);
        let end = start.saturating_add(t.n_bytes);
        usize::try_from(start)
            .ok()
            .zip(usize::try_from(end).ok())
            .and_then(|(s, e)| self.mmap.get(s..e))
            .ok_or_else(|| {
                format_err(
                    &self.path,
                    format!("tensor `{gguf_name}` data [{start}, {end}) lies outside the file"),
                )
            })
    }

    /// Loads a tensor by its GGUF name, dequantised to `f32`, with its shape outermost first
    /// (the reverse of GGUF's dims) and rows as stored (no q/k un-permutation).
    ///
    /// # Errors
    /// [`QwenError::MissingTensor`], [`QwenError::UnsupportedDtype`] naming the tensor and
    /// the ggml type, [`QwenError::Format`] when the `f32` copy cannot be allocated.
    pub fn load_gguf(&self, gguf_name: &str) -> Result<HostTensor> {
        self.load_named(gguf_name, gguf_name)
    }

    /// `load_gguf` with `display` as the tensor's name in errors.
    fn load_named(&self, gguf_name: &str, display: &str) -> Result<HostTensor> {
        let Some(t) = self.tensor_info(gguf_name) else {
            return Err(QwenError::MissingTensor {
                name: display.to_string(),
                source_desc: self.describe(),
            });
        };
        let data = self.tensor_data(gguf_name)?;
        if !t.ggml_type.is_supported() {
            return Err(QwenError::UnsupportedDtype {
                name: display.to_string(),
                dtype: t.ggml_type.name().to_string(),
                supported: SUPPORTED_TYPES,
            });
        }
        let n = usize::try_from(t.n_elements()).map_err(|_| {
            format_err(
                &self.path,
                format!("tensor `{display}` is too large for this platform"),
            )
        })?;
        let mut out = Vec::new();
        out.try_reserve_exact(n).map_err(|e| {
            format_err(
                &self.path,
                format!("cannot allocate {n} f32 values for tensor `{display}`: {e}"),
            )
        })?;
        out.resize(n, 0.0);
        dequantize(t.ggml_type, data, &mut out).map_err(|e| match e {
            DequantError::Unsupported(ty) => QwenError::UnsupportedDtype {
                name: display.to_string(),
                dtype: ty.name().to_string(),
                supported: SUPPORTED_TYPES,
            },
            other => format_err(&self.path, format!("tensor `{display}`: {other}")),
        })?;
        Ok(HostTensor {
            shape: t.shape(),
            data: out,
        })
    }

    /// For a Llama-architecture file, the head count that `gguf_name`'s rows were permuted
    /// with by llama.cpp's converter (q: `head_count`, k: `head_count_kv`); `None` when the
    /// tensor was stored as HF has it.
    fn permuted_heads(&self, gguf_name: &str) -> Result<Option<usize>> {
        if self.get_str("general.architecture")? != Some("llama") {
            return Ok(None);
        }
        let Some((_, suffix)) = gguf_name
            .strip_prefix("blk.")
            .and_then(|r| r.split_once('.'))
        else {
            return Ok(None);
        };
        let heads = self.get_u64("llama.attention.head_count")?;
        let key = match suffix {
            "attn_q.weight" | "attn_q.bias" => heads,
            "attn_k.weight" | "attn_k.bias" => {
                self.get_u64("llama.attention.head_count_kv")?.or(heads)
            }
            _ => return Ok(None),
        };
        let n = key.ok_or_else(|| {
            self.config_err("missing `llama.attention.head_count`, needed to un-permute q/k".into())
        })?;
        usize::try_from(n)
            .map(Some)
            .map_err(|_| self.config_err(format!("head count {n} does not fit usize")))
    }
}

impl WeightSource for GgufFile {
    fn describe(&self) -> String {
        format!("GGUF file {}", self.path.display())
    }

    /// Whether the HF-named tensor exists. `lm_head.weight` is absent when the model ties it
    /// to the embeddings (no `output.weight`); see `QwenConfig::tie_word_embeddings`.
    fn contains(&self, name: &str) -> bool {
        names::hf_to_gguf(name).is_some_and(|g| self.tensor_index.contains_key(&g))
    }

    /// Loads an HF-named tensor in HF layout (see the module docs).
    fn load(&self, name: &str) -> Result<HostTensor> {
        let gguf = names::hf_to_gguf(name).ok_or_else(|| QwenError::MissingTensor {
            name: name.to_string(),
            source_desc: self.describe(),
        })?;
        let display = format!("{name} (GGUF {gguf})");
        let mut t = self.load_named(&gguf, &display).map_err(|e| match e {
            QwenError::MissingTensor { source_desc, .. } => QwenError::MissingTensor {
                name: name.to_string(),
                source_desc,
            },
            other => other,
        })?;
        if let Some(heads) = self.permuted_heads(&gguf)? {
            let rows = t.shape.first().copied().unwrap_or(0);
            let cols = t.shape.iter().skip(1).product::<usize>();
            if !names::unpermute_rows(&mut t.data, rows, cols, heads) {
                return Err(format_err(
                    &self.path,
                    format!(
                        "tensor `{display}` has {rows} rows, not a multiple of 2 x {heads} heads: \
                         cannot undo the llama.cpp q/k permutation"
                    ),
                ));
            }
        }
        Ok(t)
    }

    /// The HF-named tensor's blocks as stored, where it is 2-D in a format of
    /// [`QuantType`] and stored as HF orders its rows (not a llama.cpp-permuted q/k).
    fn load_blocks(&self, name: &str) -> Result<Option<QuantMatrix>> {
        let Some(gguf) = names::hf_to_gguf(name) else {
            return Ok(None);
        };
        let Some(t) = self.tensor_info(&gguf) else {
            return Ok(None);
        };
        let Some(ty) = QuantType::from_ggml_id(t.ggml_type.id()) else {
            return Ok(None);
        };
        let shape = t.shape();
        if shape.len() != 2 || self.permuted_heads(&gguf)?.is_some() {
            return Ok(None);
        }
        let data = self.tensor_data(&gguf)?;
        QuantMatrix::new(ty, shape[0], shape[1], data.to_vec())
            .map(Some)
            .map_err(|e| format_err(&self.path, format!("tensor `{name} (GGUF {gguf})`: {e}")))
    }
}

fn format_err(path: &Path, msg: String) -> QwenError {
    QwenError::Format {
        kind: "GGUF",
        path: path.display().to_string(),
        msg,
    }
}
