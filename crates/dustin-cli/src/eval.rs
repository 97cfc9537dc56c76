//! `dustin eval`: `fidelity`, `pg19` (perplexity through the fidelity harness, in
//! `eval/pg19.rs`) and `longbench` (in `eval/longbench.rs`).
//!
//! `dustin eval fidelity`: how closely sparse verification through each selector follows
//! dense verification, on PG-19 books (docs/fidelity.md has the method, the accounting and
//! the results).
//!
//! Per book and context `N` (the shared part, computed once):
//! 1. the first `P = N - E` tokens of the book text (Gutenberg header stripped) are the
//!    prompt; `E` leaves room for the verified continuation inside `N` positions (the model's
//!    RoPE table ends at `max_position_embeddings`);
//! 2. `tokens[..P - 512]` is prefilled densely once; the last 512 prompt tokens then run
//!    densely once more through a *fan-out* hook that shows that chunk, as the last prefill
//!    chunk, to every selector instance (so each estimator gets its prefill observation
//!    without a prefill of its own; H2O therefore accumulates over that last chunk only);
//! 3. the draft's lookahead for each teacher-forced window (`ModelDrafter::force_window`) and
//!    the dense reference verification of each window (`ModelVerifier` with `DenseHook`).
//!
//! Per selector and budget: `W` teacher-forced verification windows (the pending book token
//! and the next `gamma` book tokens, verified by `ModelVerifier::verify` and all committed),
//! compared position by position with the dense reference (top-1 agreement, KL(dense ||
//! sparse), perplexity of the true next tokens, KV fraction read with the estimators' own
//! reads); then a short greedy speculative run (the engine's `SpeculativeDecoder`, the
//! drafter and verifier starting from the shared prefill) for the mean acceptance length.

use dustin_kernels::KernelOps;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use burn_tensor::{activation, backend::Backend, Tensor};
use clap::{Args, Subcommand};
use dustin_core::{
    AttentionHook, DenseHook, Drafter, KvStore, LayerAttnCtx, LayerSelection, Phase, Proposal,
    SamplingConfig, SelectionPolicy, TokenId, Verifier, VerifyCtx,
};
use dustin_eval::report::{plot_lines, Cell, ResultStore, Table};
use dustin_kv::DenseKvCache;
use dustin_qwen::generate::{prefill, prefill_from};
use dustin_qwen::{ForwardOpts, LogitsMode, ModelFiles, Qwen2};
use dustin_select::registry::build_budgeted;
use dustin_select::{BudgetedPolicy, SelectConfig};
use dustin_spec::{
    LookaheadConfig, LookaheadLayers, ModelDrafter, ModelVerifier, SpecConfig, SpeculativeDecoder,
};
use indicatif::{ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::backend::DeviceKind;
use crate::generate::{model_path, parse_draft, DraftSpec};
use crate::CliError;

mod acceptance;
mod longbench;
mod pg19;

/// The last prompt tokens every selector sees as its prefill observation (the prefill chunk
/// of `dustin_qwen::generate::prefill`).
const OBSERVED_CHUNK: usize = 512;

/// Arguments of `dustin eval`.
#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Which evaluation.
    #[command(subcommand)]
    pub command: EvalCommand,
}

/// The evaluations.
#[derive(Debug, Subcommand)]
pub enum EvalCommand {
    /// Fidelity of sparse verification vs dense, per selector and budget, on PG-19 books.
    Fidelity(FidelityArgs),
    /// Perplexity of PG-19 continuations when the target reads only its selection
    /// (teacher-forced verification windows), per selector and budget, against dense.
    Pg19(pg19::Pg19Args),
    /// LongBench tasks answered by greedy speculative decoding with sparse verification,
    /// scored with LongBench's metrics, per selector and budget, against dense.
    Longbench(longbench::LongBenchArgs),
    /// Mean acceptance length and speed of a draft/target pair per gamma, temperature,
    /// selector and budget, beside autoregressive decoding on the same prompts (resumable).
    Acceptance(acceptance::AcceptanceArgs),
}

