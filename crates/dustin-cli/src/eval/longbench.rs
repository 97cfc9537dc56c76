//! `dustin eval longbench`: LongBench tasks answered greedily by speculative decoding whose
//! target verifies through each selector at each budget, scored with LongBench's metrics
//! (`dustin_eval::metrics`).
//!
//! Per sample (shared by every selector and budget of the sample):
//! 1. the LongBench prompt (`Sample::prompt`) is tokenized and truncated in the middle to the
//!    context minus the task's generation limit and `gamma` (room for the last verification
//!    block), keeping the head and tail halves as LongBench's `pred.py` does
//!    ([`truncate_middle`]); with `--chat auto` and a model that ships a chat template, the
//!    prompt is then wrapped as the template renders a single user message with
//!    `add_generation_prompt` (the token ids of the rendering before and after the message's
//!    text, `ChatTemplate::user_affixes`; Qwen2.5's and SmolLM2's templates add their default
//!    system prompt), except for LongBench's few-shot tasks, as `pred.py` does; with the
//!    template in use, generation (of every task) also stops at its end-of-turn tokens
//!    (`ChatTemplate::stop_token_ids`);
//! 2. one dense prefill of the prompt, in the chunks of `ModelVerifier`'s own prefill, whose
//!    chunks are shown to every (selector, budget) policy of the sample through the fidelity
//!    harness's fan-out hook, so each policy sees exactly what its own prefill would show it;
//!    the early-exit draft's cache is the first layers of the target's.
//!
//! Per (selector, budget): a greedy speculative run (`SpeculativeDecoder`, gamma 4 by default)
//! from clones of the shared caches, up to the task's `max_new_tokens` or EOS; the prediction
//! (special tokens skipped, as `pred.py` decodes) is scored with `metrics::scorer`. `dense` runs
//! once per sample, whatever the budgets.

use dustin_kernels::KernelOps;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::backend::Backend;
use clap::{Args, ValueEnum};
use dustin_core::{DenseHook, SamplingConfig, TokenId};
use dustin_eval::longbench::{self as lb, Sample};
use dustin_eval::metrics;
use dustin_eval::report::{plot_lines, Cell, ResultStore, Table};
use dustin_qwen::generate::{prefill, prefill_from, DEFAULT_PREFILL_CHUNK};
use dustin_qwen::{ChatTemplate, ModelFiles, Qwen2, Tokenizer};
use dustin_select::BudgetedPolicy;
use dustin_spec::{SpecConfig, SpeculativeDecoder};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use super::{
    fnv, say, selector_specs_from, shared_drafter, shared_verifier, BudgetSpec, FanOut,
    SelectorSpec,
};
use crate::backend::DeviceKind;
use crate::generate::model_path;
use crate::CliError;

/// The tasks of the shared data folder (`../shared/data/longbench`), the default of `--tasks`.
const DEFAULT_TASKS: &str =
    "narrativeqa,qasper,multifieldqa_en,gov_report,passage_retrieval_en,trec,samsum";

/// Tasks LongBench's `pred.py` leaves without the chat wrapper (few-shot and code tasks).
const NO_CHAT_TASKS: [&str; 6] = ["trec", "triviaqa", "samsum", "lsht", "lcc", "repobench-p"];

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

// ------------------------------------------------------------------------------- prompts

/// LongBench's middle truncation (`pred.py`): a prompt of more than `limit` tokens keeps its
/// first `limit / 2` and its last `limit / 2` tokens (so an odd `limit` keeps `limit - 1`, as
/// `half = int(max_length / 2)` does there); a shorter prompt is kept whole.
pub fn truncate_middle(ids: &[TokenId], limit: usize) -> Vec<TokenId> {
    if ids.len() <= limit {
        return ids.to_vec();
    }
    let half = limit / 2;
    let mut out = Vec::with_capacity(2 * half);
    out.extend_from_slice(&ids[..half]);
    out.extend_from_slice(&ids[ids.len() - half..]);
    out
}

/// The token ids around a prompt in the model's chat template (a single user message with
/// `add_generation_prompt`), and the ids that end the assistant's turn.
#[derive(Debug, Clone)]
struct Chat {
    prefix: Vec<TokenId>,
    suffix: Vec<TokenId>,
    /// EOS and the template's end-of-turn tokens.
    stop: Vec<TokenId>,
    /// Where the template came from.
    origin: String,
}

