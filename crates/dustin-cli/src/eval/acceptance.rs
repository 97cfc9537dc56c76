//! `dustin eval acceptance`: the options of the acceptance run of
//! `dustin_eval::harness::acceptance` (acceptance length and speed of a draft/target pair
//! per gamma, temperature, selector and budget, beside autoregressive decoding; resumable).

use std::path::PathBuf;

use clap::Args;
use dustin_eval::harness::acceptance::{AcceptanceOptions, DEFAULT_DRAFT};

use crate::backend::DeviceKind;

/// Arguments of `dustin eval acceptance`.
#[derive(Debug, Args)]
pub struct AcceptanceArgs {
    /// Target model: a model name (`dustin fetch-model --list`) or a path.
    #[arg(long, default_value = "qwen2.5-coder-1.5b-instruct")]
    pub model: String,
    /// Draft model: a model name or a path (same tokenizer as the target).
    /// `substitute[:bits=B][:group=G][:layers=L]` is the target's own SubSpec substitute.
    #[arg(long, default_value = DEFAULT_DRAFT)]
    pub draft: String,
    /// Prompt sources (comma-separated): text files, or folders whose files are each one
    /// source. PG-19 books lose their Gutenberg header and footer first.
    #[arg(long, value_delimiter = ',', required = true)]
    pub data: Vec<PathBuf>,
    /// Prompt lengths in tokens (comma-separated): each source's first `ctx` tokens.
    #[arg(long, value_delimiter = ',', default_value = "4096")]
    pub ctx: Vec<usize>,
    /// Draft tokens per iteration (comma-separated, each 1..=15).
    #[arg(long, value_delimiter = ',', default_value = "4")]
    pub gamma: Vec<usize>,
    /// Sampling temperatures (comma-separated; 0 is greedy).
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub temperature: Vec<f32>,
    /// Verification modes (comma-separated): `dense`, or a selector of the registry
    /// (dustin, streaming, h2o, snapkv, quest, oracle, ...) at each `--budget`.
    #[arg(long, value_delimiter = ',', default_value = "dense")]
    pub selectors: Vec<String>,
    /// Budgets of the sparse modes (comma-separated): tokens (`512`) or fractions of the
    /// prompt (`1/16`, `0.125`).
    #[arg(long, value_delimiter = ',', default_value = "1/16")]
    pub budget: Vec<String>,
    /// Tokens the draft attends to per layer and KV head (0: dense drafting).
    #[arg(long, default_value_t = 0)]
    pub draft_budget: usize,
    /// Tokens generated per cell.
    #[arg(long, default_value_t = 64)]
    pub new_tokens: usize,
    /// Skip the autoregressive row of each prompt (its tokens/s is the speed-up's base).
    #[arg(long)]
    pub no_autoregressive: bool,
    /// Draft layers whose attention makes the lookahead (`half`, `all`, `stride:S`,
    /// `last:N` or a list of indices).
    #[arg(long, default_value = "half")]
    pub lookahead_layers: String,
    /// Seed of the sampled cells.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop starting new cells after this many seconds (the run resumes from its results).
    #[arg(long)]
    pub time_limit: Option<f64>,
    /// Output folder: results.jsonl (resumable), acceptance.md, acceptance.json.
    #[arg(long, default_value = "out/acceptance")]
    pub out: PathBuf,
    /// Weights of a GGUF model: `auto` (kept in their block format on the CPU, whose block
    /// kernels read a sixth of the bytes of f32; decoded to f32 elsewhere), `dense` (decoded
    /// to f32) or `blocks`.
    #[arg(long, value_enum, default_value_t = crate::models::WeightsArg::Auto)]
    pub weights: crate::models::WeightsArg,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

impl AcceptanceArgs {
    /// The harness's options of these arguments (all but the weight format and the device,
    /// which the command applies itself).
    pub fn options(&self) -> AcceptanceOptions {
        AcceptanceOptions {
            model: self.model.clone(),
            draft: self.draft.clone(),
            data: self.data.clone(),
            ctx: self.ctx.clone(),
            gamma: self.gamma.clone(),
            temperature: self.temperature.clone(),
            selectors: self.selectors.clone(),
            budget: self.budget.clone(),
            draft_budget: self.draft_budget,
            new_tokens: self.new_tokens,
            no_autoregressive: self.no_autoregressive,
            lookahead_layers: self.lookahead_layers.clone(),
            seed: self.seed,
            time_limit: self.time_limit,
            out: self.out.clone(),
        }
    }
}
