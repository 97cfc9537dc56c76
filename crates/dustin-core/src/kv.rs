use burn_tensor::{backend::Backend, Tensor};

use crate::Result;

/// A dense view of one layer's cache: keys and values of the first `len` positions.
///
/// `k` and `v` are `[batch, kv_heads, len, head_dim]`; positions at or past a sequence's own
/// length hold stale data and must be masked by the reader (see [`KvStore::lens`]).
#[derive(Debug, Clone)]
pub struct KvView<B: Backend> {
    /// Keys, `[batch, kv_heads, len, head_dim]`, RoPE already applied.
    pub k: Tensor<B, 4>,
    /// Values, `[batch, kv_heads, len, head_dim]`.
    pub v: Tensor<B, 4>,
}

/// A KV cache for all layers of one model and a batch of sequences of different lengths.
///
/// Protocol of one forward pass over `n` new tokens per sequence: every layer calls
/// [`KvStore::append`] once (which writes at each sequence's own offset `lens()[b]` without
/// moving it), then the caller calls [`KvStore::advance`]`(n)`. Rejected tokens are dropped
/// with [`KvStore::truncate`] (rollback); finished sequences leave with [`KvStore::retain`].
pub trait KvStore<B: Backend> {
    /// Number of sequences (the batch dimension).
    fn batch(&self) -> usize;
    /// Number of layers.
    fn num_layers(&self) -> usize;
    /// Committed length of each sequence, in tokens.
    fn lens(&self) -> &[usize];
    /// Preallocated capacity per sequence, in tokens.
    fn capacity(&self) -> usize;
    /// Writes `k`, `v` (`[batch, kv_heads, n, head_dim]`) of `layer` at positions
    /// `lens()[b] .. lens()[b] + n` of each sequence `b`.
    ///
    /// # Errors
    /// [`crate::CoreError::CacheFull`] when a sequence would exceed the capacity, and
    /// [`crate::CoreError::Shape`] for a wrong shape.
    fn append(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) -> Result<()>;
    /// Advances every sequence's length by `n` after all layers were appended.
    ///
    /// # Errors
    /// [`crate::CoreError::CacheFull`] past the capacity.
    fn advance(&mut self, n: usize) -> Result<()>;
    /// Rolls sequence `seq` back to `len` tokens (`len <= lens()[seq]`).
    ///
    /// # Errors
    /// [`crate::CoreError::InvalidInput`] when `seq` is out of range or `len` is longer than
    /// the sequence.
    fn truncate(&mut self, seq: usize, len: usize) -> Result<()>;
    /// Keeps only the sequences listed in `keep` (ascending, unique), in that order.
    ///
    /// # Errors
    /// [`crate::CoreError::InvalidInput`] for an index out of range or not ascending.
    fn retain(&mut self, keep: &[usize]) -> Result<()>;
    /// Keys and values of `layer` for positions `0 .. len` (`len <= capacity()`).
    fn view(&self, layer: usize, len: usize) -> KvView<B>;
}