impl Chat {
    /// The wrapper of the model's chat template for `mode`; `None` with `--chat off` or a
    /// model without a template.
    fn for_model(
        template: Option<&ChatTemplate>,
        tok: &Tokenizer,
        mode: ChatMode,
    ) -> Result<Option<Self>, CliError> {
        let Some(t) = template.filter(|_| mode != ChatMode::Off) else {
            return Ok(None);
        };
        let (prefix, suffix) = t.user_affixes().map_err(|e| {
            CliError::Usage(format!("--chat auto: {e}; --chat off reads plain prompts"))
        })?;
        Ok(Some(Self {
            prefix: tok.encode(&prefix)?,
            suffix: tok.encode(&suffix)?,
            stop: t.stop_token_ids(tok),
            origin: t.origin().to_string(),
        }))
    }

    fn len(&self) -> usize {
        self.prefix.len() + self.suffix.len()
    }

    /// What identifies the wrapper in result keys: its token ids and stop ids.
    fn key(&self) -> String {
        format!(
            "template:{:016x}",
            fnv(&format!(
                "{:?}|{:?}|{:?}",
                self.prefix, self.suffix, self.stop
            ))
        )
    }
}

/// A sample's prompt as the model reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Prompt {
    ids: Vec<TokenId>,
    /// Tokens of the LongBench prompt before truncation.
    original: usize,
    /// Whether the prompt was truncated in the middle.
    truncated: bool,
    /// Whether the chat wrapper was applied.
    chat: bool,
}

/// The prompt budget of a task: `ctx - max_new - gamma - wrapper`, at least 2 tokens.
fn prompt_limit(
    task: &str,
    ctx: usize,
    max_new: usize,
    gamma: usize,
    wrapper: usize,
) -> Result<usize, CliError> {
    ctx.checked_sub(max_new + gamma + wrapper)
        .filter(|&l| l >= 2)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "--ctx {ctx}: too short for task {task} ({max_new} new tokens, gamma {gamma}, \
                 {wrapper} chat-wrapper tokens and a prompt of at least 2 tokens)"
            ))
        })
}

/// Tokenizes, truncates and wraps one sample's prompt.
fn build_prompt(
    tok: &Tokenizer,
    chat: Option<&Chat>,
    sample: &Sample,
    ctx: usize,
    max_new: usize,
    gamma: usize,
) -> Result<Prompt, CliError> {
    let text = sample
        .prompt()
        .map_err(|e| CliError::Usage(format!("sample {} of {}: {e}", sample.id, sample.task)))?;
    let body = tok.encode(&text)?;
    let wrap = chat.filter(|_| !NO_CHAT_TASKS.contains(&sample.task.as_str()));
    let limit = prompt_limit(&sample.task, ctx, max_new, gamma, wrap.map_or(0, Chat::len))?;
    let kept = truncate_middle(&body, limit);
    let truncated = kept.len() < body.len();
    let ids = match wrap {
        Some(c) => [c.prefix.as_slice(), &kept, &c.suffix].concat(),
        None => kept,
    };
    Ok(Prompt {
        ids,
        original: body.len(),
        truncated,
        chat: wrap.is_some(),
    })
}

// ------------------------------------------------------------------------------- data

