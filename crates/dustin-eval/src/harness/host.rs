//! What the harness asks of the program that runs it: models by name or path.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dustin_kernels::KernelOps;
use dustin_qwen::{Qwen2, Tokenizer, WeightFormat};

use super::pair::Pair;
use super::HarnessError;

/// The draft of a fidelity, PG-19 or LongBench run: `(model, early-exit layers, whether it
/// is the target itself)`. An early-exit self-draft is `(target, Some(n), true)` and runs on
/// the first `n` layers of the target's cache; a separate or substitute draft is
/// `(draft, None, false)` and prefills a cache of its own.
pub type EvalDraft<B> = (Arc<Qwen2<B>>, Option<usize>, bool);

/// The target and the draft of `dustin eval fidelity`, `eval pg19` and `eval longbench`
/// (`--model`, `--draft`; flattened into each command's options), resolved by the
/// [`ModelHost`].
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct ModelFlags {
    /// Target model: HF directory, .gguf file, or a model name (`dustin fetch-model
    /// --list`). Default: qwen2.5-coder-1.5b-instruct from the cache.
    #[cfg_attr(feature = "clap", arg(long))]
    pub model: Option<PathBuf>,
    /// Draft (its lookahead is what the draft-aware selectors read): `self:layers=N`
    /// (early-exit self-draft), `substitute[:bits=B][:group=G][:layers=L]` (SubSpec: the
    /// target with the listed layers group-quantized) or a model path or name (same
    /// tokenizer).
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "qwen2.5-coder-0.5b-instruct")
    )]
    pub draft: String,
}

/// Model loading by name, which the harness leaves to the program that runs it (the
/// `dustin` command resolves registry names, fetches missing models and parses `--draft`).
pub trait ModelHost {
    /// A target and draft whose files are open, not yet loaded.
    type Pair: PairSource;

    /// The model file or folder of a `--model` value: a path as given or a registry name
    /// resolved; `None` for the default model.
    ///
    /// # Errors
    /// An unknown name, a failed fetch (as [`HarnessError::Host`] or
    /// [`HarnessError::Usage`]).
    fn model_path(&self, model: Option<&Path>) -> Result<PathBuf, HarnessError>;

    /// The format a GGUF target's weights load in on backend `B` (the draft of
    /// [`ModelHost::eval_draft`] chooses its own). Default: [`WeightFormat::Dense`], the
    /// reference path; a host that keeps block weights on the CPU runs the same
    /// comparisons several times faster (dense and sparse verification read the same weights
    /// either way).
    fn weight_format<B: KernelOps>(&self) -> WeightFormat {
        WeightFormat::Dense
    }

    /// The draft of `--draft` for `target`, built for `positions` positions on `dev`; when
    /// `tok` is given, a separate draft model must share its vocabulary.
    ///
    /// # Errors
    /// A bad `--draft` value, a self-draft of too many layers, load and vocabulary errors.
    fn eval_draft<B: KernelOps>(
        &self,
        draft: &str,
        target: &Arc<Qwen2<B>>,
        positions: usize,
        dev: &B::Device,
        tok: Option<&Tokenizer>,
    ) -> Result<EvalDraft<B>, HarnessError>;

    /// Opens the files of a target and its draft (names or paths; no weights read yet),
    /// their vocabularies checked.
    ///
    /// # Errors
    /// Resolution, fetch and model errors; a draft that cannot run on a cache of its own.
    fn open_pair(&self, target: &str, draft: &str) -> Result<Self::Pair, HarnessError>;
}

/// A target and draft whose files are open: what the harness needs before and when loading
/// them.
pub trait PairSource {
    /// The target's tokenizer.
    fn tokenizer(&self) -> &Tokenizer;

    /// The positions both models take (the smaller `max_position_embeddings`).
    fn max_positions(&self) -> usize;

    /// Loads both models on `dev` with RoPE tables for `positions` positions.
    ///
    /// # Errors
    /// Model errors (unsupported tensor types, memory).
    fn build<B: KernelOps>(
        &self,
        positions: usize,
        dev: &B::Device,
    ) -> Result<Pair<B>, HarnessError>;
}
