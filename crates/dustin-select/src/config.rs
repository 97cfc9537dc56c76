use dustin_core::{CoreError, Result};
use serde::{Deserialize, Serialize};

/// What every selector shares: the token budget and the always-kept positions, and how long a
/// selection is reused.
///
/// Read it from JSON or TOML (`#[serde(default)]`: missing fields take the defaults below),
/// then [`validate`](Self::validate) it (the registry and [`Selector::new`](crate::Selector::new)
/// do).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SelectConfig {
    /// Context tokens kept per layer and KV head (sinks and window included).
    /// Default 2048: a budget both SnapKV (Li et al. 2024) and Quest (Tang et al. 2024)
    /// evaluate at long context; our choice among theirs.
    pub budget: usize,
    /// First positions always kept (attention sinks). Default 4: StreamingLLM
    /// (Xiao et al. 2023) keeps 4 initial tokens.
    pub n_sink: usize,
    /// Most recent context positions always kept. Default 64: our choice (StreamingLLM's
    /// recent window is what remains of its cache; 64 covers a few speculative iterations of
    /// accepted tokens plus SnapKV's 32-token observation window twice).
    pub window: usize,
    /// Verifications a selection is reused for (the multi-step verification window of
    /// DESIGN.md): 1 = recompute at every verification. Default 1 so that every baseline is
    /// measured at its own rule; the `dustin` estimator's recommended config uses 2
    /// (see [`crate::estimators::dustin::recommended_select_config`]).
    pub refresh: usize,
    /// Recompute early when an iteration's mean accepted count (over the batch) falls below
    /// this fraction of the running mean since prefill, by more than `accept_drop_sigmas`
    /// standard errors of a batch mean (so that, at a low mean acceptance, an iteration that
    /// accepted nothing by chance is not a drop).
    /// Default `None` (off): our choice, so that `refresh` alone decides unless asked.
    pub refresh_on_accept_drop: Option<f64>,
    /// How many standard errors of a batch mean the fall of `refresh_on_accept_drop` must
    /// also exceed (the per-sequence standard deviation of the accepted counts seen so far
    /// over the square root of the batch). Default [`crate::ACCEPT_DROP_SIGMAS`] (3); 0 is the
    /// rule without the noise test.
    pub accept_drop_sigmas: f64,
    /// Whether the layers that reuse their selection in a verification are re-ranked in one
    /// call when the estimator can ([`crate::Selector`]: one scoring pass and one top-k over
    /// the layers' stacked scores, the same selections as layer by layer). Default `true`;
    /// `false` runs each layer in its turn (for comparisons).
    pub batched_reuse: bool,
}

impl Default for SelectConfig {
    fn default() -> Self {
        Self {
            budget: 2048,
            n_sink: 4,
            window: 64,
            refresh: 1,
            refresh_on_accept_drop: None,
            accept_drop_sigmas: crate::ACCEPT_DROP_SIGMAS,
            batched_reuse: true,
        }
    }
}

impl SelectConfig {
    /// A config with `budget` and the other fields at their defaults.
    pub fn with_budget(budget: usize) -> Self {
        Self {
            budget,
            ..Self::default()
        }
    }

    /// Checks the fields.
    ///
    /// # Errors
    /// [`CoreError::InvalidInput`] naming `budget` when `budget <= n_sink + window` (the
    /// top-k step would have nothing to choose), `refresh` when it is 0, and
    /// `refresh_on_accept_drop` outside `(0, 1]`, and `accept_drop_sigmas` negative or not
    /// finite.
    pub fn validate(&self) -> Result<()> {
        if self.budget <= self.keep().always_kept() {
            return Err(CoreError::invalid(
                "budget",
                format!(
                    "more than n_sink + window = {} + {} = {}",
                    self.n_sink,
                    self.window,
                    self.keep().always_kept_exact()
                ),
                self.budget,
            ));
        }
        if self.refresh == 0 {
            return Err(CoreError::invalid(
                "refresh",
                "at least 1 (1 = recompute every verification)",
                0,
            ));
        }
        if let Some(f) = self.refresh_on_accept_drop {
            if !(f > 0.0 && f <= 1.0) {
                return Err(CoreError::invalid(
                    "refresh_on_accept_drop",
                    "a fraction in (0, 1]",
                    f,
                ));
            }
        }
        if !(self.accept_drop_sigmas.is_finite() && self.accept_drop_sigmas >= 0.0) {
            return Err(CoreError::invalid(
                "accept_drop_sigmas",
                "a finite number >= 0 (standard errors)",
                self.accept_drop_sigmas,
            ));
        }
        Ok(())
    }

    /// The keep rule of the shared top-k step for this config's budget.
    pub fn keep(&self) -> KeepRule {
        self.keep_with_budget(self.budget)
    }

    /// The keep rule with another budget (per-layer budgets of [`crate::Pyramid`]).
    pub fn keep_with_budget(&self, budget: usize) -> KeepRule {
        KeepRule {
            budget,
            n_sink: self.n_sink,
            window: self.window,
        }
    }
}

/// What the shared top-k step ([`crate::select_top_k`]) keeps per sequence and KV head:
/// positions `[0, n_sink)` and `[ctx - window, ctx)` always, then the best scores up to
/// `budget` tokens in all. The kernels' own type, so a rule goes to
/// [`KernelOps::top_k_positions`](dustin_kernels::SelectionOps::top_k_positions) as it is.
pub use dustin_kernels::Keep as KeepRule;
