//! A draft/target pair run in several decoding modes from one shared prefill per prompt: the
//! rows of `dustin demo` and the cells of the acceptance harness.
//!
//! Both models prefill the prompt minus its last chunk once ([`SharedPrefill::new`]); each
//! mode clones those caches and runs the last chunk itself, so its selection policy sees the
//! end of the prompt (SnapKV's observation window, Dustin's calibration) as in a full prefill.
//! Decoding then goes through the engine itself: [`ModelDrafter`], [`ModelVerifier`] and
//! [`SpeculativeDecoder`] (or [`autoregressive`] with the target alone).

use std::sync::Arc;
use std::time::Instant;

use dustin_core::{DenseHook, KvStore, SamplingConfig, SelectionPolicy};
use dustin_kernels::KernelOps;
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::DEFAULT_PREFILL_CHUNK;
use dustin_qwen::{Qwen2, Tokenizer};
use dustin_spec::{
    autoregressive, LookaheadConfig, LookaheadLayers, ModelDrafter, ModelVerifier, SpecConfig,
    SpecOutput, SpeculativeDecoder,
};

use super::HarnessError;

/// A target and its separate draft model (same tokenizer), built on one device.
pub struct Pair<B: KernelOps> {
    /// The target model.
    pub target: Arc<Qwen2<B>>,
    /// The draft model.
    pub draft: Arc<Qwen2<B>>,
    /// The target's tokenizer (the draft's has the same vocabulary).
    pub tok: Tokenizer,
}

/// One decoding mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The target alone, one token per forward pass, dense attention.
    Autoregressive,
    /// The draft proposes `gamma` tokens; the target verifies them against the KV entries
    /// that `selector` keeps (`dense`: all of them).
    Speculative {
        /// Registry name of the selection policy (`dustin_select::build`).
        selector: String,
        /// Context tokens kept per layer and KV head by the target's verification.
        budget: usize,
        /// Tokens the draft attends to per layer and KV head (0: dense drafting).
        draft_budget: usize,
    },
}

impl Mode {
    /// A short label: `autoregressive`, `dense`, or `<selector>@<budget>` (with
    /// `+draft<draft budget>` when the draft reads a selection too).
    pub fn label(&self) -> String {
        match self {
            Mode::Autoregressive => "autoregressive".into(),
            Mode::Speculative {
                selector,
                budget,
                draft_budget,
            } => {
                let mut s = if selector == "dense" {
                    "dense".to_string()
                } else {
                    format!("{selector}@{budget}")
                };
                if *draft_budget > 0 {
                    s += &format!("+draft{draft_budget}");
                }
                s
            }
        }
    }
}

/// What every mode shares: gamma, length, sampling and the lookahead layers.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Draft tokens per iteration.
    pub gamma: usize,
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// Sampling rule of target and draft (greedy at temperature 0).
    pub sampling: SamplingConfig,
    /// Seed of all draws.
    pub seed: u64,
    /// Draft layers whose attention makes the lookahead (`LookaheadLayers`'s syntax).
    pub lookahead_layers: String,
}

impl RunConfig {
    /// KV capacity each cache needs beyond the prompt: the generated tokens plus two rounds
    /// of drafts (a verification writes `gamma + 1` rows before the rollback).
    pub fn extra(&self) -> usize {
        self.max_new_tokens.saturating_add(2 * (self.gamma + 2))
    }
}

/// The (target, draft) caches of one prompt prefix.
type CachePair<B> = (DenseKvCache<B>, DenseKvCache<B>);

/// The dense caches of both models over the prompt minus its last chunk, cloned by each mode.
pub struct SharedPrefill<B: KernelOps> {
    /// The prompt's token ids.
    pub ids: Vec<u32>,
    /// The target's cache of `ids[..ids.len() - tail]` (`None` when the prompt is one chunk).
    target: Option<DenseKvCache<B>>,
    /// The draft's cache of the same tokens.
    draft: Option<DenseKvCache<B>>,
    /// Both caches extended to all but the last prompt token, made on first use by a mode
    /// whose verification is dense (no selection policy observes the prompt's end).
    dense: std::cell::OnceCell<CachePair<B>>,
    /// Prefill capacity of the caches (prompt + extra positions).
    cap: usize,
    /// Seconds the target's shared prefill took.
    pub target_secs: f64,
    /// Seconds the draft's shared prefill took.
    pub draft_secs: f64,
}

