//! One row of a batch cache as a batch-1 cache whose writes land in the batch's own buffers:
//! a batch is prefilled one sequence at a time without a second copy of any row.

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{CoreError, Result};

use crate::{DenseKvCache, KvShape};

/// Where a row cache sits in its batch: the row, and the batch's size and lengths as they
/// were when the row was taken (the row's own length is the cache's).
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) seq: usize,
    batch: usize,
    lens: Vec<usize>,
}

impl<B: Backend> DenseKvCache<B> {
    /// Sequence `seq` of this batch cache as a batch-1 cache that holds the batch's own
    /// buffers: its reads are views of row `seq`, and its appends write into that row in place
    /// (Burn's slice-assign on a tensor nothing else holds). Run a sequence's prefill on it,
    /// then [`DenseKvCache::into_batch`]. [`DenseKvCache::sequence`] instead gives a cache
    /// whose first write copies the row, one sequence's cache more in memory (0.94 GB for
    /// Qwen2.5-Coder-1.5B at 32k). A clone of the row cache (or of a view it gave) that is
    /// alive at a write makes that write copy the whole layer, as for any shared tensor.
    ///
    /// Until `into_batch`, the row cache refuses what needs the whole batch: `stack`,
    /// `sequence`, `write_sequence`, `retain`.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] for `seq` outside the batch or a cache that is a row
    /// already.
    pub fn into_row(self, seq: usize) -> Result<Self> {
        self.whole("cache")?;
        if seq >= self.shape.batch {
            return Err(CoreError::invalid(
                "seq",
                format!("a sequence index below {}", self.shape.batch),
                seq,
            ));
        }
        let row = Row {
            seq,
            batch: self.shape.batch,
            lens: self.lens.clone(),
        };
        Ok(Self {
            lens: vec![self.lens[seq]],
            shape: KvShape {
                batch: 1,
                ..self.shape
            },
            row: Some(row),
            ..self
        })
    }

    /// The batch cache a row cache ([`DenseKvCache::into_row`]) was taken from, with the
    /// row's length as the row cache left it; a whole cache comes back as it is.
    pub fn into_batch(self) -> Self {
        match self.row {
            None => self,
            Some(Row {
                seq,
                batch,
                mut lens,
            }) => {
                lens[seq] = self.lens[0];
                Self {
                    lens,
                    shape: KvShape {
                        batch,
                        ..self.shape
                    },
                    row: None,
                    ..self
                }
            }
        }
    }

    /// Whether this cache is one row of a batch cache ([`DenseKvCache::into_row`]).
    pub fn is_row(&self) -> bool {
        self.row.is_some()
    }

    /// An error naming `name` when this cache is a row of a batch cache.
    pub(crate) fn whole(&self, name: &str) -> Result<()> {
        match &self.row {
            None => Ok(()),
            Some(r) => Err(CoreError::invalid(
                name,
                "a whole cache (DenseKvCache::into_batch first)",
                format!("row {} of a batch of {}", r.seq, r.batch),
            )),
        }
    }

    /// [`dustin_core::KvStore::append`] of a row cache: `k` and `v` `[1, kv_heads, n,
    /// head_dim]` (checked by the caller) written at the row's length into its row of the
    /// batch's layer.
    pub(crate) fn append_row(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<()> {
        let seq = self.row.as_ref().map_or(0, |r| r.seq);
        let start = self.lens[0];
        let [_, h, n, d] = k.dims();
        let ranges = [seq..seq + 1, 0..h, start..start + n, 0..d];
        for (slot, src) in [(&mut self.k[layer], k), (&mut self.v[layer], v)] {
            let dst = slot
                .take()
                .ok_or_else(|| CoreError::Model("KV cache layer poisoned".into()))?;
            *slot = Some(dst.slice_assign(ranges.clone(), src));
        }
        Ok(())
    }
}
