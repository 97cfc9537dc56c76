//! `dustin eval pg19`: the options of the PG-19 perplexity run of
//! `dustin_eval::harness::pg19`, a front end over the fidelity harness.

use std::path::PathBuf;

use clap::Args;
use dustin_eval::harness::pg19::Pg19Options;

use crate::backend::DeviceKind;

/// Arguments of `dustin eval pg19`.
#[derive(Debug, Args)]
pub struct Pg19Args {
    /// Target model: HF directory, .gguf file, or a model name (`dustin fetch-model
    /// --list`). Default: qwen2.5-coder-1.5b-instruct from the cache.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft whose lookahead the draft-aware selectors read: `self:layers=N` (early-exit
    /// self-draft) or a model path or name (same tokenizer).
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub draft: String,
    /// A PG-19 book (.txt) or a directory of them.
    #[arg(long, default_value = "../shared/data/pg19")]
    pub data: PathBuf,
    /// Use at most this many books (in file-name order).
    #[arg(long)]
    pub books: Option<usize>,
    /// Context lengths N (comma-separated): the last verified position is below N.
    #[arg(long, value_delimiter = ',', required = true)]
    pub ctx: Vec<usize>,
    /// Token budgets (comma-separated): absolute (`512`) or fractions of the context
    /// (`1/8`, `0.125`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub budget: Vec<String>,
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>`).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dense,streaming,h2o,snapkv,quest,oracle,dustin"
    )]
    pub selectors: Vec<String>,
    /// Estimator knobs of one selector label as JSON (repeatable).
    #[arg(long = "knobs")]
    pub knobs: Vec<String>,
    /// Selector-config overrides of one selector label as JSON (repeatable).
    #[arg(long = "select")]
    pub select: Vec<String>,
    /// Teacher-forced verification windows per (book, context, budget, selector).
    #[arg(long, default_value_t = 16)]
    pub windows: usize,
    /// Draft tokens per verification (each window verifies gamma + 1 tokens).
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Tokens of a speculative run per row that measures the acceptance length (0: none,
    /// the default). Rows are keyed by it, so `--spec-tokens 8 --out out/fidelity` reads the
    /// rows an `eval fidelity --spec-tokens 8` run stored there instead of recomputing them.
    #[arg(long, default_value_t = 0)]
    pub spec_tokens: usize,
    /// Output folder (results.jsonl, pg19.md, pg19.json, `pg19_ctx<N>.svg`).
    #[arg(long, default_value = "out/pg19")]
    pub out: PathBuf,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

impl Pg19Args {
    /// The harness's options of these arguments (all but the device).
    pub fn options(&self) -> Pg19Options {
        Pg19Options {
            model: self.model.clone(),
            draft: self.draft.clone(),
            data: self.data.clone(),
            books: self.books,
            ctx: self.ctx.clone(),
            budget: self.budget.clone(),
            selectors: self.selectors.clone(),
            knobs: self.knobs.clone(),
            select: self.select.clone(),
            windows: self.windows,
            gamma: self.gamma,
            spec_tokens: self.spec_tokens,
            out: self.out.clone(),
        }
    }
}