impl<B: KernelOps> SharedPrefill<B> {
    /// Prefills both models on `ids` minus its last chunk (at most
    /// [`DEFAULT_PREFILL_CHUNK`] tokens, always at least one), with room for `extra` more
    /// positions.
    ///
    /// # Errors
    /// [`HarnessError::Usage`] for an empty prompt; model errors (memory, prompt longer than the
    /// model's context).
    pub fn new(pair: &Pair<B>, ids: Vec<u32>, extra: usize) -> Result<Self, HarnessError> {
        Self::with_tail(pair, ids, extra, DEFAULT_PREFILL_CHUNK)
    }

    /// As [`SharedPrefill::new`], leaving the last `tail` prompt tokens (at least one) to
    /// each mode.
    ///
    /// # Errors
    /// As [`SharedPrefill::new`].
    pub fn with_tail(
        pair: &Pair<B>,
        ids: Vec<u32>,
        extra: usize,
        tail: usize,
    ) -> Result<Self, HarnessError> {
        if ids.is_empty() {
            return Err(HarnessError::Usage("the prompt is empty".into()));
        }
        let tail = tail.clamp(1, ids.len());
        let head = ids.len() - tail;
        let cap = ids.len().saturating_add(extra);
        let run = |m: &Qwen2<B>| -> Result<(Option<DenseKvCache<B>>, f64), HarnessError> {
            if head == 0 {
                return Ok((None, 0.0));
            }
            let t = Instant::now();
            let (c, _, _) = dustin_qwen::generate::prefill(
                m,
                &[ids[..head].to_vec()],
                cap,
                None,
                &mut DenseHook,
                DEFAULT_PREFILL_CHUNK,
                false,
            )?;
            Ok((Some(c), t.elapsed().as_secs_f64()))
        };
        let (target, target_secs) = run(&pair.target)?;
        let (draft, draft_secs) = run(&pair.draft)?;
        Ok(Self {
            ids,
            target,
            draft,
            dense: std::cell::OnceCell::new(),
            cap,
            target_secs,
            draft_secs,
        })
    }

    /// The (target, draft) caches of all but the last prompt token, for dense modes: the
    /// shared caches extended once by the rest of the prompt but its last token, then kept
    /// for every later dense mode. `None` for a prompt of one token.
    ///
    /// # Errors
    /// Model errors of the extension.
    fn dense_prefix(&self, pair: &Pair<B>) -> Result<Option<&CachePair<B>>, HarnessError> {
        if self.ids.len() < 2 {
            return Ok(None);
        }
        if let Some(d) = self.dense.get() {
            return Ok(Some(d));
        }
        let upto = [self.ids[..self.ids.len() - 1].to_vec()];
        let extend =
            |m: &Qwen2<B>, c: &Option<DenseKvCache<B>>| -> Result<DenseKvCache<B>, HarnessError> {
                let (c, _, _) = dustin_qwen::generate::prefill_from(
                    m,
                    &upto,
                    c.as_ref().map(|c| vec![c.clone()]),
                    self.cap,
                    None,
                    &mut DenseHook,
                    DEFAULT_PREFILL_CHUNK,
                    false,
                )?;
                Ok(c)
            };
        let made = match (&self.target, &self.draft) {
            (Some(t), Some(d)) if self.shared_tokens() == self.ids.len() - 1 => {
                (t.clone(), d.clone())
            }
            _ => (
                extend(&pair.target, &self.target)?,
                extend(&pair.draft, &self.draft)?,
            ),
        };
        Ok(Some(self.dense.get_or_init(|| made)))
    }

    /// Tokens of the shared part.
    pub fn shared_tokens(&self) -> usize {
        self.target.as_ref().map_or(0, |c| c.lens()[0])
    }
}

/// Builds the selection policy of a speculative mode: Dustin's recommended configuration
/// for `dustin`, the registry's defaults at `budget` otherwise.
///
/// Dense verification reads every entry whatever the budget, so its budget is raised to
/// the smallest one the selector config accepts (a prompt may be shorter than the sinks and
/// window).
///
/// # Errors
/// [`HarnessError::Usage`] for an unknown selector name or a budget the selector refuses.
pub fn policy<B: KernelOps>(
    selector: &str,
    budget: usize,
) -> Result<Box<dyn SelectionPolicy<B>>, HarnessError> {
    check_selector(selector)?;
    let budget = if selector.trim() == "dense" {
        let k = dustin_select::SelectConfig::default().keep();
        budget.max(k.always_kept() + 1)
    } else {
        budget
    };
    dustin_select::build_with::<B>(selector, &select_config(selector, budget), None)
        .map_err(|e| HarnessError::Usage(format!("selector {selector}: {e}")))
}

/// The selector config a policy of `selector` starts from at `budget`: Dustin's recommended
/// one for `dustin` (`recommended_select_config`), the defaults at `budget` for every other
/// name.
pub fn select_config(selector: &str, budget: usize) -> dustin_select::SelectConfig {
    if selector == "dustin" {
        dustin_select::estimators::dustin::recommended_select_config(budget)
    } else {
        dustin_select::SelectConfig::with_budget(budget)
    }
}