/// Arguments of `dustin eval fidelity`.
#[derive(Debug, Args)]
pub struct FidelityArgs {
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
    /// layers (a self-draft's `N`). Applies to the teacher-forced lookaheads and to the
    /// speculative run's draft.
    #[arg(long, default_value = "half")]
    pub lookahead_layers: String,
    /// A PG-19 book (.txt) or a directory of them.
    #[arg(long)]
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
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>` for a
    /// variant whose knobs `--knobs label=...` sets).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "dense,streaming,h2o,snapkv,quest,oracle,draft-only,history-only,dustin,pyramid(dustin)"
    )]
    pub selectors: Vec<String>,
    /// Estimator knobs of one selector label as JSON, e.g. `dustin={"alpha":0.7}`
    /// (repeatable).
    #[arg(long = "knobs")]
    pub knobs: Vec<String>,
    /// Selector-config overrides of one selector label as JSON, e.g. `dustin={"refresh":1}`
    /// (repeatable; the budget always comes from `--budget`).
    #[arg(long = "select")]
    pub select: Vec<String>,
    /// Teacher-forced verification windows per (book, context, budget, selector).
    #[arg(long, default_value_t = 16)]
    pub windows: usize,
    /// Draft tokens per verification (each window verifies gamma + 1 tokens).
    #[arg(long, default_value_t = 4)]
    pub gamma: usize,
    /// Tokens generated by the speculative run that measures the acceptance length
    /// (0: skip it).
    #[arg(long, default_value_t = 32)]
    pub spec_tokens: usize,
    /// Output folder (results.jsonl, fidelity.md, fidelity.json, `fidelity_ctx<N>.svg`).
    #[arg(long, default_value = "out/fidelity")]
    pub out: PathBuf,
    /// Where to run.
    #[arg(long, value_enum, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
}

/// `dustin eval`.
pub fn run(args: EvalArgs) -> Result<(), CliError> {
    match args.command {
        EvalCommand::Fidelity(a) => {
            crate::with_backend!(a.device, |B, dev| fidelity::<B>(&a, &dev))
        }
        EvalCommand::Pg19(a) => {
            crate::with_backend!(a.device, |B, dev| pg19::pg19::<B>(&a, &dev))
        }
        EvalCommand::Longbench(a) => {
            crate::with_backend!(a.device, |B, dev| longbench::longbench::<B>(&a, &dev))
        }
        EvalCommand::Acceptance(a) => {
            crate::with_backend!(a.device, |B, dev| acceptance::acceptance::<B>(&a, &dev))
        }
    }
}

// ------------------------------------------------------------------------------- setup

/// A budget as given: absolute tokens or a fraction of the context.
#[derive(Debug, Clone, Copy, PartialEq)]
enum BudgetSpec {
    Tokens(usize),
    Fraction(f64),
}

impl BudgetSpec {
    fn parse(s: &str) -> Result<Self, CliError> {
        let s = s.trim();
        let bad = || CliError::Usage(format!("--budget {s}: expected K, a/b or a fraction"));
        if let Some((a, b)) = s.split_once('/') {
            let (a, b): (f64, f64) = (
                a.trim().parse().map_err(|_| bad())?,
                b.trim().parse().map_err(|_| bad())?,
            );
            if b > 0.0 && a > 0.0 && a <= b {
                return Ok(Self::Fraction(a / b));
            }
            return Err(bad());
        }
        if let Ok(k) = s.parse::<usize>() {
            if k == 0 {
                return Err(CliError::Usage(format!(
                    "--budget {s}: a budget of 0 tokens reads nothing; expected at least 1"
                )));
            }
            return Ok(Self::Tokens(k));
        }
        match s.parse::<f64>() {
            Ok(f) if f > 0.0 && f <= 1.0 => Ok(Self::Fraction(f)),
            _ => Err(bad()),
        }
    }

    fn tokens(&self, ctx: usize) -> usize {
        match *self {
            Self::Tokens(k) => k,
            Self::Fraction(f) => (f * ctx as f64).round() as usize,
        }
    }
}

/// One selector of the run: its label in reports, the registry spec and its configs.
#[derive(Debug, Clone)]
struct SelectorSpec {
    label: String,
    spec: String,
    knobs: Option<serde_json::Value>,
    select: Option<serde_json::Value>,
}

impl SelectorSpec {
    /// The selector config at `budget`: the `dustin` family (`dustin`, `history-only` and
    /// their pyramids) starts from the recommended config (`recommended_select_config`: a
    /// new selection every second verification, re-ranked with the new lookahead in between,
    /// as tuned in docs/fidelity.md; early refresh when acceptance halves), every baseline
    /// from the defaults (recomputed every verification, its own rule); `--select` overrides
    /// either.
    fn select_config(&self, budget: usize) -> Result<SelectConfig, CliError> {
        let dustin_family = self.spec.contains("dustin") || self.spec.contains("history-only");
        let mut cfg = if dustin_family {
            dustin_select::estimators::dustin::recommended_select_config(budget)
        } else {
            SelectConfig::with_budget(budget)
        };
        if let Some(v) = &self.select {
            let mut base =
                serde_json::to_value(&cfg).map_err(|e| CliError::Usage(e.to_string()))?;
            if let (Some(b), Some(o)) = (base.as_object_mut(), v.as_object()) {
                for (k, val) in o {
                    b.insert(k.clone(), val.clone());
                }
            }
            cfg = serde_json::from_value(base)
                .map_err(|e| CliError::Usage(format!("--select {}: {e}", self.label)))?;
            cfg.budget = budget;
        }
        Ok(cfg)
    }

    fn build<B: KernelOps>(&self, budget: usize) -> Result<Box<dyn BudgetedPolicy<B>>, CliError> {
        let cfg = self.select_config(budget)?;
        build_budgeted::<B>(&self.spec, &cfg, self.knobs.clone())
            .map_err(|e| CliError::Usage(format!("selector {}: {e}", self.label)))
    }

    /// What identifies this selector's results at `budget`, hashed into store keys: the spec
    /// and the *resolved* configs (defaults included), so that a changed default recomputes.
    fn fingerprint(&self, budget: usize) -> Result<String, CliError> {
        let est = dustin_select::registry::resolved_config(&self.spec, self.knobs.clone())
            .map_err(|e| CliError::Usage(format!("selector {}: {e}", self.label)))?;
        let sel = serde_json::to_value(self.select_config(budget)?)
            .map_err(|e| CliError::Usage(e.to_string()))?;
        Ok(format!("{}|{est}|{sel}", self.spec))
    }
}

fn parse_label_json(
    flag: &str,
    items: &[String],
) -> Result<BTreeMap<String, serde_json::Value>, CliError> {
    let mut out = BTreeMap::new();
    for it in items {
        let (label, json) = it
            .split_once('=')
            .ok_or_else(|| CliError::Usage(format!("{flag} {it}: expected label=JSON")))?;
        let v: serde_json::Value =
            serde_json::from_str(json).map_err(|e| CliError::Usage(format!("{flag} {it}: {e}")))?;
        out.insert(label.trim().to_string(), v);
    }
    Ok(out)
}

fn selector_specs(args: &FidelityArgs) -> Result<Vec<SelectorSpec>, CliError> {
    selector_specs_from(&args.selectors, &args.knobs, &args.select)
}

/// The selectors of `--selectors`, with their `--knobs` and `--select` (shared by every
/// `dustin eval` command).
fn selector_specs_from(
    selectors: &[String],
    knobs: &[String],
    select: &[String],
) -> Result<Vec<SelectorSpec>, CliError> {
    let knobs = parse_label_json("--knobs", knobs)?;
    let select = parse_label_json("--select", select)?;
    let mut out: Vec<SelectorSpec> = Vec::new();
    for s in selectors {
        let s = s.trim();
        if s.is_empty() {
            continue;
        }
        let (label, spec) = match s.split_once('=') {
            Some((l, sp)) => (l.trim().to_string(), sp.trim().to_string()),
            None => (s.to_string(), s.to_string()),
        };
        if out.iter().any(|o| o.label == label) {
            return Err(CliError::Usage(format!("--selectors: {label} twice")));
        }
        out.push(SelectorSpec {
            knobs: knobs.get(&label).cloned(),
            select: select.get(&label).cloned(),
            label,
            spec,
        });
    }
    for l in knobs.keys().chain(select.keys()) {
        if !out.iter().any(|o| &o.label == l) {
            return Err(CliError::Usage(format!(
                "--knobs/--select for {l}, which is not in --selectors"
            )));
        }
    }
    if out.is_empty() {
        return Err(CliError::Usage("--selectors: none given".into()));
    }
    Ok(out)
}

/// FNV-1a, for short stable fingerprints in store keys.
fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

// ------------------------------------------------------------------------------- records

/// One finished (book, context, budget, selector) row, as stored in results.jsonl.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Row {
    book: String,
    ctx: usize,
    prompt_tokens: usize,
    budget: usize,
    budget_label: String,
    selector: String,
    spec: String,
    windows: usize,
    gamma: usize,
    /// Verified positions compared with dense.
    positions: usize,
    /// Fraction of positions where the sparse and dense argmax agree.
    top1: f64,
    /// Mean KL(dense || sparse) of the next-token distributions, nats.
    kl: f64,
    /// Mean negative log-likelihood of the true next tokens under the sparse target, nats.
    nll: f64,
    /// The same under dense verification.
    dense_nll: f64,
    /// Context positions the sparse attention read / dense reads (all layers, KV heads).
    kv_selected: f64,
    /// The estimator's own reads (token-equivalents) / dense reads.
    kv_estimation: f64,
    /// Mean acceptance length of the speculative run (accepted drafts + 1 per iteration).
    accept_len: Option<f64>,
    /// Verification iterations of the speculative run.
    spec_iterations: Option<usize>,
    /// Seconds of the windows and of the speculative run (and its drafting and verifying).
    secs_windows: f64,
    secs_spec: f64,
    #[serde(default)]
    secs_spec_draft: f64,
    #[serde(default)]
    secs_spec_verify: f64,
}

/// The part of a result store's key that names `--lookahead-layers` (`eval fidelity`, `eval
/// longbench`): nothing for `all`, so that stores written before the setting keep their keys,
/// else `|la=<setting as given, trimmed>`.
pub(crate) fn lookahead_key(setting: &str) -> String {
    match setting.parse::<LookaheadLayers>() {
        Ok(LookaheadLayers::All) => String::new(),
        _ => format!("|la={}", setting.trim()),
    }
}

fn row_key(
    book: &str,
    ctx: usize,
    budget: usize,
    sel: &SelectorSpec,
    args: &FidelityArgs,
) -> Result<String, CliError> {
    let la = lookahead_key(&args.lookahead_layers);
    Ok(format!(
        "{book}|ctx={ctx}|budget={budget}|{}|W={}|g={}|spec={}|draft={}{la}|{:016x}",
        sel.label,
        args.windows,
        args.gamma,
        args.spec_tokens,
        args.draft,
        fnv(&sel.fingerprint(budget)?)
    ))
}

// ------------------------------------------------------------------------------- hooks

/// Shows one prefill chunk to every selector instance (each returns no selection in prefill).
struct FanOut<'a, B: Backend> {
    policies: Vec<&'a mut Box<dyn BudgetedPolicy<B>>>,
}

