//! An LM head over part of the vocabulary, for a draft model: the logits of the kept ids are
//! computed, every other id gets `-inf` (so a greedy or sampled draft never proposes it).
//!
//! Why: the draft's LM head is the largest single product of a small draft. Qwen2.5-0.5B's
//! head is `151,936 x 896` (136 M weights, 27% of the model), read at every draft step. A
//! draft's proposals only need to be good, not exact: verification keeps the target's output
//! unchanged (greedy: the same tokens; sampled: the same distribution, since the proposal
//! distribution `q` the verifier divides by is the restricted one). FR-Spec (Zhao et al.,
//! "FR-Spec: Accelerating Large-Vocabulary Language Models via Frequency-Ranked Speculative
//! Sampling", 2025) restricts the draft's head to the most frequent tokens for this reason.
//!
//! Which ids: [`HeadVocab::frequency_ranked`] keeps the first `rows` ids plus the given extra
//! ids (the tokenizer's end tokens). Byte-level BPE vocabularies such as Qwen2's number their
//! tokens in merge order, and a BPE trainer merges the most frequent pair first, so low ids
//! are the frequent tokens; this needs no token counts from a corpus.

use burn_tensor::{backend::Backend, IndexingUpdateOp, Int, Tensor, TensorData};
use dustin_core::TokenId;
use dustin_kernels::cpu_quant::QuantMatrix;
use std::sync::Arc;

use super::layers::Weight;
use crate::error::{QwenError, Result};

/// The vocabulary ids an LM head computes (sorted, distinct).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadVocab {
    ids: Vec<TokenId>,
}

impl HeadVocab {
    /// Ids `0 .. rows` and `extra` (deduplicated) of a vocabulary of `vocab` ids.
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] naming `rows` when it is 0 or above `vocab`, `extra` when
    /// an id is not below `vocab`.
    pub fn frequency_ranked(rows: usize, extra: &[TokenId], vocab: usize) -> Result<Self> {
        if rows == 0 || rows > vocab {
            return Err(QwenError::ConfigValue {
                key: "rows",
                value: rows.to_string(),
                expected: format!("1 ..= {vocab} (the vocabulary size)"),
            });
        }
        if let Some(&bad) = extra.iter().find(|&&id| id as usize >= vocab) {
            return Err(QwenError::ConfigValue {
                key: "extra",
                value: bad.to_string(),
                expected: format!("token ids below {vocab} (the vocabulary size)"),
            });
        }
        let mut ids: Vec<TokenId> = (0..rows as TokenId).collect();
        ids.extend(extra.iter().filter(|&&id| id as usize >= rows));
        ids.sort_unstable();
        ids.dedup();
        Ok(Self { ids })
    }

    /// The ids, ascending.
    pub fn ids(&self) -> &[TokenId] {
        &self.ids
    }
}

/// An LM head restricted to a [`HeadVocab`]: the kept rows of the weight and where their
/// logits go in the full vocabulary.
#[derive(Debug, Clone)]
pub(crate) struct HeadSubset<B: Backend> {
    /// The weight of the kept ids (`[hidden, kept]` dense, or `[kept, hidden]` in blocks).
    pub weight: Weight<B>,
    /// The kept ids `[kept]`: the column of the full logits each kept logit goes to.
    ids: Tensor<B, 1, Int>,
    /// `[1, vocab]`: 0 at a kept id, `-inf` elsewhere (added to the scattered logits).
    mask: Tensor<B, 2>,
}

impl<B: Backend> HeadSubset<B> {
    /// The rows of `head` (`[hidden, vocab]` dense or `[vocab, hidden]` in blocks) for
    /// `keep`.
    ///
    /// # Errors
    /// [`QwenError::ConfigValue`] naming `head_vocab` when an id is not below the head's
    /// vocabulary or the head is neither dense nor in GGUF blocks (an offloaded or packed
    /// substitute head).
    pub fn new(head: &Weight<B>, keep: &HeadVocab, device: &B::Device) -> Result<Self> {
        let [_, vocab] = head.dims();
        let unsupported = |what: &str| QwenError::ConfigValue {
            key: "head_vocab",
            value: format!("{} ids", keep.ids.len()),
            expected: what.to_string(),
        };
        if keep.ids.last().is_some_and(|&id| id as usize >= vocab) {
            return Err(unsupported(&format!(
                "ids below the head's vocabulary {vocab}"
            )));
        }
        let weight = match head {
            Weight::Blocks(q) => {
                let rb = q.row_bytes();
                let mut data = Vec::with_capacity(keep.ids.len() * rb);
                for &id in &keep.ids {
                    let at = id as usize * rb;
                    data.extend_from_slice(&q.data()[at..at + rb]);
                }
                let m = QuantMatrix::new(q.quant_type(), keep.ids.len(), q.cols(), data)
                    .map_err(|e| unsupported(&e.to_string()))?;
                Weight::Blocks(Arc::new(m))
            }
            Weight::Dense(w) => {
                let ids: Vec<i64> = keep.ids.iter().map(|&i| i64::from(i)).collect();
                let n = ids.len();
                let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), device);
                Weight::Dense(w.clone().select(1, idx))
            }
            _ => {
                return Err(unsupported(
                    "a dense or GGUF-block LM head (not offloaded or packed)",
                ))
            }
        };
        let n = keep.ids.len();
        let ids: Vec<i64> = keep.ids.iter().map(|&i| i64::from(i)).collect();
        let mut mask = vec![f32::NEG_INFINITY; vocab];
        for &id in &keep.ids {
            mask[id as usize] = 0.0;
        }
        Ok(Self {
            weight,
            ids: Tensor::from_data(TensorData::new(ids, [n]), device),
            mask: Tensor::from_data(TensorData::new(mask, [1, vocab]), device),
        })
    }

    /// The full-vocabulary logits `[rows, vocab]` from the kept ids' logits `y`
    /// `[rows, kept]`: each kept logit in its id's column, `-inf` in every other. Three ops
    /// whatever the ids (zeros, one scatter of the columns, the mask added), where a run of
    /// ids at a time would take two a run.
    pub fn expand(&self, y: Tensor<B, 2>) -> Tensor<B, 2> {
        let [rows, _] = y.dims();
        let [_, vocab] = self.mask.dims();
        Tensor::<B, 2>::zeros([rows, vocab], &y.device())
            .select_assign(1, self.ids.clone(), y, IndexingUpdateOp::Add)
            .add(self.mask.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frequency_ranked_keeps_the_prefix_and_the_extra_ids() {
        let v = HeadVocab::frequency_ranked(4, &[9, 2, 7, 9], 10).unwrap();
        assert_eq!(v.ids(), &[0, 1, 2, 3, 7, 9]);
        assert!(HeadVocab::frequency_ranked(0, &[], 10).is_err());
        assert!(HeadVocab::frequency_ranked(11, &[], 10).is_err());
        assert!(HeadVocab::frequency_ranked(4, &[10], 10).is_err());
    }
}