/// The draft's selection for a draft budget (`--draft-budget`): `None` for 0 (dense
/// drafting), else per-layer ranking with the selectors' default sinks and window.
///
/// # Errors
/// [`HarnessError::Usage`] naming `--draft-budget` when it leaves no room beside the sinks
/// and window.
pub fn draft_selection(budget: usize) -> Result<Option<dustin_spec::DraftSelection>, HarnessError> {
    if budget == 0 {
        return Ok(None);
    }
    let k = dustin_select::SelectConfig::default().keep();
    if budget <= k.always_kept() {
        return Err(HarnessError::Usage(format!(
            "--draft-budget {budget}: expected more than the sinks and window ({} + {} = {}), or 0 for a dense draft",
            k.n_sink,
            k.window,
            k.always_kept()
        )));
    }
    Ok(Some(dustin_spec::DraftSelection::new(
        dustin_select::KeepRule { budget, ..k },
    )))
}

/// Checks that `selector` is a name of the selection registry (`dense`, `streaming`, ...,
/// or `pyramid(<name>)`), without building it.
///
/// # Errors
/// [`HarnessError::Usage`] naming `--selectors` and the value, listing the known names.
pub fn check_selector(selector: &str) -> Result<(), HarnessError> {
    dustin_select::registry::resolved_config(selector, None)
        .map(|_| ())
        .map_err(|e| HarnessError::Usage(format!("--selectors {selector:?}: {e}")))
}

/// Runs one mode from `prefill`, calling `on_tokens` with each sequence's new tokens as they
/// are emitted.
///
/// # Errors
/// [`HarnessError::Usage`] for a bad selector, lookahead layers or draft budget; engine errors.
pub fn run_mode<B: KernelOps>(
    pair: &Pair<B>,
    prefill: &SharedPrefill<B>,
    mode: &Mode,
    cfg: &RunConfig,
    on_tokens: &mut dyn FnMut(usize, &[u32]),
) -> Result<SpecOutput, HarnessError> {
    let extra = cfg.extra();
    let vocab = pair.tok.vocab_size().min(pair.target.config.vocab_size);
    let spec = SpecConfig {
        gamma: cfg.gamma,
        max_new_tokens: cfg.max_new_tokens,
        sampling: cfg.sampling,
        seed: cfg.seed,
        eos: pair.tok.eos_ids.clone(),
        stop_strings: Vec::new(),
    };
    let prompts = vec![prefill.ids.clone()];
    match mode {
        Mode::Autoregressive => {
            let mut v = ModelVerifier::new(pair.target.clone(), DenseHook, extra, vocab);
            if let Some((t, _)) = prefill.dense_prefix(pair)? {
                v = v.with_prefix(vec![t.clone()]);
            }
            Ok(autoregressive(
                &mut v,
                &prompts,
                &spec,
                Some(&pair.tok),
                on_tokens,
            )?)
        }
        Mode::Speculative {
            selector,
            budget,
            draft_budget,
        } => {
            let la_bad = |e: dustin_spec::SpecError| {
                HarnessError::Usage(format!("lookahead layers {}: {e}", cfg.lookahead_layers))
            };
            let layers = cfg
                .lookahead_layers
                .parse::<LookaheadLayers>()
                .map_err(la_bad)?
                .resolve(pair.draft.config.num_hidden_layers)
                .map_err(la_bad)?;
            let mut drafter = ModelDrafter::new(pair.draft.clone(), None, extra)
                .with_lookahead(LookaheadConfig {
                    layers,
                    ..Default::default()
                })
                .with_draft_selection(draft_selection(*draft_budget)?)
                .map_err(|e| HarnessError::Usage(format!("draft budget {draft_budget}: {e}")))?;
            let mut verifier = ModelVerifier::new(
                pair.target.clone(),
                policy::<B>(selector, *budget)?,
                extra,
                vocab,
            );
            let prefix = if selector == "dense" {
                prefill.dense_prefix(pair)?.map(|(t, d)| (t, d))
            } else {
                prefill.target.as_ref().zip(prefill.draft.as_ref())
            };
            if let Some((t, d)) = prefix {
                drafter = drafter.with_prefix(vec![d.clone()]);
                verifier = verifier.with_prefix(vec![t.clone()]);
            }
            let mut dec = SpeculativeDecoder::new(drafter, verifier);
            Ok(dec.generate(&prompts, &spec, Some(&pair.tok), on_tokens)?)
        }
    }
}