impl<B: KernelOps> AttentionHook<B> for FanOut<'_, B> {
    fn on_layer(
        &mut self,
        ctx: &LayerAttnCtx<'_, B>,
    ) -> dustin_core::Result<Option<LayerSelection<B>>> {
        for p in &mut self.policies {
            if p.on_layer(ctx)?.is_some() {
                return Err(dustin_core::CoreError::Model(format!(
                    "selector {} selected during prefill",
                    p.policy_name()
                )));
            }
        }
        Ok(None)
    }
    fn wants_probs(&self, layer: usize, phase: Phase) -> bool {
        self.policies.iter().any(|p| p.wants_probs(layer, phase))
    }
    fn on_probs(
        &mut self,
        layer: usize,
        phase: Phase,
        probs: &Tensor<B, 4>,
    ) -> dustin_core::Result<()> {
        for p in &mut self.policies {
            if p.wants_probs(layer, phase) {
                p.on_probs(layer, phase, probs)?;
            }
        }
        Ok(())
    }
}

// ------------------------------------------------------------------------------- caches

fn host_f32<B: KernelOps, const D: usize>(t: Tensor<B, D>) -> Result<Vec<f32>, CliError> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .map_err(|e| CliError::Usage(format!("tensor to host: {e:?}")))
}

fn host_i64<B: KernelOps, const D: usize>(
    t: Tensor<B, D, burn_tensor::Int>,
) -> Result<Vec<i64>, CliError> {
    t.into_data()
        .convert::<i64>()
        .into_vec::<i64>()
        .map_err(|e| CliError::Usage(format!("tensor to host: {e:?}")))
}

// ------------------------------------------------------------------------------- engine parts

/// The engine's drafter continuing from a shared draft prefill (`cache` holds the prompt),
/// its lookahead from the draft layers `lookahead` (`None`: all).
fn shared_drafter<B: KernelOps>(
    model: Arc<Qwen2<B>>,
    layers: Option<usize>,
    cache: DenseKvCache<B>,
    lookahead: Option<Vec<usize>>,
) -> ModelDrafter<B> {
    ModelDrafter::new(model, layers, 0)
        .with_lookahead(LookaheadConfig {
            layers: lookahead,
            ..LookaheadConfig::default()
        })
        .with_prefilled(cache)
}

/// The engine's verifier continuing from a shared prefill (`cache` holds the prompt, `last`
/// the logits at its last position) through `policy`, which has already observed the prompt.
fn shared_verifier<B: KernelOps, P: SelectionPolicy<B>>(
    model: Arc<Qwen2<B>>,
    policy: P,
    cache: DenseKvCache<B>,
    last: Tensor<B, 2>,
    vocab: usize,
) -> ModelVerifier<B, P> {
    ModelVerifier::new(model, policy, 0, vocab).with_prefilled(cache, last)
}

/// One teacher-forced window through `verifier`: the pending token and `drafted` verified
/// (with the draft's `lookahead`), all committed, `next` pending after. Returns the logits
/// `[1, gamma + 1, vocab]` and the selected and dense context reads.
fn forced_window<B: KernelOps, P: SelectionPolicy<B>>(
    verifier: &mut ModelVerifier<B, P>,
    drafted: &[TokenId],
    lookahead: Option<&Tensor<B, 2>>,
    iteration: usize,
    next: TokenId,
) -> dustin_core::Result<(Tensor<B, 3>, u64, u64)> {
    let proposal = Proposal {
        tokens: vec![drafted.to_vec()],
        q: None,
        lookahead: lookahead.cloned(),
    };
    let v = verifier.verify(&VerifyCtx {
        proposal: &proposal,
        iteration,
    })?;
    let (reads, dense) = verifier.last_reads();
    let (reads, dense) = (reads[0], dense[0]);
    verifier.commit(&[drafted.len()], &[next])?;
    Ok((v.logits, reads, dense))
}

// ------------------------------------------------------------------------------- the run

/// What one (book, context) shares between its selectors.
struct Shared<B: KernelOps> {
    /// Target cache after the whole prompt (dense).
    cache: DenseKvCache<B>,
    /// Draft cache after the whole prompt (dense).
    draft_cache: DenseKvCache<B>,
    /// Target logits at the last prompt position `[1, vocab]`.
    last: Tensor<B, 2>,
    /// Teacher-forced lookahead per window (when a selector wants it).
    lookaheads: Vec<Tensor<B, 2>>,
    /// Dense log-probabilities per window `[1, gamma + 1, vocab]`.
    dense_logp: Vec<Tensor<B, 3>>,
    /// Dense argmax per verified position, all windows.
    dense_top: Vec<i64>,
    /// Dense NLL of the true next tokens, summed.
    dense_nll: f64,
    /// Seconds: dense prefill, fan-out chunk, draft cache and lookaheads, dense reference.
    secs: [f64; 4],
}