/// Checks a task name: it needs a generation limit and a metric.
fn check_task(task: &str) -> Result<usize, CliError> {
    match (lb::max_new_tokens(task), metrics::Metric::for_task(task)) {
        (Some(n), Some(_)) => Ok(n),
        _ => Err(CliError::Usage(format!(
            "--tasks {task}: unknown LongBench task; known: {}",
            lb::tasks()
                .filter(|t| metrics::Metric::for_task(t).is_some())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// Loads the samples of `tasks` from a data directory or file.
fn load_samples(data: &Path, tasks: &[String]) -> Result<BTreeMap<String, Vec<Sample>>, CliError> {
    let bad =
        |e: dustin_eval::EvalError| CliError::Usage(format!("--data {}: {e}", data.display()));
    let mut out: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    if data.is_dir() {
        for t in tasks {
            let json = data.join(format!("{t}.json"));
            let jsonl = data.join(format!("{t}.jsonl"));
            let samples = if json.is_file() {
                lb::load_shared_file(&json).map_err(bad)?
            } else if jsonl.is_file() {
                lb::load_jsonl_file(&jsonl).map_err(bad)?
            } else {
                return Err(CliError::Usage(format!(
                    "--data {}: no {t}.json or {t}.jsonl for task {t}",
                    data.display()
                )));
            };
            out.insert(t.clone(), samples);
        }
    } else if data.is_file() {
        let all = if data.extension().is_some_and(|e| e == "jsonl") {
            lb::load_jsonl_file(data).map_err(bad)?
        } else {
            lb::load_shared_file(data).map_err(bad)?
        };
        for t in tasks {
            let s: Vec<Sample> = all.iter().filter(|s| &s.task == t).cloned().collect();
            if s.is_empty() {
                return Err(CliError::Usage(format!(
                    "--data {}: no sample of task {t}",
                    data.display()
                )));
            }
            out.insert(t.clone(), s);
        }
    } else {
        return Err(CliError::Usage(format!(
            "--data {}: no such file or directory (a folder of <task>.json / <task>.jsonl \
             LongBench files, or one such file)",
            data.display()
        )));
    }
    Ok(out)
}

// ------------------------------------------------------------------------------- runs

/// One (selector, budget) of the run; `budget` is `None` for dense (full attention).
#[derive(Debug, Clone)]
struct RunSpec {
    sel: SelectorSpec,
    budget_label: String,
    budget: Option<usize>,
}

impl RunSpec {
    fn budget_key(&self) -> String {
        self.budget.map_or("full".into(), |b| b.to_string())
    }

    fn build<B: KernelOps>(&self, ctx: usize) -> Result<Box<dyn BudgetedPolicy<B>>, CliError> {
        self.sel.build::<B>(self.budget.unwrap_or(ctx))
    }
}

/// Selectors x budgets, `dense` once.
fn run_specs(
    sels: &[SelectorSpec],
    budgets: &[(String, BudgetSpec)],
    ctx: usize,
) -> Result<Vec<RunSpec>, CliError> {
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
                return Err(CliError::Usage(format!(
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
struct Row {
    task: String,
    id: String,
    ctx: usize,
    /// Tokens of the LongBench prompt before truncation.
    prompt_tokens: usize,
    /// Tokens the model read (truncated, chat wrapper included).
    input_tokens: usize,
    chat: bool,
    /// Context tokens per layer and KV head; `None`: dense.
    budget: Option<usize>,
    budget_label: String,
    selector: String,
    spec: String,
    gamma: usize,
    /// The generated answer (special tokens skipped).
    prediction: String,
    /// LongBench's sample score in [0, 1] (best over the gold answers).
    score: f64,
    /// Generated tokens (EOS included).
    new_tokens: usize,
    /// Why generation stopped (eos, length).
    finish: String,
    /// Mean acceptance length (accepted drafts + 1 per verification).
    accept_len: f64,
    /// Verifications.
    iterations: usize,
    /// Mean KV fraction read per verification by the target's attention.
    kv_selected: f64,
    /// Mean KV fraction read per verification by the selector's estimation.
    kv_estimation: f64,
    /// Seconds of the speculative run (first token from the shared prefill excluded).
    secs: f64,
    /// Seconds of the sample's shared prefill (target and draft), paid once per sample.
    secs_prefill: f64,
}

/// What the model and the run settings contribute to every key.
struct KeyBase<'a> {
    args: &'a LongBenchArgs,
    ctx: usize,
    model: String,
    /// `false`, or the chat wrapper's [`Chat::key`].
    chat: String,
}

impl KeyBase<'_> {
    fn key(&self, task: &str, id: &str, run: &RunSpec, max_new: usize) -> Result<String, CliError> {
        let budget = run.budget_key();
        let fp = run.sel.fingerprint(run.budget.unwrap_or(self.ctx))?;
        let la = crate::eval::lookahead_key(&self.args.lookahead_layers);
        let config = format!(
            "{fp}|model={}|draft={}{la}|g={}|chat={}|max_new={max_new}",
            self.model, self.args.draft, self.args.gamma, self.chat
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
struct Cx<B: Backend> {
    target: Arc<Qwen2<B>>,
    draft: Arc<Qwen2<B>>,
    draft_layers: Option<usize>,
    /// the draft layers of the lookahead (`None`: all; `--lookahead-layers`)
    lookahead_layers: Option<Vec<usize>>,
    self_draft: bool,
    tok: Tokenizer,
    vocab: usize,
    ctx: usize,
    gamma: usize,
}

/// What a sample's runs share: the dense caches after the prompt, the target's last logits,
/// and each pending run's policy after its prefill observation.
struct SharedPrefill<B: Backend> {
    cache: dustin_kv::DenseKvCache<B>,
    draft_cache: dustin_kv::DenseKvCache<B>,
    last: burn_tensor::Tensor<B, 2>,
    secs: f64,
}

/// One dense prefill of `ids` whose chunks every policy observes (as its own prefill would
/// show them), then the draft's cache.
fn shared_prefill<B: KernelOps>(
    cx: &Cx<B>,
    ids: &[TokenId],
    policies: &mut [Box<dyn BudgetedPolicy<B>>],
) -> Result<SharedPrefill<B>, CliError> {
    let t = Instant::now();
    let layers = cx.target.config.num_hidden_layers;
    for p in policies.iter_mut() {
        p.reset(1, layers);
    }
    let mut fan = FanOut {
        policies: policies.iter_mut().collect(),
    };
    let (cache, last, _) = prefill_from(
        &cx.target,
        &[ids.to_vec()],
        None,
        cx.ctx,
        None,
        &mut fan,
        DEFAULT_PREFILL_CHUNK,
        false,
    )?;
    let draft_cache = if cx.self_draft {
        cache.first_layers(cx.draft_layers.unwrap_or(usize::MAX))
    } else {
        prefill(
            &cx.draft,
            &[ids.to_vec()],
            cx.ctx,
            None,
            &mut DenseHook,
            DEFAULT_PREFILL_CHUNK,
            false,
        )?
        .0
    };
    Ok(SharedPrefill {
        cache,
        draft_cache,
        last,
        secs: t.elapsed().as_secs_f64(),
    })
}

/// The outcome of one speculative run.
struct Generated {
    tokens: Vec<TokenId>,
    finish: String,
    accept_len: f64,
    iterations: usize,
    kv_selected: f64,
    kv_estimation: f64,
    secs: f64,
}

/// Greedy speculative generation of up to `max_new` tokens from the shared prefill, the
/// target verifying through `policy`.
fn generate_from<B: KernelOps>(
    cx: &Cx<B>,
    sh: &SharedPrefill<B>,
    ids: &[TokenId],
    policy: Box<dyn BudgetedPolicy<B>>,
    max_new: usize,
) -> Result<Generated, CliError> {
    let drafter = shared_drafter(
        cx.draft.clone(),
        cx.draft_layers,
        sh.draft_cache.clone(),
        cx.lookahead_layers.clone(),
    );
    let verifier = shared_verifier(
        cx.target.clone(),
        policy,
        sh.cache.clone(),
        sh.last.clone(),
        cx.vocab,
    );
    let mut dec = SpeculativeDecoder::new(drafter, verifier);
    let cfg = SpecConfig {
        gamma: cx.gamma,
        max_new_tokens: max_new,
        sampling: SamplingConfig::greedy(),
        seed: 0,
        eos: cx.tok.eos_ids.clone(),
        stop_strings: Vec::new(),
    };
    let t = Instant::now();
    let o = dec.generate(&[ids.to_vec()], &cfg, None, &mut |_, _| {})?;
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

/// `dustin eval longbench`.
pub(super) fn longbench<B: KernelOps>(
    args: &LongBenchArgs,
    dev: &B::Device,
) -> Result<(), CliError> {
    crate::check_gamma(args.gamma)?;
    if args.max_samples == Some(0) {
        return Err(CliError::Usage("--max-samples: at least 1".into()));
    }
    let mut tasks: Vec<String> = Vec::new();
    for t in args
        .tasks
        .iter()
        .map(|t| t.trim())
        .filter(|t| !t.is_empty())
    {
        check_task(t)?;
        if !tasks.iter().any(|x| x == t) {
            tasks.push(t.to_string());
        }
    }
    if tasks.is_empty() {
        return Err(CliError::Usage("--tasks: none given".into()));
    }
    let sels = selector_specs_from(&args.selectors, &args.knobs, &args.select)?;
    let budgets: Vec<(String, BudgetSpec)> = args
        .budget
        .iter()
        .map(|b| BudgetSpec::parse(b).map(|s| (b.trim().to_string(), s)))
        .collect::<Result<_, _>>()?;
    if args.ctx == Some(0) {
        return Err(CliError::Usage(
            "--ctx 0: expected a positive context".into(),
        ));
    }
    // check the lookahead setting, selectors, budgets and data before loading the model
    let la: dustin_spec::LookaheadLayers = args
        .lookahead_layers
        .parse()
        .map_err(|e| CliError::Usage(format!("--lookahead-layers: {e}")))?;
    let probe_ctx = args.ctx.unwrap_or(1 << 20);
    for r in run_specs(&sels, &budgets, probe_ctx)? {
        r.build::<B>(probe_ctx)?;
    }
    let data = load_samples(&args.data, &tasks)?;

    let path = model_path(&args.model)?;
    let files = ModelFiles::open(&path)?;
    let limit = files.config.max_position_embeddings;
    let ctx = args.ctx.unwrap_or(limit);
    if ctx > limit {
        return Err(CliError::Usage(format!(
            "--ctx {ctx}: larger than the model's context ({limit} positions)"
        )));
    }
    let runs = run_specs(&sels, &budgets, ctx)?;
    let mut tok = files.tokenizer.clone();
    let chat = Chat::for_model(files.chat_template.as_ref(), &tok, args.chat)?;
    if let Some(c) = &chat {
        tok.eos_ids = c.stop.clone();
    }
    for t in &tasks {
        let max_new = check_task(t)?;
        let wrap = chat
            .as_ref()
            .filter(|_| !NO_CHAT_TASKS.contains(&t.as_str()));
        prompt_limit(t, ctx, max_new, args.gamma, wrap.map_or(0, Chat::len))?;
    }
    let target = Arc::new(files.build::<B>(ctx, dev)?);
    let (draft, draft_layers, self_draft) =
        crate::eval::eval_draft(&args.draft, &target, ctx, dev, Some(&tok))?;
    let lookahead_layers = la
        .resolve(draft_layers.unwrap_or(draft.layers.len()))
        .map_err(|e| CliError::Usage(format!("--lookahead-layers: {e}")))?;
    let vocab = tok.vocab_size().min(target.config.vocab_size);
    let cx = Cx {
        target,
        draft,
        draft_layers,
        lookahead_layers,
        self_draft,
        tok,
        vocab,
        ctx,
        gamma: args.gamma,
    };
    let kb = KeyBase {
        args,
        ctx,
        model: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        chat: chat.as_ref().map_or_else(|| "false".to_string(), Chat::key),
    };

    std::fs::create_dir_all(&args.out).map_err(|source| CliError::Io {
        path: args.out.display().to_string(),
        source,
    })?;
    let mut store = ResultStore::open(args.out.join("results.jsonl"))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let chosen: Vec<(String, Vec<Sample>)> = tasks
        .iter()
        .map(|t| {
            let s = data.get(t).cloned().unwrap_or_default();
            let n = args.max_samples.unwrap_or(usize::MAX);
            (t.clone(), s.into_iter().take(n).collect())
        })
        .collect();
    let mut total = 0usize;
    let mut todo = 0usize;
    for (t, samples) in &chosen {
        let max_new = check_task(t)?;
        for s in samples {
            for r in &runs {
                total += 1;
                if !store.is_done(&kb.key(t, &s.id, r, max_new)?) {
                    todo += 1;
                }
            }
        }
    }
    let bar = ProgressBar::new(todo as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} runs (eta {eta}) {msg}",
        )
        .map_err(|e| CliError::Usage(e.to_string()))?
        .progress_chars("=> "),
    );
    say(
        &bar,
        format!(
            "longbench: {} samples of {} tasks x {} (selector, budget) runs = {total} runs, {todo} to compute; context {ctx}, chat wrapper {}",
            chosen.iter().map(|c| c.1.len()).sum::<usize>(),
            chosen.len(),
            runs.len(),
            chat.as_ref().map_or_else(
                || "none".to_string(),
                |c| format!("the chat template of {} (not for few-shot tasks)", c.origin)
            )
        ),
    );
    for (task, samples) in &chosen {
        let max_new = check_task(task)?;
        for sample in samples {
            let mut pending: Vec<(String, &RunSpec)> = Vec::new();
            for r in &runs {
                let key = kb.key(task, &sample.id, r, max_new)?;
                if !store.is_done(&key) {
                    pending.push((key, r));
                }
            }
            if pending.is_empty() {
                continue;
            }
            let prompt = build_prompt(&cx.tok, chat.as_ref(), sample, ctx, max_new, args.gamma)?;
            bar.set_message(format!(
                "{task} {}: prefill {} tokens",
                sample.id,
                prompt.ids.len()
            ));
            let mut policies: Vec<Box<dyn BudgetedPolicy<B>>> = pending
                .iter()
                .map(|(_, r)| r.build::<B>(ctx))
                .collect::<Result<_, _>>()?;
            let sh = shared_prefill(&cx, &prompt.ids, &mut policies)?;
            say(
                &bar,
                format!(
                    "{task} {}: prompt {} tokens{} -> {} read, prefill {:.1} s",
                    sample.id,
                    prompt.original,
                    if prompt.truncated {
                        " (truncated in the middle)"
                    } else {
                        ""
                    },
                    prompt.ids.len(),
                    sh.secs
                ),
            );
            for ((key, r), policy) in pending.into_iter().zip(policies) {
                bar.set_message(format!(
                    "{task} {} {} budget {}",
                    sample.id, r.sel.label, r.budget_label
                ));
                let g = generate_from(&cx, &sh, &prompt.ids, policy, max_new)?;
                let prediction = cx
                    .tok
                    .inner()
                    .decode(&g.tokens, true)
                    .map_err(|e| CliError::Usage(format!("decoding a prediction: {e}")))?;
                let score =
                    metrics::scorer(task, &prediction, &sample.answers, &sample.all_classes)
                        .map_err(|e| {
                            CliError::Usage(format!("scoring {task} sample {}: {e}", sample.id))
                        })?;
                let row = Row {
                    task: task.clone(),
                    id: sample.id.clone(),
                    ctx,
                    prompt_tokens: prompt.original,
                    input_tokens: prompt.ids.len(),
                    chat: prompt.chat,
                    budget: r.budget,
                    budget_label: r.budget_label.clone(),
                    selector: r.sel.label.clone(),
                    spec: r.sel.spec.clone(),
                    gamma: args.gamma,
                    prediction,
                    score,
                    new_tokens: g.tokens.len(),
                    finish: g.finish,
                    accept_len: g.accept_len,
                    iterations: g.iterations,
                    kv_selected: g.kv_selected,
                    kv_estimation: g.kv_estimation,
                    secs: g.secs,
                    secs_prefill: sh.secs,
                };
                say(
                    &bar,
                    format!(
                        "  {:<12} budget {:>6}: score {:.3}  {} tokens ({})  tau {:.2}  KV {:.3}+{:.3}  {:.1} s  {:?}",
                        row.selector,
                        row.budget_key(),
                        row.score,
                        row.new_tokens,
                        row.finish,
                        row.accept_len,
                        row.kv_selected,
                        row.kv_estimation,
                        row.secs,
                        clip(&row.prediction, 60)
                    ),
                );
                store
                    .append(&key, &row)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                bar.inc(1);
            }
        }
    }
    bar.finish_with_message("done");
    report(args, &store, &kb, &chosen, &runs, &budgets)
}

impl Row {
    fn budget_key(&self) -> String {
        self.budget.map_or("full".into(), |b| b.to_string())
    }
}

/// The first `n` characters of `s`.
fn clip(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().count() > n {
        out.push_str("...");
    }
    out
}

// ------------------------------------------------------------------------------- report

/// Means over the samples of one (task, run).
#[derive(Debug, Default, Clone)]
struct Agg {
    n: usize,
    scores: Vec<f64>,
    same_as_dense: usize,
    with_dense: usize,
    new_tokens: f64,
    accept: f64,
    kv: f64,
    secs: f64,
}

impl Agg {
    fn mean(&self, x: f64) -> f64 {
        x / self.n.max(1) as f64
    }
}

fn report(
    args: &LongBenchArgs,
    store: &ResultStore,
    kb: &KeyBase<'_>,
    chosen: &[(String, Vec<Sample>)],
    runs: &[RunSpec],
    budgets: &[(String, BudgetSpec)],
) -> Result<(), CliError> {
    let uerr = |e: dustin_eval::EvalError| CliError::Usage(e.to_string());
    let (records, _warnings) = store.records::<Row>().map_err(uerr)?;
    let rows: BTreeMap<String, Row> = records.into_iter().collect();
    let dense_run = runs.iter().find(|r| r.budget.is_none());
    let mut table = Table::new([
        "task",
        "budget",
        "selector",
        "samples",
        "score",
        "dense score",
        "vs dense (points)",
        "vs dense (ratio)",
        "same answer as dense",
        "new tokens",
        "accept len",
        "KV read",
        "s / sample",
    ])
    .with_title(format!(
        "LongBench, context {}, greedy speculative decoding (gamma {}, draft {}), score = LongBench metric x 100",
        kb.ctx, args.gamma, args.draft
    ))
    .with_precision(2);
    let mut per = Table::new([
        "task",
        "id",
        "budget",
        "selector",
        "score",
        "new tokens",
        "finish",
        "accept len",
        "s",
        "prediction",
    ])
    .with_title("Per sample")
    .with_precision(3);
    // task scores per run, for the mean over tasks and the plot
    let mut task_scores: Vec<Vec<f64>> = vec![Vec::new(); runs.len()];
    let mut dense_task_scores: Vec<f64> = Vec::new();
    for (task, samples) in chosen {
        let max_new = check_task(task)?;
        let dense_rows: BTreeMap<&str, &Row> = match dense_run {
            Some(d) => samples
                .iter()
                .filter_map(|s| {
                    let k = kb.key(task, &s.id, d, max_new).ok()?;
                    rows.get(&k).map(|r| (s.id.as_str(), r))
                })
                .collect(),
            None => BTreeMap::new(),
        };
        let dense_score =
            metrics::task_score(&dense_rows.values().map(|r| r.score).collect::<Vec<_>>());
        if let Some(d) = dense_score {
            dense_task_scores.push(d);
        }
        for (ri, r) in runs.iter().enumerate() {
            let mut agg = Agg::default();
            for s in samples {
                let Some(row) = rows.get(&kb.key(task, &s.id, r, max_new)?) else {
                    continue;
                };
                agg.n += 1;
                agg.scores.push(row.score);
                agg.new_tokens += row.new_tokens as f64;
                agg.accept += row.accept_len;
                agg.kv += row.kv_selected + row.kv_estimation;
                agg.secs += row.secs + row.secs_prefill;
                if let Some(d) = dense_rows.get(s.id.as_str()) {
                    agg.with_dense += 1;
                    if d.prediction == row.prediction {
                        agg.same_as_dense += 1;
                    }
                }
                per.push_row([
                    Cell::from(task.clone()),
                    Cell::from(s.id.clone()),
                    Cell::from(row.budget_key()),
                    Cell::from(row.selector.clone()),
                    Cell::from(row.score),
                    Cell::from(row.new_tokens.to_string()),
                    Cell::from(row.finish.clone()),
                    Cell::from(row.accept_len),
                    Cell::from(row.secs),
                    Cell::from(clip(&row.prediction, 80)),
                ])
                .map_err(uerr)?;
            }
            let Some(score) = metrics::task_score(&agg.scores) else {
                continue;
            };
            task_scores[ri].push(score);
            let (diff, ratio) = match dense_score {
                Some(d) => (Some(score - d), (d > 0.0).then(|| score / d)),
                None => (None, None),
            };
            table
                .push_row([
                    Cell::from(task.clone()),
                    Cell::from(budget_cell(r)),
                    Cell::from(r.sel.label.clone()),
                    Cell::from(agg.n.to_string()),
                    Cell::from(score),
                    Cell::from(dense_score),
                    Cell::from(diff),
                    Cell::from(ratio),
                    Cell::from(
                        (agg.with_dense > 0)
                            .then(|| agg.same_as_dense as f64 / agg.with_dense as f64),
                    ),
                    Cell::from(agg.mean(agg.new_tokens)),
                    Cell::from(agg.mean(agg.accept)),
                    Cell::from(agg.mean(agg.kv)),
                    Cell::from(agg.mean(agg.secs)),
                ])
                .map_err(uerr)?;
        }
    }
    // the mean over tasks, where every task has rows
    let dense_mean = (dense_task_scores.len() == chosen.len())
        .then(|| dense_task_scores.iter().sum::<f64>() / chosen.len().max(1) as f64);
    let mut means: Vec<Option<f64>> = Vec::with_capacity(runs.len());
    for (ri, r) in runs.iter().enumerate() {
        let m = (task_scores[ri].len() == chosen.len() && !chosen.is_empty())
            .then(|| task_scores[ri].iter().sum::<f64>() / chosen.len() as f64);
        means.push(m);
        if chosen.len() > 1 {
            if let Some(m) = m {
                let (diff, ratio) = match dense_mean {
                    Some(d) => (Some(m - d), (d > 0.0).then(|| m / d)),
                    None => (None, None),
                };
                table
                    .push_row([
                        Cell::from("mean over tasks"),
                        Cell::from(budget_cell(r)),
                        Cell::from(r.sel.label.clone()),
                        Cell::Empty,
                        Cell::from(m),
                        Cell::from(dense_mean),
                        Cell::from(diff),
                        Cell::from(ratio),
                        Cell::Empty,
                        Cell::Empty,
                        Cell::Empty,
                        Cell::Empty,
                        Cell::Empty,
                    ])
                    .map_err(uerr)?;
            }
        }
    }
    // plot: mean score over tasks against budget / context, one line per selector
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let xs: Vec<f64> = budgets
        .iter()
        .map(|(_, b)| b.tokens(kb.ctx) as f64 / kb.ctx as f64)
        .collect();
    for (ri, r) in runs.iter().enumerate() {
        let Some(m) = means[ri] else { continue };
        let pts: Vec<(f64, f64)> = match r.budget {
            None => xs.iter().map(|&x| (x, m)).collect(),
            Some(b) => vec![(b as f64 / kb.ctx as f64, m)],
        };
        match series.iter_mut().find(|s| s.0 == r.sel.label) {
            Some(s) => s.1.extend(pts),
            None => series.push((r.sel.label.clone(), pts)),
        }
    }
    for (_, pts) in series.iter_mut() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    plot_lines(
        args.out.join("longbench.svg"),
        &format!("LongBench score (mean over tasks), context {}", kb.ctx),
        "budget / context",
        "score",
        &series,
    )
    .map_err(uerr)?;
    table
        .write_markdown(args.out.join("longbench.md"))
        .map_err(uerr)?;
    table
        .write_json(args.out.join("longbench.json"))
        .map_err(uerr)?;
    per.write_markdown(args.out.join("per_sample.md"))
        .map_err(uerr)?;
    println!("{}", table.to_markdown());
    println!(
        "wrote {}",
        [
            "longbench.md",
            "longbench.json",
            "longbench.svg",
            "per_sample.md",
            "results.jsonl"
        ]
        .iter()
        .map(|f| args.out.join(f).display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
    );
    Ok(())
}

fn budget_cell(r: &RunSpec) -> String {
    match r.budget {
        None => "full".into(),
        Some(b) => format!("{} ({b})", r.budget_label),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn middle_truncation_keeps_head_and_tail_halves() {
        let ids: Vec<u32> = (0..10).collect();
        assert_eq!(truncate_middle(&ids, 6), [0, 1, 2, 7, 8, 9]);
        assert_eq!(truncate_middle(&ids, 4), [0, 1, 8, 9]);
        // odd limits keep 2 * floor(limit / 2), as pred.py's half = int(max_length / 2)
        assert_eq!(truncate_middle(&ids, 7), [0, 1, 2, 7, 8, 9]);
        assert_eq!(truncate_middle(&ids, 9), [0, 1, 2, 3, 6, 7, 8, 9]);
        assert_eq!(truncate_middle(&ids, 3), [0, 9]);
        // at or under the limit: unchanged
        assert_eq!(truncate_middle(&ids, 10), ids);
        assert_eq!(truncate_middle(&ids, 11), ids);
        let odd: Vec<u32> = (100..111).collect(); // 11 ids
        assert_eq!(truncate_middle(&odd, 5), [100, 101, 109, 110]);
        assert_eq!(
            truncate_middle(&odd, 8),
            [100, 101, 102, 103, 107, 108, 109, 110]
        );
    }

    #[test]
    fn prompt_limits_leave_room_for_generation_and_the_last_block() {
        assert_eq!(prompt_limit("trec", 512, 64, 4, 0).unwrap(), 444);
        assert_eq!(prompt_limit("qasper", 1024, 128, 4, 9).unwrap(), 883);
        assert!(prompt_limit("gov_report", 512, 512, 4, 0)
            .unwrap_err()
            .to_string()
            .contains("--ctx 512: too short for task gov_report"));
        assert!(prompt_limit("trec", 69, 64, 4, 0).is_err());
        assert_eq!(prompt_limit("trec", 70, 64, 4, 0).unwrap(), 2);
    }

    #[test]
    fn unknown_tasks_are_named() {
        assert_eq!(check_task("trec").unwrap(), 64);
        assert_eq!(check_task("gov_report").unwrap(), 512);
        let e = check_task("nope").unwrap_err().to_string();
        assert!(
            e.starts_with("--tasks nope: unknown LongBench task; known: narrativeqa, qasper"),
            "{e}"
        );
    }

    #[test]
    fn dense_runs_once_and_budgets_resolve_per_context() {
        let specs = selector_specs_from(&["dense".into(), "streaming".into()], &[], &[]).unwrap();
        let budgets = vec![
            ("1/8".to_string(), BudgetSpec::parse("1/8").unwrap()),
            ("100".to_string(), BudgetSpec::parse("100").unwrap()),
        ];
        let runs = run_specs(&specs, &budgets, 1024).unwrap();
        let got: Vec<(String, Option<usize>)> = runs
            .iter()
            .map(|r| (r.sel.label.clone(), r.budget))
            .collect();
        assert_eq!(
            got,
            [
                ("dense".to_string(), None),
                ("streaming".to_string(), Some(128)),
                ("streaming".to_string(), Some(100)),
            ]
        );
        let tiny = vec![("1/4096".to_string(), BudgetSpec::parse("1/4096").unwrap())];
        assert!(run_specs(&specs, &tiny, 1024)
            .unwrap_err()
            .to_string()
            .contains("--budget 1/4096: 0 tokens"));
    }
}
