//! The runs of a LongBench sample: (selector, budget) pairs, their store keys and records,
//! the shared prefill and one speculative generation from it.

use std::time::Instant;

use burn_tensor::backend::Backend;
use dustin_core::TokenId;
use dustin_kernels::KernelOps;
use dustin_qwen::generate::{prefill_from, DEFAULT_PREFILL_CHUNK};
use dustin_qwen::Tokenizer;
use dustin_select::BudgetedPolicy;
use serde::{Deserialize, Serialize};

use super::LongBenchOptions;
use crate::harness::engine::{EvalPair, FanOut, Prefilled};
use crate::harness::selectors::{fnv, lookahead_key, BudgetSpec, SelectorSpec};
use crate::harness::HarnessError;

/// One (selector, budget) of the run; `budget` is `None` for dense (full attention).
#[derive(Debug, Clone)]
pub(super) struct RunSpec {
    pub(super) sel: SelectorSpec,
    pub(super) budget_label: String,
    pub(super) budget: Option<usize>,
}

impl RunSpec {
    pub(super) fn budget_key(&self) -> String {
        self.budget.map_or("full".into(), |b| b.to_string())
    }

    /// The policy at context `ctx` (dense: a budget of the whole context); a refused budget
    /// names `--ctx` and the budget it came from (a fraction, or a count clamped to `ctx`).
    pub(super) fn build<B: KernelOps>(
        &self,
        ctx: usize,
    ) -> Result<Box<dyn BudgetedPolicy<B>>, HarnessError> {
        let k = self.budget.unwrap_or(ctx);
        self.sel.build::<B>(k).map_err(|e| match e {
            HarnessError::Usage(m) => HarnessError::Usage(format!(
                "--ctx {ctx}, budget {} ({k} tokens): {m}",
                self.budget_label
            )),
            e => e,
        })
    }
}

/// Selectors x budgets, `dense` once.
pub(super) fn run_specs(
    sels: &[SelectorSpec],
    budgets: &[(String, BudgetSpec)],
    ctx: usize,
) -> Result<Vec<RunSpec>, HarnessError> {
    let mut out = Vec::new();
    for s in sels {
        if s.spec == "dense" {
            out.push(RunSpec {
                sel: s.clone(),
                budget_label: "full".into(),
                budget: None,
            });
            continue;
        }
        for (label, b) in budgets {
            let k = b.tokens(ctx);
            if k == 0 {
                return Err(HarnessError::Usage(format!(
                    "--budget {label}: 0 tokens of a {ctx}-token context"
                )));
            }
            out.push(RunSpec {
                sel: s.clone(),
                budget_label: label.clone(),
                budget: Some(k),
            });
        }
    }
    Ok(out)
}

/// One finished (sample, selector, budget) run, as stored in results.jsonl.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Row {
    pub(super) task: String,
    pub(super) id: String,
    pub(super) ctx: usize,
    /// Tokens of the LongBench prompt before truncation.
    pub(super) prompt_tokens: usize,
    /// Tokens the model read (truncated, chat wrapper included).
    pub(super) input_tokens: usize,
    pub(super) chat: bool,
    /// Context tokens per layer and KV head; `None`: dense.
    pub(super) budget: Option<usize>,
    pub(super) budget_label: String,
    pub(super) selector: String,
    pub(super) spec: String,
    pub(super) gamma: usize,
    /// The generated answer (special tokens skipped).
    pub(super) prediction: String,
    /// LongBench's sample score in [0, 1] (best over the gold answers).
    pub(super) score: f64,
    /// Generated tokens (EOS included).
    pub(super) new_tokens: usize,
    /// Why generation stopped (eos, length).
    pub(super) finish: String,
    /// Mean acceptance length (accepted drafts + 1 per verification).
    pub(super) accept_len: f64,
    /// Verifications.
    pub(super) iterations: usize,
    /// Mean KV fraction read per verification by the target's attention.
    pub(super) kv_selected: f64,
    /// Mean KV fraction read per verification by the selector's estimation.
    pub(super) kv_estimation: f64,
    /// Seconds of the speculative run (first token from the shared prefill excluded).
    pub(super) secs: f64,
    /// Seconds of the sample's shared prefill (target and draft), paid once per sample.
    pub(super) secs_prefill: f64,
    /// Where the row ran ([`KernelBackend::device_description`](dustin_kernels::KernelBackend::device_description));
    /// empty in rows stored before it was kept.
    #[serde(default)]
    pub(super) device: String,
}