struct Ctx<'a, B: Backend> {
    args: &'a FidelityArgs,
    target: Arc<Qwen2<B>>,
    draft: Arc<Qwen2<B>>,
    draft_layers: Option<usize>,
    /// `--lookahead-layers` resolved against the draft's layers (`None`: all)
    lookahead_layers: Option<Vec<usize>>,
    self_draft: bool,
    vocab: usize,
    capacity: usize,
    /// Prompt tokens every selector sees as its last prefill chunk.
    observed: usize,
}

/// A selector instance pair for one (budget, selector) row: the windows' and the
/// speculative run's.
struct Pending<B: KernelOps> {
    key: String,
    sel: SelectorSpec,
    budget: usize,
    budget_label: String,
    fid: Box<dyn BudgetedPolicy<B>>,
    spec: Option<Box<dyn BudgetedPolicy<B>>>,
}

/// A log line above the progress bar, or on standard error when the bar is hidden (not a
/// terminal).
fn say(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() {
        eprintln!("{msg}");
    } else {
        bar.println(msg);
    }
}

fn fidelity<B: KernelOps>(args: &FidelityArgs, dev: &B::Device) -> Result<(), CliError> {
    let c = compute_rows::<B>(args, dev, "fidelity")?;
    report(args, &c.store, &c.books, &c.budgets, &c.sels)
}

/// The finished rows of a fidelity run and what identifies them, for a report.
struct Computed {
    store: ResultStore,
    books: Vec<dustin_eval::pg19::Book>,
    budgets: Vec<(String, BudgetSpec)>,
    sels: Vec<SelectorSpec>,
}

/// Computes every (book, context, budget, selector) row of `args` that the store of
/// `args.out` lacks (the fidelity harness; `what` names the command in the log).
fn compute_rows<B: KernelOps>(
    args: &FidelityArgs,
    dev: &B::Device,
    what: &str,
) -> Result<Computed, CliError> {
    crate::check_gamma(args.gamma)?;
    if args.windows == 0 {
        return Err(CliError::Usage("--windows: at least 1".into()));
    }
    let sels = selector_specs(args)?;
    let budgets: Vec<(String, BudgetSpec)> = args
        .budget
        .iter()
        .map(|b| BudgetSpec::parse(b).map(|s| (b.trim().to_string(), s)))
        .collect::<Result<_, _>>()?;
    // check every selector and config before loading anything
    for s in &sels {
        for (label, b) in &budgets {
            for &n in &args.ctx {
                if b.tokens(n) == 0 {
                    return Err(CliError::Usage(format!(
                        "--budget {label}: 0 tokens of a {n}-token context"
                    )));
                }
                s.build::<B>(b.tokens(n))?;
            }
        }
    }
    let books = if args.data.is_dir() {
        dustin_eval::pg19::load_dir(&args.data)
    } else {
        dustin_eval::pg19::load_book(&args.data).map(|b| vec![b])
    }
    .map_err(|e| CliError::Usage(format!("--data {}: {e}", args.data.display())))?;
    let books: Vec<_> = books
        .into_iter()
        .take(args.books.unwrap_or(usize::MAX))
        .collect();
    if books.is_empty() {
        return Err(CliError::Usage(format!(
            "--data {}: no .txt books",
            args.data.display()
        )));
    }

    let path = model_path(&args.model)?;
    let files = ModelFiles::open(&path)?;
    let tok = files.tokenizer.clone();
    let max_ctx = *args.ctx.iter().max().unwrap_or(&0);
    let limit = files.config.max_position_embeddings;
    if max_ctx > limit {
        return Err(CliError::Usage(format!(
            "--ctx {max_ctx}: the model's positions end at {limit}"
        )));
    }
    let target = Arc::new(files.build::<B>(max_ctx, dev)?);
    let (draft, draft_layers, self_draft) = eval_draft(&args.draft, &target, max_ctx, dev, None)?;
    let la: LookaheadLayers = args
        .lookahead_layers
        .parse()
        .map_err(|e| CliError::Usage(format!("--lookahead-layers: {e}")))?;
    let lookahead_layers = la
        .resolve(draft_layers.unwrap_or(draft.layers.len()))
        .map_err(|e| CliError::Usage(format!("--lookahead-layers: {e}")))?;
    let vocab = tok.vocab_size().min(target.config.vocab_size);
    let cx = Ctx {
        args,
        target,
        draft,
        draft_layers,
        lookahead_layers,
        self_draft,
        vocab,
        capacity: max_ctx,
        observed: OBSERVED_CHUNK,
    };

    std::fs::create_dir_all(&args.out).map_err(|source| CliError::Io {
        path: args.out.display().to_string(),
        source,
    })?;
    let mut store = ResultStore::open(args.out.join("results.jsonl"))
        .map_err(|e| CliError::Usage(e.to_string()))?;

    let total: usize = books.len() * args.ctx.len() * budgets.len() * sels.len();
    let mut todo = 0usize;
    for b in &books {
        for &n in &args.ctx {
            for (_, bs) in &budgets {
                for s in &sels {
                    if !store.is_done(&row_key(&b.id, n, bs.tokens(n), s, args)?) {
                        todo += 1;
                    }
                }
            }
        }
    }
    let bar = ProgressBar::new(todo as u64);
    bar.set_style(
        ProgressStyle::with_template(
            "{elapsed_precise} [{bar:30}] {pos}/{len} rows (eta {eta}) {msg}",
        )
        .map_err(|e| CliError::Usage(e.to_string()))?
        .progress_chars("=> "),
    );
    say(
        &bar,
        format!(
        "{what}: {} books x {} contexts x {} budgets x {} selectors = {total} rows, {} to compute",
        books.len(),
        args.ctx.len(),
        budgets.len(),
        sels.len(),
        todo
    ),
    );

    let spec_extra = if args.spec_tokens > 0 {
        args.spec_tokens + 2 * (args.gamma + 1)
    } else {
        0
    };
    let extra = (args.windows * (args.gamma + 1) + 1).max(spec_extra);
    for book in &books {
        // enough characters for the longest context (PG-19 prose: ~4 characters a token)
        let chars: String = book.text.chars().take(max_ctx * 8 + 4096).collect();
        let ids = tok.encode(&chars)?;
        // ascending, so that each context's dense prefill continues the previous one's
        let mut ctxs = args.ctx.clone();
        ctxs.sort_unstable();
        ctxs.dedup();
        let mut prefix: Option<DenseKvCache<B>> = None;
        for &n in &ctxs {
            if n <= extra + OBSERVED_CHUNK + 1 {
                return Err(CliError::Usage(format!(
                    "--ctx {n}: too short for {extra} verified tokens and a {OBSERVED_CHUNK}-token observed chunk"
                )));
            }
            let p = n - extra;
            // the windows need tokens up to p + W(gamma + 1) (their next tokens included);
            // leave a few tokens of margin before the cut of the text
            if ids.len() < n + 16 {
                say(
                    &bar,
                    format!(
                        "{}: {} tokens, fewer than {} for ctx {n}; skipped",
                        book.id,
                        ids.len(),
                        n + 16
                    ),
                );
                continue;
            }
            let mut pend: Vec<Pending<B>> = Vec::new();
            for (bl, bs) in &budgets {
                let budget = bs.tokens(n);
                for s in &sels {
                    let key = row_key(&book.id, n, budget, s, args)?;
                    if store.is_done(&key) {
                        continue;
                    }
                    pend.push(Pending {
                        key,
                        sel: s.clone(),
                        budget,
                        budget_label: bl.clone(),
                        fid: s.build::<B>(budget)?,
                        spec: None,
                    });
                }
            }
            if pend.is_empty() {
                continue;
            }
            bar.set_message(format!("{} ctx {n}: prefill {p} tokens", book.id));
            let t = Instant::now();
            let shared = shared_part(&cx, &ids, p, &mut pend, &mut prefix)?;
            say(&bar, format!(
                "{} ctx {n}: prompt {p} tokens, shared part in {:.1} s (prefill {:.1}, observed chunk {:.1}, draft lookaheads {:.1}, dense windows {:.1}); dense ppl {:.3}",
                book.id,
                t.elapsed().as_secs_f64(),
                shared.secs[0],
                shared.secs[1],
                shared.secs[2],
                shared.secs[3],
                (shared.dense_nll / (args.windows * (args.gamma + 1)) as f64).exp()
            ));
            for pe in pend {
                bar.set_message(format!(
                    "{} ctx {n} budget {} {}",
                    book.id, pe.budget, pe.sel.label
                ));
                let key = pe.key.clone();
                let row = run_row(&cx, &ids, p, &shared, pe, &book.id, n)?;
                say(&bar, format!(
                    "  {:<18} budget {:>5}: top-1 {:.4}  KL {:.5}  ppl {:.3}  KV {:.3}+{:.3}  tau {}  (windows {:.1} s, spec {:.1} s: draft {:.1}, verify {:.1})",
                    row.selector,
                    row.budget,
                    row.top1,
                    row.kl,
                    row.nll.exp(),
                    row.kv_selected,
                    row.kv_estimation,
                    row.accept_len.map_or("-".into(), |a| format!("{a:.2}")),
                    row.secs_windows,
                    row.secs_spec,
                    row.secs_spec_draft,
                    row.secs_spec_verify
                ));
                store
                    .append(&key, &row)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
                bar.inc(1);
            }
        }
    }
    bar.finish_with_message("done");
    Ok(Computed {
        store,
        books,
        budgets,
        sels,
    })
}

