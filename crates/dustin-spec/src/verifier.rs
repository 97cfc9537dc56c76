use std::sync::{Arc, Mutex};

use burn_tensor::{backend::Backend, Tensor};
use dustin_core::{KvStore, Phase, SelectionPolicy, TokenId, Verification, Verifier, VerifyCtx};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::{prefill_from, AUTO_PREFILL_CHUNK};
use dustin_qwen::{ForwardOpts, LogitsMode, Qwen2};

use crate::join::{find_row, stack_row, JoinPolicy, JoinVerifier, RowPrefill};

/// The target model as a [`Verifier`]: one forward pass over the pending token and the
/// `gamma` draft tokens per sequence, attending densely or through the policy `P`'s
/// selections (sparse verification).
#[derive(Debug)]
pub struct ModelVerifier<B: Backend, P: SelectionPolicy<B>> {
    model: Arc<Qwen2<B>>,
    policy: P,
    cache: Option<DenseKvCache<B>>,
    pending: Vec<TokenId>,
    base: Vec<usize>,
    extra_capacity: usize,
    vocab: usize,
    prefill_chunk: usize,
    prefix: Option<Vec<DenseKvCache<B>>>,
    /// a cache holding whole prompts and the last prompt logits, for the next prefill
    prefilled: Option<(DenseKvCache<B>, Tensor<B, 2>)>,
    /// context positions read and dense reads of the last verification, per sequence
    last_reads: (Vec<u64>, Vec<u64>),
    share: Option<TargetKv<B>>,
    /// sequences being prefilled to join the batch ([`crate::JoinVerifier`])
    joining: Vec<RowPrefill<B, P>>,
}

/// A handle through which a [`ModelVerifier`] publishes its committed KV cache (after prefill,
/// every commit and every retain) and a [`crate::ModelDrafter`] made from the target's own
/// layers reads it (SubSpec: the draft attends to the target's exact K/V for every committed
/// token and writes only its draft tokens, [`crate::ModelDrafter::with_target_kv`]).
///
/// Cloning a [`DenseKvCache`] shares its tensors; the draft's first append copies a layer
/// (copy on write), so the target's cache is never changed by the draft.
#[derive(Debug)]
pub struct TargetKv<B: Backend>(Arc<Mutex<Option<DenseKvCache<B>>>>);

impl<B: Backend> Clone for TargetKv<B> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<B: Backend> Default for TargetKv<B> {
    fn default() -> Self {
        Self(Arc::new(Mutex::new(None)))
    }
}

impl<B: Backend> TargetKv<B> {
    /// An empty handle.
    pub fn new() -> Self {
        Self::default()
    }
    fn publish(&self, cache: &DenseKvCache<B>) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = Some(cache.clone());
        }
    }

    /// Forgets the published cache (so that its tensors are not shared while the verifier
    /// rebuilds them).
    fn clear(&self) {
        if let Ok(mut slot) = self.0.lock() {
            *slot = None;
        }
    }

    /// The last published cache (a cheap clone), `None` before the verifier's prefill.
    pub fn get(&self) -> Option<DenseKvCache<B>> {
        self.0.lock().ok().and_then(|c| c.clone())
    }
}

impl<B: Backend, P: SelectionPolicy<B>> ModelVerifier<B, P> {
    /// A verifier for `model` with selection `policy`, room for `extra_capacity` tokens past
    /// the longest prompt, sampling over the first `vocab` logits (the real vocabulary).
    pub fn new(model: Arc<Qwen2<B>>, policy: P, extra_capacity: usize, vocab: usize) -> Self {
        let vocab = vocab.min(model.config.vocab_size);
        Self {
            model,
            policy,
            cache: None,
            pending: Vec::new(),
            base: Vec::new(),
            extra_capacity,
            vocab,
            prefill_chunk: AUTO_PREFILL_CHUNK,
            prefix: None,
            prefilled: None,
            last_reads: (Vec::new(), Vec::new()),
            share: None,
            joining: Vec::new(),
        }
    }

