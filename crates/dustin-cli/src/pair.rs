//! A draft/target pair run in several decoding modes from one shared prefill per prompt (the
//! demo's rows, the cells of `dustin eval acceptance`): the modes and the run are
//! `dustin_eval::harness::pair`'s, re-exported here; this module opens the pair's files by
//! model name or path ([`PairFiles`]).

use std::sync::Arc;

use dustin_kernels::KernelOps;
use dustin_qwen::{ModelFiles, Tokenizer};

pub use dustin_eval::harness::pair::{
    check_selector, policy, run_mode, Mode, Pair, RunConfig, SharedPrefill,
};

use crate::generate::{parse_draft, DraftSpec, DraftVocab, SubstituteSpec};
use crate::CliError;

/// The files of a target and its draft, opened by name or path
/// ([`crate::models::resolve_model`], fetching named models that are not cached), with a
/// shared vocabulary checked; [`PairFiles::build`] loads the weights. The draft may also be
/// the target's own SubSpec substitute (`substitute[:bits=B][:group=G][:layers=L]`, see
/// `generate --draft`), built from the target's weights.
pub struct PairFiles {
    target: ModelFiles,
    draft: DraftFiles,
}

enum DraftFiles {
    Model(Box<ModelFiles>),
    Substitute(SubstituteSpec),
}

impl PairFiles {
    /// Opens both models' files (config, tokenizer, weight index; no weights read yet).
    ///
    /// # Errors
    /// Fetch and model errors; [`CliError::Usage`] when the tokenizers differ or the draft is
    /// an early-exit self-draft (`self:layers=N`, which reads the target's own cache).
    pub fn open(target: &str, draft: &str) -> Result<Self, CliError> {
        let target = ModelFiles::open(&crate::models::resolve_model(target)?)?;
        let draft = match parse_draft(draft)? {
            DraftSpec::Model(_) => {
                let d = ModelFiles::open(&crate::models::resolve_model(draft)?)?;
                crate::generate::check_vocab(&target.tokenizer, &d.tokenizer)?;
                DraftFiles::Model(Box::new(d))
            }
            DraftSpec::Substitute(s) if !s.target_kv => DraftFiles::Substitute(s),
            _ => {
                return Err(CliError::Usage(format!(
                    "--draft {draft}: expected a model (name or path) or a substitute with its own KV cache"
                )))
            }
        };
        Ok(Self { target, draft })
    }

    /// The target's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.target.tokenizer
    }

    /// The positions both models take (`max_position_embeddings`, the smaller of the two).
    pub fn max_positions(&self) -> usize {
        let t = self.target.config.max_position_embeddings;
        match &self.draft {
            DraftFiles::Model(d) => t.min(d.config.max_position_embeddings),
            DraftFiles::Substitute(_) => t,
        }
    }

    /// Loads both models on `dev` with RoPE tables for `positions` positions, their weights
    /// as `weights` says ([`crate::models::WeightsArg::format`]), a separate draft's LM head
    /// over `draft_vocab` ([`crate::generate::with_draft_vocab`]).
    ///
    /// # Errors
    /// Model errors (unsupported tensor types, memory); a substitute's bad settings.
    pub fn build<B: KernelOps>(
        &self,
        positions: usize,
        dev: &B::Device,
        weights: crate::models::WeightsArg,
        draft_vocab: DraftVocab,
    ) -> Result<Pair<B>, CliError> {
        let format = weights.format::<B>();
        let target = self.target.build_as::<B>(positions, dev, format)?;
        let draft = match &self.draft {
            DraftFiles::Model(d) => crate::generate::with_draft_vocab(
                d.build_as::<B>(positions, dev, format)?,
                draft_vocab,
                &d.tokenizer,
            )?,
            DraftFiles::Substitute(s) => s.build(&target)?,
        };
        Ok(Pair {
            target: Arc::new(target),
            draft: Arc::new(draft),
            tok: self.target.tokenizer.clone(),
        })
    }
}
