//! Hugging Face model directories: `model.safetensors`, or shards listed in
//! `model.safetensors.index.json` (`{"weight_map": {tensor name: shard file}}`).
//!
//! Tensors in `F32`, `F16` and `BF16` are converted to `f32` on load; names and shapes are
//! served unchanged (they are already in HF naming and layout).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::{QwenError, Result};
use crate::weights::{HostTensor, WeightSource};

/// The safetensors weights of an HF model directory, memory-mapped.
#[derive(Debug)]
pub struct SafetensorsDir {
    dir: PathBuf,
    files: Vec<(PathBuf, Mmap)>,
    /// tensor name -> index into `files`
    index: BTreeMap<String, usize>,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> QwenError + '_ {
    move |source| QwenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SafetensorsDir {
    /// Opens `dir/model.safetensors`, or the shards named by `dir/model.safetensors.index.json`.
    ///
    /// # Errors
    /// [`QwenError::Io`] when no weight file is there, [`QwenError::Format`] for a malformed
    /// index or safetensors header (including truncated files).
    pub fn open(dir: &Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let single = dir.join("model.safetensors");
        let mut shard_names: Vec<String> = Vec::new();
        let mut name_to_shard: BTreeMap<String, String> = BTreeMap::new();
        if index_path.exists() {
            let text = std::fs::read_to_string(&index_path).map_err(io_err(&index_path))?;
            name_to_shard = parse_index(&text, &index_path.display().to_string())?;
            for file in name_to_shard.values() {
                if !shard_names.iter().any(|s| s == file) {
                    shard_names.push(file.clone());
                }
            }
        } else if single.exists() {
            shard_names.push("model.safetensors".into());
        } else {
            return Err(QwenError::Io {
                path: single,
                source: std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "no model.safetensors or model.safetensors.index.json in the directory",
                ),
            });
        }
        let mut files = Vec::new();
        let mut index = BTreeMap::new();
        for (i, shard) in shard_names.iter().enumerate() {
            let path = dir.join(shard);
            let f = File::open(&path).map_err(io_err(&path))?;
            // SAFETY: the file is opened read-only and we never hand out mutable access;
            // as with every mmap, a concurrent writer could change the bytes under us, which
            // can only make parsing fail, not violate memory safety of our reads of `&[u8]`.
            let mmap = unsafe { Mmap::map(&f) }.map_err(io_err(&path))?;
            for name in parse_safetensors(&mmap, &path.display().to_string())? {
                index.insert(name, i);
            }
            files.push((path, mmap));
        }
        for (name, shard) in &name_to_shard {
            if !index.contains_key(name) {
                return Err(QwenError::Format {
                    kind: "safetensors index",
                    path: index_path.display().to_string(),
                    msg: format!("`{name}` is mapped to {shard}, which does not contain it"),
                });
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            index,
        })
    }

    /// Names of all tensors.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }
}

/// Parses a `model.safetensors.index.json` text into its `weight_map` (tensor name -> shard
/// file name); `origin` names the file in errors. Shard names must be plain file names.
///
/// # Errors
/// [`QwenError::Format`] (kind `"safetensors index"`) for invalid JSON, a missing
/// `weight_map` object, a value that is not a string, or a shard name with a path in it.
pub fn parse_index(text: &str, origin: &str) -> Result<BTreeMap<String, String>> {
    let bad = |msg: String| QwenError::Format {
        kind: "safetensors index",
        path: origin.to_string(),
        msg,
    };
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or_else(|| bad("no `weight_map` object".into()))?;
    let mut out = BTreeMap::new();
    for (name, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("`weight_map.{name}` is not a file name")))?;
        if file.is_empty() || file.contains("..") || file.contains('/') || file.contains('\\') {
            return Err(bad(format!("shard name `{file}` is not a plain file name")));
        }
        out.insert(name.clone(), file.to_string());
    }
    Ok(out)
}

/// Parses a safetensors file held in `bytes` (header and the extent of every tensor) and
/// returns its tensor names; `origin` names the file in errors. Dtypes are checked when a
/// tensor is loaded ([`QwenError::UnsupportedDtype`]).
///
/// # Errors
/// [`QwenError::Format`] (kind `"safetensors"`) for a malformed or truncated header or data.
pub fn parse_safetensors(bytes: &[u8], origin: &str) -> Result<Vec<String>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| QwenError::Format {
        kind: "safetensors",
        path: origin.to_string(),
        msg: e.to_string(),
    })?;
    let names = st.names().into_iter().map(str::to_string).collect();
    Ok(names)
}

/// Converts raw little-endian bytes of `dtype` to `f32`.
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        other => {
            return Err(QwenError::UnsupportedDtype {
                name: name.to_string(),
                dtype: format!("{other:?}"),
                supported: "F32, F16, BF16",
            })
        }
    })
}

impl WeightSource for SafetensorsDir {
    fn describe(&self) -> String {
        self.dir.display().to_string()
    }

    fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn load(&self, name: &str) -> Result<HostTensor> {
        let i = *self
            .index
            .get(name)
            .ok_or_else(|| QwenError::MissingTensor {
                name: name.to_string(),
                source_desc: self.describe(),
            })?;
        let (path, mmap) = &self.files[i];
        let st = SafeTensors::deserialize(mmap).map_err(|e| QwenError::Format {
            kind: "safetensors",
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        let view = st.tensor(name).map_err(|e| QwenError::Format {
            kind: "safetensors",
            path: path.display().to_string(),
            msg: e.to_string(),
        })?;
        let data = to_f32(name, view.dtype(), view.data())?;
        Ok(HostTensor {
            shape: view.shape().to_vec(),
            data,
        })
    }
}