/// Prefill (dense, once), the selectors' prefill observation (fan-out), the draft cache, the
/// teacher-forced lookaheads and the dense reference windows.
///
/// `prefix` is a dense cache of the book's first tokens from a shorter context (contexts run
/// in ascending order): the prefill continues from it.
fn shared_part<B: KernelOps>(
    cx: &Ctx<'_, B>,
    ids: &[TokenId],
    p: usize,
    pend: &mut [Pending<B>],
    prefix: &mut Option<DenseKvCache<B>>,
) -> Result<Shared<B>, CliError> {
    let args = cx.args;
    let g1 = args.gamma + 1;
    let head = p - cx.observed;
    let mut clock = Instant::now();
    let mut secs = [0.0; 4];
    let mut lap = |i: usize, secs: &mut [f64; 4]| {
        secs[i] = clock.elapsed().as_secs_f64();
        clock = Instant::now();
    };
    let from = prefix
        .take()
        .filter(|c| c.lens()[0] < head && c.capacity() == cx.capacity);
    let (mut cache, _, _) = prefill_from(
        &cx.target,
        &[ids[..head].to_vec()],
        from.map(|c| vec![c]),
        cx.capacity,
        None,
        &mut DenseHook,
        cx.observed,
        false,
    )?;
    *prefix = Some(cache.clone());
    lap(0, &mut secs);
    let layers = cx.target.config.num_hidden_layers;
    let mut policies: Vec<&mut Box<dyn BudgetedPolicy<B>>> =
        pend.iter_mut().map(|pe| &mut pe.fid).collect();
    for pol in policies.iter_mut() {
        pol.reset(1, layers);
    }
    let mut fan = FanOut { policies };
    let out = cx.target.forward(
        &[ids[head..p].to_vec()],
        &mut cache,
        &mut fan,
        ForwardOpts {
            phase: Phase::Prefill {
                seq: 0,
                last_chunk: true,
            },
            logits: LogitsMode::Last,
            layers: None,
        },
    )?;
    let logits = out
        .logits
        .ok_or_else(|| CliError::Usage("prefill: no logits".into()))?;
    let v = logits.dims()[2];
    let last = logits.reshape([1, v]);
    // the speculative run's instance: a copy after the prefill observation
    if args.spec_tokens > 0 {
        for pe in pend.iter_mut() {
            pe.spec = Some(pe.fid.boxed_clone());
        }
    }
    lap(1, &mut secs);
    let draft_cache = if cx.self_draft {
        cache.first_layers(cx.draft_layers.unwrap_or(usize::MAX))
    } else {
        prefill(
            &cx.draft,
            &[ids[..p].to_vec()],
            cx.capacity,
            None,
            &mut DenseHook,
            cx.observed,
            false,
        )?
        .0
    };
    let window = |j: usize| ids[p + j * g1..p + (j + 1) * g1].to_vec();
    // teacher-forced lookaheads: the draft reads the window as if it had drafted the book's
    // tokens; its first gamma query rows are the ones a real proposal computes
    let mut lookaheads = Vec::new();
    if pend.iter().any(|pe| pe.fid.wants_lookahead()) {
        let mut drafter = shared_drafter(
            cx.draft.clone(),
            cx.draft_layers,
            draft_cache.clone(),
            cx.lookahead_layers.clone(),
        );
        drafter.prefill(&[ids[..p].to_vec()], &[ids[p]])?;
        for j in 0..args.windows {
            lookaheads.push(drafter.force_window(&[window(j)], &[ids[p + (j + 1) * g1]])?);
        }
    }
    lap(2, &mut secs);
    // dense reference
    let mut verifier = shared_verifier(
        cx.target.clone(),
        DenseHook,
        cache.clone(),
        last.clone(),
        cx.vocab,
    );
    verifier.prefill(&[ids[..p].to_vec()])?;
    verifier.set_pending(&[ids[p]])?;
    let mut dense_logp = Vec::new();
    let mut dense_top = Vec::new();
    let mut dense_nll = 0.0;
    for j in 0..args.windows {
        let w = window(j);
        let (logits, _, _) = forced_window(&mut verifier, &w[1..], None, j, ids[p + (j + 1) * g1])?;
        let lp = activation::log_softmax(logits, 2);
        dense_top.extend(host_i64(lp.clone().argmax(2))?);
        dense_nll += nll_of(&lp, &ids[p + j * g1 + 1..p + (j + 1) * g1 + 1])?;
        dense_logp.push(lp);
    }
    lap(3, &mut secs);
    Ok(Shared {
        cache,
        draft_cache,
        last,
        lookaheads,
        dense_logp,
        dense_top,
        dense_nll,
        secs,
    })
}