    /// Prefills prompts in chunks of `chunk` tokens (`dustin_qwen::generate::prefill`'s
    /// rule; the default, 0, is the backend's choice). A selection policy observes the
    /// prompt chunk by chunk, so the chunk can change what it selects later.
    pub fn with_prefill_chunk(mut self, chunk: usize) -> Self {
        self.prefill_chunk = chunk;
        self
    }

    /// Publishes the committed cache through `kv` (see [`TargetKv`]).
    pub fn with_target_kv(mut self, kv: TargetKv<B>) -> Self {
        self.share = Some(kv);
        self
    }

    fn publish(&self) {
        if let (Some(kv), Some(c)) = (&self.share, &self.cache) {
            kv.publish(c);
        }
    }

    /// Stages prefix caches for the next [`Verifier::prefill`]: one batch-1 cache per prompt
    /// holding that prompt's first tokens (a dense prefill shared between runs). Prefill then
    /// runs only the rest of each prompt, through the selection policy. The caches must have
    /// the capacity this verifier would allocate (longest prompt + `extra_capacity`).
    pub fn with_prefix(mut self, prefixes: Vec<DenseKvCache<B>>) -> Self {
        self.prefix = Some(prefixes);
        self
    }

    /// Stages a finished prefill for the next [`Verifier::prefill`]: `cache` holds every
    /// prompt whole (one sequence per prompt, the lengths of the prompts) and `last` is the
    /// target's logits at each prompt's last position, `[batch, vocab]` (padded vocabulary
    /// allowed). Prefill then runs nothing: it checks the prompts' lengths, keeps the policy
    /// as it is (no reset: it is taken to have observed the prompts already, e.g. through a
    /// hook that showed the last prefill chunk to several policies) and returns `last`. The
    /// cache needs room for the generation: its capacity is used as given.
    pub fn with_prefilled(mut self, cache: DenseKvCache<B>, last: Tensor<B, 2>) -> Self {
        self.prefilled = Some((cache, last));
        self
    }

    /// Context positions the last [`Verifier::verify`] read and the positions dense attention
    /// would have read, per sequence, summed over layers and KV heads (new tokens not
    /// counted): the counts behind [`Verification::kv_read_fraction`]. Empty before the first
    /// verification.
    pub fn last_reads(&self) -> (&[u64], &[u64]) {
        (&self.last_reads.0, &self.last_reads.1)
    }

    /// The selection policy.
    pub fn policy(&self) -> &P {
        &self.policy
    }

    /// The target model.
    pub fn model(&self) -> &Arc<Qwen2<B>> {
        &self.model
    }

    /// Committed cache lengths per active sequence (pending token excluded).
    pub fn lens(&self) -> Vec<usize> {
        self.cache
            .as_ref()
            .map(|c| c.lens().to_vec())
            .unwrap_or_default()
    }

    /// The cache and pending tokens of a commit (the policy's commit is the caller's): each
    /// row truncated to its verification's start plus its accepted drafts and the bonus
    /// token, a held row (`hold[s]`) back to its verification's start with its pending token
    /// still pending, the others' next tokens pending.
    ///
    /// # Errors
    /// [`dustin_core::CoreError::Model`] for a commit before any verification;
    /// [`dustin_core::CoreError::InvalidInput`] for `accepted`, `next` or `hold` of another
    /// length than the batch.
    fn commit_rows(
        &mut self,
        accepted: &[usize],
        next: &[TokenId],
        hold: &[bool],
    ) -> dustin_core::Result<()> {
        let base = self.base.clone();
        let cache = self.cache()?;
        let b = cache.batch();
        if base.len() != b {
            return Err(dustin_core::CoreError::Model(
                "commit before a verification".into(),
            ));
        }
        if accepted.len() != b || next.len() != b || hold.len() != b {
            return Err(dustin_core::CoreError::invalid(
                "accepted, next, hold",
                format!("{b} of each"),
                format!("{}, {}, {}", accepted.len(), next.len(), hold.len()),
            ));
        }
        for s in 0..b {
            let keep = if hold[s] { 0 } else { accepted[s] + 1 };
            cache.truncate(s, base[s] + keep)?;
        }
        for s in (0..b).filter(|&s| !hold[s]) {
            self.pending[s] = next[s];
        }
        self.publish();
        Ok(())
    }

