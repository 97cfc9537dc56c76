//! Weights kept in their GGUF block formats ([`WeightFormat::Blocks`]): the linear layers,
//! the embedding and the LM head of a GGUF model stay as the file stores them (Q4_K, Q6_K,
//! Q5_0, Q8_0, ...) and are multiplied by the backend's block kernels
//! ([`KernelOps::quant_linear`](dustin_kernels::LinearOps::quant_linear)), as llama.cpp does. On the CPU a decode step
//! of Qwen2.5-Coder-1.5B (Q4_K_M) then reads about 1.1 GB of weights instead of 6.2 GB of f32,
//! and the model holds no f32 copy of them.

use std::sync::Arc;

use burn_tensor::{backend::Backend, Int, Tensor, TensorData};
use dustin_kernels::cpu_quant::{QuantMatrix, QuantType};

use crate::error::{QwenError, Result};
use crate::gguf::dequantize;
use crate::gguf::types::GgmlType;

/// In what form a model loads its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// Every weight decoded to the backend's float dtype (f32 on the CPU) on the device: the
    /// reference path, and the one for backends without block kernels.
    #[default]
    Dense,
    /// Linear weights, the embedding and the LM head kept in their stored block format where
    /// the source holds one the block kernels read ([`QuantType`]); everything else dense.
    /// Meant for backends with [`KernelOps::QUANT_KERNELS`](dustin_kernels::LinearOps::QUANT_KERNELS) (the CPU);
    /// elsewhere each product dequantizes its weight first.
    Blocks,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "dense" | "f32" => Ok(Self::Dense),
            "blocks" | "gguf" => Ok(Self::Blocks),
            _ => Err(format!(
                "weight format `{s}`: expected `dense` (decoded to f32) or `blocks` (kept in \
                 their GGUF block format)"
            )),
        }
    }
}

/// The token embedding `[vocab, hidden]`.
#[derive(Debug, Clone)]
pub enum Embedding<B: Backend> {
    /// On the device in the backend's float dtype.
    Dense(Tensor<B, 2>),
    /// In host memory as stored blocks (`[vocab, hidden]`, one row per token); a step decodes
    /// the rows of its tokens only.
    Blocks(Arc<QuantMatrix>),
}

impl<B: Backend> Embedding<B> {
    /// `[vocab, hidden]`.
    pub fn dims(&self) -> [usize; 2] {
        match self {
            Self::Dense(t) => t.dims(),
            Self::Blocks(q) => [q.rows(), q.cols()],
        }
    }

    /// Bytes the embedding holds.
    pub fn bytes(&self) -> usize {
        match self {
            Self::Dense(t) => t.dims().iter().product::<usize>() * t.dtype().size(),
            Self::Blocks(q) => q.bytes(),
        }
    }

    /// The rows of `ids` (`[n]` token ids), `[n, hidden]` on `device`.
    ///
    /// # Errors
    /// [`QwenError::Format`] when an id is past the vocabulary (block embeddings; a dense
    /// one follows Burn's `select`).
    pub fn rows(&self, ids: Tensor<B, 1, Int>, device: &B::Device) -> Result<Tensor<B, 2>> {
        match self {
            Self::Dense(t) => Ok(t.clone().select(0, ids)),
            Self::Blocks(q) => {
                let ids: Vec<i64> = ids
                    .into_data()
                    .convert::<i64>()
                    .into_vec()
                    .map_err(|e| blocks_err(format!("token ids: {e:?}")))?;
                let h = q.cols();
                let mut out = vec![0.0f32; ids.len() * h];
                for (row, &id) in out.chunks_exact_mut(h).zip(&ids) {
                    let r = usize::try_from(id)
                        .ok()
                        .filter(|&r| r < q.rows())
                        .ok_or_else(|| {
                            blocks_err(format!(
                                "token id {id}: expected an id below the vocabulary size {}",
                                q.rows()
                            ))
                        })?;
                    dequantize_rows(q, r..r + 1, row)?;
                }
                Ok(Tensor::from_data(
                    TensorData::new(out, [ids.len(), h]),
                    device,
                ))
            }
        }
    }