/// What the model and the run settings contribute to every key.
pub(super) struct KeyBase<'a> {
    pub(super) args: &'a LongBenchOptions,
    pub(super) ctx: usize,
    pub(super) model: String,
    /// `false`, or the chat wrapper's [`Chat::key`].
    pub(super) chat: String,
}

impl KeyBase<'_> {
    pub(super) fn key(
        &self,
        task: &str,
        id: &str,
        run: &RunSpec,
        max_new: usize,
    ) -> Result<String, HarnessError> {
        let budget = run.budget_key();
        let fp = run.sel.fingerprint(run.budget.unwrap_or(self.ctx))?;
        let la = lookahead_key(&self.args.lookahead_layers);
        let config = format!(
            "{fp}|model={}|draft={}{la}|g={}|chat={}|max_new={max_new}",
            self.model, self.args.models.draft, self.args.gamma, self.chat
        );
        Ok(format!(
            "{task}|{id}|ctx={}|budget={budget}|{}|{:016x}",
            self.ctx,
            run.sel.label,
            fnv(&config)
        ))
    }
}

/// The loaded models and settings of a run.
pub(super) struct Cx<B: Backend> {
    pub(super) pair: EvalPair<B>,
    pub(super) tok: Tokenizer,
    pub(super) ctx: usize,
    pub(super) gamma: usize,
}

/// What a sample's runs share: the dense caches after the prompt and the target's last
/// logits (each pending run's policy has observed the prompt), and the prefill's seconds.
pub(super) struct SharedPrefill<B: Backend> {
    pub(super) start: Prefilled<B>,
    pub(super) secs: f64,
}

/// One dense prefill of `ids` whose chunks every policy observes (as its own prefill would
/// show them), then the draft's cache.
pub(super) fn shared_prefill<B: KernelOps>(
    cx: &Cx<B>,
    ids: &[TokenId],
    policies: &mut [Box<dyn BudgetedPolicy<B>>],
) -> Result<SharedPrefill<B>, HarnessError> {
    let t = Instant::now();
    let layers = cx.pair.target.config.num_hidden_layers;
    for p in policies.iter_mut() {
        p.reset(1, layers);
    }
    let mut fan = FanOut {
        policies: policies.iter_mut().collect(),
    };
    let (cache, last, _) = prefill_from(
        &cx.pair.target,
        &[ids.to_vec()],
        None,
        cx.ctx,
        None,
        &mut fan,
        DEFAULT_PREFILL_CHUNK,
        false,
    )?;
    let draft_cache = cx
        .pair
        .draft_cache(&cache, ids, cx.ctx, DEFAULT_PREFILL_CHUNK)?;
    Ok(SharedPrefill {
        start: Prefilled {
            cache,
            draft_cache,
            last,
        },
        secs: t.elapsed().as_secs_f64(),
    })
}

/// The outcome of one speculative run.
pub(super) struct Generated {
    pub(super) tokens: Vec<TokenId>,
    pub(super) finish: String,
    pub(super) accept_len: f64,
    pub(super) iterations: usize,
    pub(super) kv_selected: f64,
    pub(super) kv_estimation: f64,
    pub(super) secs: f64,
}

/// Greedy speculative generation of up to `max_new` tokens from the shared prefill, the
/// target verifying through `policy`.
pub(super) fn generate_from<B: KernelOps>(
    cx: &Cx<B>,
    sh: &SharedPrefill<B>,
    ids: &[TokenId],
    policy: Box<dyn BudgetedPolicy<B>>,
    max_new: usize,
) -> Result<Generated, HarnessError> {
    let t = Instant::now();
    let o = cx.pair.speculate(
        &sh.start,
        ids,
        policy,
        cx.gamma,
        max_new,
        cx.tok.eos_ids.clone(),
    )?;
    let secs = t.elapsed().as_secs_f64();
    let s = &o.summary;
    Ok(Generated {
        tokens: o.tokens.into_iter().next().unwrap_or_default(),
        finish: o
            .finish
            .first()
            .map_or("length", |f| f.as_str())
            .to_string(),
        accept_len: s.mean_acceptance_length,
        iterations: s.iterations,
        kv_selected: s.mean_kv_read_fraction,
        kv_estimation: s.mean_estimation_read_fraction,
        secs,
    })
}

impl Row {
    pub(super) fn budget_key(&self) -> String {
        self.budget.map_or("full".into(), |b| b.to_string())
    }
}

/// The first `n` characters of `s`.
pub(super) fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push_str("...");
    }
    out
}