    fn cache(&mut self) -> dustin_core::Result<&mut DenseKvCache<B>> {
        self.cache
            .as_mut()
            .ok_or_else(|| dustin_core::CoreError::Model("verifier used before prefill".into()))
    }
}

impl<B: KernelOps, P: SelectionPolicy<B>> Verifier<B> for ModelVerifier<B, P> {
    fn prefill(&mut self, prompts: &[Vec<TokenId>]) -> dustin_core::Result<Tensor<B, 2>> {
        if let Some((cache, last)) = self.prefilled.take() {
            let lens: Vec<usize> = prompts.iter().map(Vec::len).collect();
            if cache.lens() != lens.as_slice() || last.dims()[0] != lens.len() {
                return Err(dustin_core::CoreError::invalid(
                    "prompts",
                    format!("the prefilled cache's lengths {:?}", cache.lens()),
                    format!("{lens:?}"),
                ));
            }
            self.cache = Some(cache);
            self.pending.clear();
            self.publish();
            return Ok(last);
        }
        self.policy
            .reset(prompts.len(), self.model.config.num_hidden_layers);
        let capacity = prompts.iter().map(Vec::len).max().unwrap_or(0) + self.extra_capacity;
        let (cache, last, _) = prefill_from(
            &self.model,
            prompts,
            self.prefix.take(),
            capacity,
            None,
            &mut self.policy,
            self.prefill_chunk,
            false,
        )?;
        self.cache = Some(cache);
        self.pending.clear();
        self.publish();
        Ok(last)
    }

    fn set_pending(&mut self, next: &[TokenId]) -> dustin_core::Result<()> {
        let b = self.cache()?.batch();
        if next.len() != b {
            return Err(dustin_core::CoreError::invalid(
                "next",
                format!("{b} tokens"),
                next.len(),
            ));
        }
        self.pending = next.to_vec();
        Ok(())
    }

    fn verify(&mut self, ctx: &VerifyCtx<'_, B>) -> dustin_core::Result<Verification<B>> {
        let p = ctx.proposal;
        if p.tokens.len() != self.pending.len() {
            return Err(dustin_core::CoreError::invalid(
                "proposal",
                format!("{} sequences", self.pending.len()),
                p.tokens.len(),
            ));
        }
        let tokens: Vec<Vec<TokenId>> = self
            .pending
            .iter()
            .zip(&p.tokens)
            .map(|(&t, d)| std::iter::once(t).chain(d.iter().copied()).collect())
            .collect();
        if let Some(la) = &p.lookahead {
            if self.policy.wants_lookahead() {
                self.policy.observe_lookahead(la);
            }
        }
        self.policy.begin_verify(ctx.iteration);
        let est_before = self.policy.estimation_reads();
        let model = self.model.clone();
        let mut cache = self
            .cache
            .take()
            .ok_or_else(|| dustin_core::CoreError::Model("verifier used before prefill".into()))?;
        self.base = cache.lens().to_vec();
        let res = model.forward(
            &tokens,
            &mut cache,
            &mut self.policy,
            ForwardOpts {
                phase: Phase::Decode,
                logits: LogitsMode::All,
                layers: None,
            },
        );
        self.cache = Some(cache);
        let out = res?;
        let logits = out.logits.ok_or_else(|| {
            dustin_core::CoreError::Model("target forward returned no logits".into())
        })?;
        let [b, n, v] = logits.dims();
        let logits = if self.vocab < v {
            logits.slice([0..b, 0..n, 0..self.vocab])
        } else {
            logits
        };
        self.last_reads = (out.ctx_reads.clone(), out.ctx_dense.clone());
        let kv_read_fraction = out
            .ctx_reads
            .iter()
            .zip(&out.ctx_dense)
            .map(|(&r, &d)| if d == 0 { 1.0 } else { r as f64 / d as f64 })
            .collect();
        let est_after = self.policy.estimation_reads();
        let estimation_read_fraction = out
            .ctx_dense
            .iter()
            .enumerate()
            .map(|(s, &d)| {
                let e = est_after.get(s).copied().unwrap_or(0.0)
                    - est_before.get(s).copied().unwrap_or(0.0);
                if d == 0 {
                    0.0
                } else {
                    e / d as f64
                }
            })
            .collect();
        Ok(Verification {
            logits,
            kv_read_fraction,
            estimation_read_fraction,
        })
    }

