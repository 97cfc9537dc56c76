//! `dustin eval longbench`: the options of the LongBench run of
//! `dustin_eval::harness::longbench`.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dustin_eval::harness::longbench::{self as lb, LongBenchOptions, DEFAULT_TASKS};

use crate::backend::DeviceKind;

/// Whether prompts are wrapped in the model's chat format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ChatMode {
    /// A single user message in the model's chat template (transformers'
    /// `apply_chat_template` with `add_generation_prompt`), when the model ships one, except
    /// for trec, triviaqa, samsum, lsht, lcc and repobench-p (as LongBench's `pred.py`);
    /// plain otherwise. Generation also stops at the template's end-of-turn tokens.
    #[default]
    Auto,
    /// The plain LongBench prompt for every task.
    Off,
}

/// Arguments of `dustin eval longbench`.
#[derive(Debug, Args)]
pub struct LongBenchArgs {
    /// Target model: HF directory, .gguf file, or a model name (`dustin fetch-model
    /// --list`). Default: qwen2.5-coder-1.5b-instruct from the cache.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Draft: `self:layers=N` (early-exit self-draft), `substitute[:bits=B][:group=G][:layers=L]`
    /// (SubSpec: the target with the listed layers group-quantized) or a model path or name
    /// (same tokenizer).
    #[arg(long, default_value = "qwen2.5-coder-0.5b-instruct")]
    pub draft: String,
    /// Draft layers whose attention makes the lookahead (`dustin_spec::LookaheadLayers`):
    /// `half` (the default: the later half), `all`, `stride:S` (every S-th layer counted
    /// back from the last), `last:N` or a list of layer indices (`0,5,9`), of the draft's
    /// layers (a self-draft's `N`), as `eval fidelity --lookahead-layers`.
    #[arg(long, default_value = "half")]
    pub lookahead_layers: String,
    /// LongBench data: a directory of `<task>.json` (MiniLongBench layout) or `<task>.jsonl`
    /// (original LongBench layout) files, or one such file.
    #[arg(long, default_value = "../shared/data/longbench")]
    pub data: PathBuf,
    /// Tasks (comma-separated LongBench English task names).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_TASKS)]
    pub tasks: Vec<String>,
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>` for a
    /// variant whose knobs `--knobs label=...` sets). `dense` runs once per sample.
    #[arg(long, value_delimiter = ',', default_value = "dense,dustin,streaming")]
    pub selectors: Vec<String>,
    /// Estimator knobs of one selector label as JSON, e.g. `dustin={"alpha":0.7}`
    /// (repeatable).
    #[arg(long = "knobs")]
    pub knobs: Vec<String>,
    /// Selector-config overrides of one selector label as JSON, e.g. `dustin={"refresh":1}`
    /// (repeatable; the budget always comes from `--budget`).
    #[arg(long = "select")]
    pub select: Vec<String>,
    /// Token budgets (comma-separated): absolute (`512`) or fractions of the context
    /// (`1/8`, `0.125`).
    #[arg(long, value_delimiter = ',', required = true)]
    pub budget: Vec<String>,
    /// Context length: prompts are truncated in the middle to this minus the task's
    /// generation limit and gamma. Default: the model's (`max_position_embeddings`).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Use at most this many samples per task (in id order).
    #[arg(long)]
    pub max_samples: Option<usize>,
    /// Draft tokens per verification.
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Chat wrapper of the prompts.
    #[arg(long, value_enum, default_value_t = ChatMode::Auto)]
    pub chat: ChatMode,
    /// Output folder (results.jsonl, longbench.md, longbench.json, longbench.svg,
    /// per_sample.md).
    #[arg(long, default_value = "out/longbench")]
    pub out: PathBuf,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

impl LongBenchArgs {
    /// The harness's options of these arguments (all but the device).
    pub fn options(&self) -> LongBenchOptions {
        LongBenchOptions {
            model: self.model.clone(),
            draft: self.draft.clone(),
            lookahead_layers: self.lookahead_layers.clone(),
            data: self.data.clone(),
            tasks: self.tasks.clone(),
            selectors: self.selectors.clone(),
            knobs: self.knobs.clone(),
            select: self.select.clone(),
            budget: self.budget.clone(),
            ctx: self.ctx,
            max_samples: self.max_samples,
            gamma: self.gamma,
            out: self.out.clone(),
            chat: match self.chat {
                ChatMode::Auto => lb::ChatMode::Auto,
                ChatMode::Off => lb::ChatMode::Off,
            },
        }
    }
}