    /// The embedding as a dense tensor `[vocab, hidden]` on `device` (a copy decoded from the
    /// blocks where it holds blocks).
    ///
    /// # Errors
    /// [`QwenError::Format`] when the blocks cannot be decoded.
    pub fn to_dense(&self, device: &B::Device) -> Result<Tensor<B, 2>> {
        match self {
            Self::Dense(t) => Ok(t.clone()),
            Self::Blocks(q) => {
                let mut out = vec![0.0f32; q.rows() * q.cols()];
                dequantize_rows(q, 0..q.rows(), &mut out)?;
                Ok(Tensor::from_data(
                    TensorData::new(out, [q.rows(), q.cols()]),
                    device,
                ))
            }
        }
    }
}

/// The ggml type of a block format.
pub(crate) fn ggml_type(ty: QuantType) -> GgmlType {
    match ty {
        QuantType::Q4_0 => GgmlType::Q4_0,
        QuantType::Q4_1 => GgmlType::Q4_1,
        QuantType::Q5_0 => GgmlType::Q5_0,
        QuantType::Q5_1 => GgmlType::Q5_1,
        QuantType::Q8_0 => GgmlType::Q8_0,
        QuantType::Q4K => GgmlType::Q4K,
        QuantType::Q5K => GgmlType::Q5K,
        QuantType::Q6K => GgmlType::Q6K,
    }
}

/// Rows `rows` of `q` decoded to f32 into `out` (`rows.len() * q.cols()` values), with
/// [`crate::gguf::dequantize`] (bit-exact against the `gguf` Python package).
///
/// # Errors
/// [`QwenError::Format`] when `rows` lies past `q` or `out` has another length.
pub(crate) fn dequantize_rows(
    q: &QuantMatrix,
    rows: std::ops::Range<usize>,
    out: &mut [f32],
) -> Result<()> {
    let rb = q.row_bytes();
    let bytes = q
        .data()
        .get(rows.start * rb..rows.end * rb)
        .ok_or_else(|| blocks_err(format!("rows {rows:?} of a {}-row weight", q.rows())))?;
    dequantize(ggml_type(q.quant_type()), bytes, out).map_err(|e| blocks_err(e.to_string()))
}

/// A block weight `[n, k]` (GGUF layout) decoded and transposed to `[k, n]` (`[in, out]`),
/// row-major, in host memory.
///
/// # Errors
/// [`QwenError::Format`] when the blocks cannot be decoded.
pub(crate) fn host_t(q: &QuantMatrix) -> Result<Vec<f32>> {
    let (n, k) = (q.rows(), q.cols());
    let mut rowmajor = vec![0.0f32; n * k];
    dequantize_rows(q, 0..n, &mut rowmajor)?;
    let mut t = vec![0.0f32; n * k];
    for (r, row) in rowmajor.chunks_exact(k).enumerate() {
        for (c, &v) in row.iter().enumerate() {
            t[c * n + r] = v;
        }
    }
    Ok(t)
}

/// A block weight `[n, k]` decoded on `device` and returned as its transpose `[k, n]`
/// (`[in, out]`): a strided view of the row-major `[n, k]` values, which matmul reads in
/// place (no transposed copy).
///
/// # Errors
/// [`QwenError::Format`] when the blocks cannot be decoded.
pub(crate) fn dense_t<B: Backend>(q: &QuantMatrix, device: &B::Device) -> Result<Tensor<B, 2>> {
    use rayon::prelude::*;
    let (n, k) = (q.rows(), q.cols());
    let mut rowmajor = vec![0.0f32; n * k];
    // 64 rows a task: a few hundred KiB of blocks each
    rowmajor
        .par_chunks_mut(64 * k)
        .enumerate()
        .try_for_each(|(i, out)| {
            let r0 = i * 64;
            dequantize_rows(q, r0..r0 + out.len() / k, out)
        })?;
    let t: Tensor<B, 2> = Tensor::from_data(TensorData::new(rowmajor, [n, k]), device);
    Ok(t.transpose())
}

fn blocks_err(msg: String) -> QwenError {
    QwenError::Format {
        kind: "block weight",
        path: String::new(),
        msg,
    }
}