/// Summed negative log-likelihood of `truth` (one per position) under `logp` `[1, n, vocab]`.
fn nll_of<B: KernelOps>(logp: &Tensor<B, 3>, truth: &[TokenId]) -> Result<f64, CliError> {
    let n = truth.len();
    let idx: Vec<i64> = truth.iter().map(|&t| i64::from(t)).collect();
    let idx = Tensor::<B, 3, burn_tensor::Int>::from_data(
        burn_tensor::TensorData::new(idx, [1, n, 1]),
        &logp.device(),
    );
    let picked = host_f32(logp.clone().gather(2, idx))?;
    Ok(-picked.iter().map(|&x| f64::from(x)).sum::<f64>())
}

fn run_row<B: KernelOps>(
    cx: &Ctx<'_, B>,
    ids: &[TokenId],
    p: usize,
    sh: &Shared<B>,
    pe: Pending<B>,
    book: &str,
    n: usize,
) -> Result<Row, CliError> {
    let args = cx.args;
    let g1 = args.gamma + 1;
    let Pending {
        sel,
        budget,
        budget_label,
        fid,
        spec,
        ..
    } = pe;
    let t = Instant::now();
    let mut verifier = shared_verifier(
        cx.target.clone(),
        fid,
        sh.cache.clone(),
        sh.last.clone(),
        cx.vocab,
    );
    verifier.prefill(&[ids[..p].to_vec()])?;
    verifier.set_pending(&[ids[p]])?;
    let (mut agree, mut kl, mut nll) = (0usize, 0.0f64, 0.0f64);
    let (mut reads, mut dense) = (0u64, 0u64);
    let mut est_before = verifier
        .policy()
        .estimation_reads()
        .first()
        .copied()
        .unwrap_or(0.0);
    let mut est = 0.0f64;
    for j in 0..args.windows {
        // every verified position is committed (teacher forcing)
        let (logits, r, d) = forced_window(
            &mut verifier,
            &ids[p + j * g1 + 1..p + (j + 1) * g1],
            sh.lookaheads.get(j),
            j,
            ids[p + (j + 1) * g1],
        )?;
        let e = verifier
            .policy()
            .estimation_reads()
            .first()
            .copied()
            .unwrap_or(0.0);
        est += e - est_before;
        est_before = e;
        reads += r;
        dense += d;
        let lp = activation::log_softmax(logits, 2);
        let dl = &sh.dense_logp[j];
        let kls = (dl.clone().exp() * (dl.clone() - lp.clone())).sum_dim(2);
        kl += host_f32(kls)?.iter().map(|&x| f64::from(x)).sum::<f64>();
        let top = host_i64(lp.clone().argmax(2))?;
        agree += top
            .iter()
            .zip(&sh.dense_top[j * g1..(j + 1) * g1])
            .filter(|(a, b)| a == b)
            .count();
        nll += nll_of(&lp, &ids[p + j * g1 + 1..p + (j + 1) * g1 + 1])?;
    }
    let secs_windows = t.elapsed().as_secs_f64();
    let positions = args.windows * g1;
    let t = Instant::now();
    let (mut sd, mut sv) = (0.0, 0.0);
    let (accept_len, spec_iterations) = match spec {
        Some(policy) => {
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
                gamma: args.gamma,
                max_new_tokens: args.spec_tokens,
                sampling: SamplingConfig::greedy(),
                seed: 0,
                eos: Vec::new(),
                stop_strings: Vec::new(),
            };
            let o = dec.generate(&[ids[..p].to_vec()], &cfg, None, &mut |_, _| {})?;
            sd = o.summary.draft_secs;
            sv = o.summary.verify_secs;
            (
                Some(o.summary.mean_acceptance_length),
                Some(o.summary.iterations),
            )
        }
        None => (None, None),
    };
    let secs_spec = t.elapsed().as_secs_f64();
    let dense_f = dense.max(1) as f64;
    Ok(Row {
        book: book.to_string(),
        ctx: n,
        prompt_tokens: p,
        budget,
        budget_label,
        selector: sel.label.clone(),
        spec: sel.spec.clone(),
        windows: args.windows,
        gamma: args.gamma,
        positions,
        top1: agree as f64 / positions as f64,
        kl: kl / positions as f64,
        nll: nll / positions as f64,
        dense_nll: sh.dense_nll / positions as f64,
        kv_selected: reads as f64 / dense_f,
        kv_estimation: est / dense_f,
        accept_len,
        spec_iterations,
        secs_windows,
        secs_spec,
        secs_spec_draft: sd,
        secs_spec_verify: sv,
    })
}

// ------------------------------------------------------------------------------- report

/// Means of a group of rows (one per book).
#[derive(Debug, Default)]
struct Agg {
    n: usize,
    top1: f64,
    kl: f64,
    nll: f64,
    dense_nll: f64,
    kv_sel: f64,
    kv_est: f64,
    acc: f64,
    acc_n: usize,
}

impl Agg {
    fn add(&mut self, r: &Row) {
        self.n += 1;
        self.top1 += r.top1;
        self.kl += r.kl;
        self.nll += r.nll;
        self.dense_nll += r.dense_nll;
        self.kv_sel += r.kv_selected;
        self.kv_est += r.kv_estimation;
        if let Some(a) = r.accept_len {
            self.acc += a;
            self.acc_n += 1;
        }
    }
    fn mean(&self, x: f64) -> f64 {
        x / self.n.max(1) as f64
    }
}

