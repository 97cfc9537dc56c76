//! Teacher forcing: the draft reads given tokens as if it had drafted them, for the
//! lookahead a proposal of those tokens would carry.

use burn_tensor::Tensor;
use dustin_core::{KvStore, Phase, TokenId};
use dustin_kernels::KernelOps;
use dustin_qwen::{ForwardOpts, LogitsMode};

use super::{add_padded, LookaheadHook, ModelDrafter};

impl<B: KernelOps> ModelDrafter<B> {
    /// Teacher forcing: reads `window[s]` (per sequence: its pending tokens, then the tokens
    /// it is taken to have drafted; every window of the same length `n >= 2`) in one pass,
    /// appends all of it to the draft cache, and returns the lookahead a proposal of those
    /// tokens carries: the attention mass per key of the window's first `n - 1` query rows
    /// (a proposal does not feed its last draft token), summed over the lookahead layers
    /// ([`ModelDrafter::with_lookahead`]), heads and rows, normalised to sum 1 per sequence,
    /// `[batch, cache length after the window]`. The window then counts as accepted whole:
    /// `next[s]` becomes the pending token, as after [`dustin_core::Drafter::commit`].
    ///
    /// The mass is scored after the pass from the kept queries
    /// ([`crate::LookaheadScoring::Deferred`]), whatever the scoring setting.
    ///
    /// # Errors
    /// [`dustin_core::CoreError::InvalidInput`] naming `window` when the batch, the lengths
    /// or the leading pending tokens do not match, or `next` when its length is not the
    /// batch; [`dustin_core::CoreError::Model`] before prefill or when no layer feeds the
    /// lookahead; model and kernel errors.
    pub fn force_window(
        &mut self,
        window: &[Vec<TokenId>],
        next: &[TokenId],
    ) -> dustin_core::Result<Tensor<B, 2>> {
        let batch = self.pending.len();
        let n = window.first().map_or(0, Vec::len);
        let fits = window.len() == batch
            && n >= 2
            && window
                .iter()
                .zip(&self.pending)
                .all(|(w, p)| w.len() == n && w.starts_with(p) && p.len() < n);
        if !fits {
            return Err(dustin_core::CoreError::invalid(
                "window",
                format!(
                    "{batch} windows of one length >= 2, each starting with its pending tokens"
                ),
                format!("{} windows", window.len()),
            ));
        }
        if next.len() != batch {
            return Err(dustin_core::CoreError::invalid(
                "next",
                format!("{batch} tokens"),
                next.len(),
            ));
        }
        let model = self.model.clone();
        let layers = self.layers;
        let mut hook = LookaheadHook::<B> {
            on: true,
            layers: self.lookahead.layers.clone(),
            keep: true,
            keep_first_row: false,
            parts: Vec::new(),
            queries: Default::default(),
            first_rows: Default::default(),
            selections: Vec::new(),
        };
        let cache = self.cache()?;
        let base: Vec<usize> = cache.lens().to_vec();
        model.forward(
            window,
            cache,
            &mut hook,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::None,
                layers,
            },
        )?;
        let mut acc: Option<Tensor<B, 3>> = None;
        for (layer, qs) in std::mem::take(&mut hook.queries) {
            let q = Tensor::cat(qs, 2);
            let [b, h, _, d] = q.dims();
            let q = q.slice([0..b, 0..h, 0..n - 1, 0..d]);
            acc = Some(add_padded(acc, model.key_mass(cache, layer, q, &base)?));
        }
        let acc = acc.ok_or_else(|| {
            dustin_core::CoreError::Model("no draft layer feeds the lookahead".into())
        })?;
        let [b, _, w] = acc.dims();
        let mass = acc.sum_dim(1).reshape([b, w]);
        // the cache's width after the window (the scoring view may be wider, with zeros)
        let width = base.iter().copied().max().unwrap_or(0) + n;
        let mass = if w > width {
            mass.slice([0..b, 0..width])
        } else if w < width {
            let zeros = Tensor::zeros([b, width - w], (&mass.device(), mass.dtype()));
            Tensor::cat(vec![mass, zeros], 1)
        } else {
            mass
        };
        let sum = mass.clone().sum_dim(1).clamp_min(1e-30);
        self.pending = next.iter().map(|&t| vec![t]).collect();
        self.base = base;
        self.fed = vec![0; batch];
        self.last = vec![Vec::new(); batch];
        self.scores = None;
        Ok(mass / sum)
    }
}
