//! What an estimator reads of the KV cache itself to produce its scores: the *estimation
//! reads* a fidelity report adds to the positions the selection makes the verifier read.
//!
//! Unit: **token-equivalents**, one = the key and the value vector of one context position of
//! one KV head (what dense attention reads per position and KV head). Reading only a key is
//! half a token-equivalent; a Quest page summary (a min and a max key vector) is one.
//! Prefill-time work (H2O's accumulation, SnapKV's votes, Dustin's seeds and calibration) is
//! not a verification read and is not counted; neither is the draft's own attention (the
//! lookahead is a by-product of drafting, which every selector pays alike).

/// The estimation reads of an estimator (see the module doc). Every method defaults to 0
/// (an estimator that reads nothing but lengths or prefill state).
pub trait EstimationCost {
    /// Token-equivalents read by one [`score`](dustin_core::ImportanceEstimator::score) call
    /// at `layer` for one sequence of `ctx` context tokens, in a model with `kv_heads` KV
    /// heads and `heads` query heads.
    fn score_reads(&self, _layer: usize, _ctx: usize, _kv_heads: usize, _heads: usize) -> f64 {
        0.0
    }

    /// Token-equivalents read by one
    /// [`observe_verify`](dustin_core::ImportanceEstimator::observe_verify) call (a
    /// verification that reuses a selection), same arguments.
    fn observe_reads(&self, _layer: usize, _ctx: usize, _kv_heads: usize, _heads: usize) -> f64 {
        0.0
    }
}

impl<E: EstimationCost + ?Sized> EstimationCost for Box<E> {
    fn score_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        (**self).score_reads(layer, ctx, kv_heads, heads)
    }
    fn observe_reads(&self, layer: usize, ctx: usize, kv_heads: usize, heads: usize) -> f64 {
        (**self).observe_reads(layer, ctx, kv_heads, heads)
    }
}