    fn commit(&mut self, accepted: &[usize], next: &[TokenId]) -> dustin_core::Result<()> {
        let hold = vec![false; accepted.len()];
        self.commit_rows(accepted, next, &hold)?;
        self.policy.commit(accepted)
    }

    fn can_hold(&self) -> bool {
        true
    }

    fn commit_holding(
        &mut self,
        accepted: &[usize],
        next: &[TokenId],
        hold: &[bool],
    ) -> dustin_core::Result<()> {
        self.commit_rows(accepted, next, hold)?;
        self.policy.commit_holding(accepted, hold)
    }

    fn retain(&mut self, keep: &[usize]) -> dustin_core::Result<()> {
        // the published clone would make the compaction copy every layer (copy on write)
        if let Some(kv) = &self.share {
            kv.clear();
        }
        let res = self.cache()?.retain(keep);
        if res.is_err() && self.cache()?.batch() != keep.len() {
            // refused before anything changed
            self.publish();
            return res;
        }
        // kept (a cache that failed after changing stays whole: the rows follow it)
        self.pending = keep.iter().map(|&k| self.pending[k]).collect();
        self.base = keep
            .iter()
            .filter_map(|&k| self.base.get(k).copied())
            .collect();
        self.policy.retain(keep);
        self.publish();
        res
    }

    fn vocab_size(&self) -> usize {
        self.vocab
    }

    fn wants_lookahead(&self) -> bool {
        self.policy.wants_lookahead()
    }
}

impl<B: KernelOps, P: JoinPolicy<B>> JoinVerifier<B> for ModelVerifier<B, P> {
    fn begin_row(
        &mut self,
        seq: usize,
        prompt: &[TokenId],
        room: usize,
    ) -> dustin_core::Result<()> {
        if self.joining.iter().any(|r| r.seq == seq) {
            return Err(dustin_core::CoreError::invalid(
                "seq",
                "an id not already joining",
                seq,
            ));
        }
        let capacity = (prompt.len() + room).max(self.cache.as_ref().map_or(0, |c| c.capacity()));
        let mut hook = self.policy.fresh();
        hook.reset(1, self.model.config.num_hidden_layers);
        let row = RowPrefill::new(&self.model, seq, prompt, capacity, None, hook)?;
        self.joining.push(row);
        Ok(())
    }

    fn prefill_row(&mut self, seq: usize, end: usize) -> dustin_core::Result<Option<Tensor<B, 2>>> {
        let i = find_row(&self.joining, seq)?;
        let model = self.model.clone();
        self.joining[i].run(&model, end, None)
    }

    fn join_row(&mut self, seq: usize, first: TokenId) -> dustin_core::Result<()> {
        let i = find_row(&self.joining, seq)?;
        if !self.joining[i].finished() {
            return Err(dustin_core::CoreError::invalid(
                "seq",
                "a sequence whose prompt is prefilled",
                seq,
            ));
        }
        let row = self.joining.remove(i);
        let cache = stack_row(self.cache.take(), row.cache)?;
        self.cache = Some(cache);
        self.policy.append(row.hook)?;
        self.pending.push(first);
        self.publish();
        Ok(())
    }

    fn drop_row(&mut self, seq: usize) {
        self.joining.retain(|r| r.seq != seq);
    }

    fn clear_batch(&mut self) {
        self.cache = None;
        self.pending.clear();
        self.base.clear();
        self.policy.reset(0, self.model.config.num_hidden_layers);
    }
}