fn report(
    args: &FidelityArgs,
    store: &ResultStore,
    books: &[dustin_eval::pg19::Book],
    budgets: &[(String, BudgetSpec)],
    sels: &[SelectorSpec],
) -> Result<(), CliError> {
    let uerr = |e: dustin_eval::EvalError| CliError::Usage(e.to_string());
    let (records, _warnings) = store.records::<Row>().map_err(uerr)?;
    let rows: BTreeMap<String, Row> = records.into_iter().collect();
    let mut table = Table::new([
        "ctx",
        "budget",
        "selector",
        "books",
        "top-1 agree",
        "KL(dense||sparse)",
        "ppl",
        "dense ppl",
        "KV read: selected",
        "KV read: estimation",
        "KV read: total",
        "accept len",
    ])
    .with_title(format!(
        "Fidelity of sparse verification vs dense ({} teacher-forced windows of gamma + 1 = {} tokens per book; acceptance: greedy run of {} tokens)",
        args.windows,
        args.gamma + 1,
        args.spec_tokens
    ))
    .with_precision(4);
    let mut ctxs = args.ctx.clone();
    ctxs.sort_unstable();
    ctxs.dedup();
    for &n in &ctxs {
        let mut series: Vec<(String, Vec<(f64, f64)>)> =
            sels.iter().map(|s| (s.label.clone(), Vec::new())).collect();
        for (bl, bs) in budgets {
            let budget = bs.tokens(n);
            for (si, s) in sels.iter().enumerate() {
                let mut agg = Agg::default();
                for b in books {
                    if let Some(r) = rows.get(&row_key(&b.id, n, budget, s, args)?) {
                        agg.add(r);
                    }
                }
                if agg.n == 0 {
                    continue;
                }
                let acc = (agg.acc_n > 0).then(|| agg.acc / agg.acc_n as f64);
                table
                    .push_row([
                        Cell::from(n.to_string()),
                        Cell::from(format!("{bl} ({budget})")),
                        Cell::from(s.label.clone()),
                        Cell::from(agg.n.to_string()),
                        Cell::from(agg.mean(agg.top1)),
                        Cell::from(agg.mean(agg.kl)),
                        Cell::from(agg.mean(agg.nll).exp()),
                        Cell::from(agg.mean(agg.dense_nll).exp()),
                        Cell::from(agg.mean(agg.kv_sel)),
                        Cell::from(agg.mean(agg.kv_est)),
                        Cell::from(agg.mean(agg.kv_sel + agg.kv_est)),
                        Cell::from(acc),
                    ])
                    .map_err(uerr)?;
                series[si]
                    .1
                    .push((budget as f64 / n as f64, agg.mean(agg.top1)));
            }
        }
        for (_, pts) in series.iter_mut() {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        plot_lines(
            args.out.join(format!("fidelity_ctx{n}.svg")),
            &format!("Top-1 agreement with dense verification, SmolLM2 context {n}"),
            "budget / context",
            "top-1 agreement",
            &series,
        )
        .map_err(uerr)?;
    }
    table
        .write_markdown(args.out.join("fidelity.md"))
        .map_err(uerr)?;
    table
        .write_json(args.out.join("fidelity.json"))
        .map_err(uerr)?;
    // per-book rows, for the record
    let mut per = Table::new([
        "book",
        "ctx",
        "budget",
        "selector",
        "top-1",
        "KL",
        "ppl",
        "KV total",
        "accept len",
    ])
    .with_title("Per book")
    .with_precision(4);
    for r in rows.values() {
        if !sels.iter().any(|s| s.label == r.selector) {
            continue;
        }
        per.push_row([
            Cell::from(r.book.clone()),
            Cell::from(r.ctx.to_string()),
            Cell::from(r.budget.to_string()),
            Cell::from(r.selector.clone()),
            Cell::from(r.top1),
            Cell::from(r.kl),
            Cell::from(r.nll.exp()),
            Cell::from(r.kv_selected + r.kv_estimation),
            Cell::from(r.accept_len),
        ])
        .map_err(uerr)?;
    }
    per.write_markdown(args.out.join("per_book.md"))
        .map_err(uerr)?;
    println!("{}", table.to_markdown());
    println!(
        "wrote {}",
        [
            "fidelity.md",
            "fidelity.json",
            "per_book.md",
            "results.jsonl"
        ]
        .iter()
        .map(|f| args.out.join(f).display().to_string())
        .chain(args.ctx.iter().map(|n| {
            args.out
                .join(format!("fidelity_ctx{n}.svg"))
                .display()
                .to_string()
        }))
        .collect::<Vec<_>>()
        .join(", ")
    );
    Ok(())
}

/// An evaluation draft: `(model, early-exit layers, whether it is the target itself)`.
pub(crate) type EvalDraft<B> = (Arc<Qwen2<B>>, Option<usize>, bool);

/// The draft of an evaluation run (`--draft` of `eval fidelity`, `eval pg19`, `eval
/// longbench`): `(model, early-exit layers, whether it is the target itself)`. A separate
/// draft model is built for `positions` positions and, when `tok` is given, must share its
/// vocabulary.
///
/// # Errors
/// A self-draft with too many layers, `substitute:kv=target` (the harness prefills drafts on
/// caches of their own), the model's load and vocabulary errors.
pub(crate) fn eval_draft<B: KernelOps>(
    draft: &str,
    target: &Arc<Qwen2<B>>,
    positions: usize,
    dev: &B::Device,
    tok: Option<&dustin_qwen::Tokenizer>,
) -> Result<EvalDraft<B>, CliError> {
    Ok(match parse_draft(draft)? {
        DraftSpec::SelfLayers(n) => {
            if n >= target.config.num_hidden_layers {
                return Err(CliError::Usage(format!(
                    "--draft self:layers={n}: the target has {} layers",
                    target.config.num_hidden_layers
                )));
            }
            (target.clone(), Some(n), true)
        }
        DraftSpec::Model(p) => {
            let df = ModelFiles::open(&crate::models::resolve_model_path(&p)?)?;
            if let Some(tok) = tok {
                crate::generate::check_vocab(tok, &df.tokenizer)?;
            }
            (Arc::new(df.build::<B>(positions, dev)?), None, false)
        }
        DraftSpec::Substitute(sub) if sub.target_kv => {
            return Err(CliError::Usage(
                "--draft substitute:kv=target: the evaluation harness runs the draft on its own \
                 KV cache (kv=own); kv=target is for generate and dustin-bench subspec"
                    .into(),
            ))
        }
        DraftSpec::Substitute(sub) => (Arc::new(sub.build(target)?), None, false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::{Flex, FlexDevice};
    use dustin_qwen::{QwenConfig, SafetensorsDir};

    fn tiny() -> Arc<Qwen2<Flex>> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../dustin-qwen/tests/fixtures/parity/llama");
        let cfg = QwenConfig::from_file(&dir.join("config.json")).expect("config");
        let src = SafetensorsDir::open(&dir).expect("weights");
        Arc::new(Qwen2::load(&cfg, &src, 256, &FlexDevice).expect("model"))
    }

    /// The fixed small case's options: a 1-layer self-draft, 3 windows at a context of 128,
    /// gamma 3, 6 speculative tokens.
    fn fixed_args() -> FidelityArgs {
        FidelityArgs {
            model: None,
            draft: "self:layers=1".into(),
            lookahead_layers: "all".into(),
            data: PathBuf::new(),
            books: None,
            ctx: vec![128],
            budget: vec![],
            selectors: vec![],
            knobs: vec![],
            select: vec![],
            windows: 3,
            gamma: 3,
            spec_tokens: 6,
            out: PathBuf::new(),
            device: DeviceKind::Cpu,
        }
    }

    /// The fixed small case's context: `target` drafting for itself with its first layer.
    fn fixed_ctx<'a>(args: &'a FidelityArgs, target: &Arc<Qwen2<Flex>>) -> Ctx<'a, Flex> {
        Ctx {
            args,
            target: target.clone(),
            draft: target.clone(),
            draft_layers: Some(1),
            lookahead_layers: None,
            self_draft: true,
            vocab: 96,
            capacity: 128,
            observed: 16,
        }
    }

    /// Every selector with a budget over the context is dense verification bit for bit
    /// (top-1 1, KL 0, the same acceptance length); a small budget reads about its share.
    #[test]
    fn fitting_budgets_are_dense_bit_for_bit_and_small_ones_read_their_share() {
        let target = tiny();
        let args = fixed_args();
        let cx = fixed_ctx(&args, &target);
        let ids: Vec<u32> = (0..150).map(|i| ((i * 37 + 11) % 96) as u32).collect();
        let p = 128 - 14; // extra = max(W (gamma + 1) + 1, spec + 2 (gamma + 1)) = 14
        let mut names: Vec<String> = dustin_select::names()
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.push("pyramid(dustin)".into());
        let mut pend = Vec::new();
        for (budget, label) in [(4096usize, "fits"), (80, "sparse")] {
            for name in &names {
                let sel = SelectorSpec {
                    label: name.clone(),
                    spec: name.clone(),
                    knobs: None,
                    select: None,
                };
                pend.push(Pending {
                    key: format!("{label}|{name}"),
                    budget,
                    budget_label: label.into(),
                    fid: sel.build::<Flex>(budget).unwrap(),
                    spec: None,
                    sel,
                });
            }
        }
        let mut prefix = None;
        let sh = shared_part(&cx, &ids, p, &mut pend, &mut prefix).unwrap();
        let rows: Vec<Row> = pend
            .into_iter()
            .map(|pe| run_row(&cx, &ids, p, &sh, pe, "b", 128).unwrap())
            .collect();
        let dense_tau = rows[0].accept_len.unwrap();
        for r in &rows {
            let what = format!("{} budget {}", r.selector, r.budget);
            assert_eq!(r.positions, 12, "{what}");
            assert!(
                (0.0..=1.0).contains(&r.top1) && r.kl >= -1e-6 && r.kl.is_finite(),
                "{what}"
            );
            if r.budget == 4096 || r.selector == "dense" {
                assert_eq!(r.top1, 1.0, "{what}");
                assert_eq!(r.kl, 0.0, "{what}");
                assert_eq!(r.nll, r.dense_nll, "{what}");
                assert_eq!(r.kv_selected, 1.0, "{what}");
                assert_eq!(r.kv_estimation, 0.0, "{what}");
                assert_eq!(r.accept_len, Some(dense_tau), "{what}");
            } else {
                // 80 of about 114 .. 126 context tokens, new tokens aside
                assert!(
                    r.kv_selected > 0.5 && r.kv_selected < 0.8,
                    "{what}: {}",
                    r.kv_selected
                );
            }
        }
    }

    /// The figures of a fixed small case at a budget of 80, as the harness gave them when it
    /// ran its own copies of the drafter and the verifier: the engine's drafter (teacher-forced
    /// lookaheads, speculative run) and verifier give the same selections and figures.
    #[test]
    fn sparse_figures_of_a_fixed_case_are_the_recorded_ones() {
        let target = tiny();
        let args = fixed_args();
        let cx = fixed_ctx(&args, &target);
        let ids: Vec<u32> = (0..150).map(|i| ((i * 37 + 11) % 96) as u32).collect();
        let p = 128 - 14;
        let mut names: Vec<String> = dustin_select::names()
            .iter()
            .map(|s| s.to_string())
            .collect();
        names.push("pyramid(dustin)".into());
        let mut pend = Vec::new();
        for (budget, label) in [(80usize, "sparse")] {
            for name in &names {
                let sel = SelectorSpec {
                    label: name.clone(),
                    spec: name.clone(),
                    knobs: None,
                    select: None,
                };
                let fid = sel.build::<Flex>(budget).unwrap();
                pend.push(Pending {
                    key: format!("{label}|{name}"),
                    budget,
                    budget_label: label.into(),
                    fid,
                    spec: None,
                    sel,
                });
            }
        }
        let mut prefix = None;
        let sh = shared_part(&cx, &ids, p, &mut pend, &mut prefix).unwrap();
        // (top-1 agreement, KL, mean acceptance length, iterations)
        let want: BTreeMap<&str, (f64, f64, f64, usize)> = [
            ("streaming", (2.0 / 12.0, 0.4344516880810261, 1.0, 5)),
            ("h2o", (5.0 / 12.0, 0.3254195662836234, 1.75, 4)),
            ("oracle", (7.0 / 12.0, 0.11433123013315101, 1.5, 4)),
            ("draft-only", (3.0 / 12.0, 0.2129144755502542, 1.0, 5)),
            ("dustin", (5.0 / 12.0, 0.2147403839044273, 1.25, 4)),
            ("pyramid(dustin)", (7.0 / 12.0, 0.12726490447918573, 1.2, 5)),
        ]
        .into_iter()
        .collect();
        for pe in pend {
            let r = run_row(&cx, &ids, p, &sh, pe, "b", 128).unwrap();
            let Some(&(top1, kl, tau, it)) = want.get(r.selector.as_str()) else {
                continue;
            };
            let what = &r.selector;
            assert!((r.top1 - top1).abs() < 1e-12, "{what}: top-1 {}", r.top1);
            assert!((r.kl - kl).abs() < 1e-6, "{what}: KL {}", r.kl);
            assert_eq!(r.accept_len, Some(tau), "{what}");
            assert_eq!(r.spec_iterations, Some(it), "{what}");
            assert!((r.kv_selected - 40.0 / 59.0).abs() < 1e-12, "{what}");
        }
    }

    #[test]
    fn budgets_parse_as_tokens_or_fractions() {
        assert_eq!(BudgetSpec::parse("512").unwrap().tokens(4096), 512);
        assert_eq!(BudgetSpec::parse("1/8").unwrap().tokens(4096), 512);
        assert_eq!(BudgetSpec::parse(" 1/16 ").unwrap().tokens(8192), 512);
        assert_eq!(BudgetSpec::parse("0.125").unwrap().tokens(8192), 1024);
        for bad in ["", "x", "0", "0/8", "9/8", "1.5", "-1"] {
            assert!(BudgetSpec::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn label_json_pairs_parse() {
        let m = parse_label_json("--knobs", &[r#"d2={"alpha":0.7,"beta":0.9}"#.into()]).unwrap();
        assert_eq!(m["d2"]["beta"], serde_json::json!(0.9));
        assert!(parse_label_json("--knobs", &["nojson".into()]).is_err());
    }
}
