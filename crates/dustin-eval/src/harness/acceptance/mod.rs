//! The acceptance harness (`dustin eval acceptance`): the mean acceptance length and
//! decoding speed of a draft/target pair on real prompts, per gamma, temperature, selector
//! and budget, beside autoregressive decoding of the target alone on the same prompt.
//!
//! Each source file gives one prompt per context length: the first `ctx` tokens of its text
//! (PG-19 books without their Gutenberg header). Both models prefill a prompt once
//! ([`SharedPrefill`]); every cell then decodes `new_tokens` tokens through the engine
//! ([`run_mode`](crate::harness::pair::run_mode)). Each prompt's ids are written to
//! `prompts/<source>.ctx<N>.json` for reference implementations. Cells are appended to
//! `results.jsonl` as they finish, so a run stopped (Ctrl-C, `time_limit`) resumes where it
//! stopped; the tables (`acceptance.md`, `acceptance.json`) are written from every finished
//! cell ([`write_tables`]).

use std::path::PathBuf;
use std::time::Instant;

use dustin_kernels::KernelOps;
use serde::{Deserialize, Serialize};

use super::pair::{Pair, SharedPrefill};
use super::selectors::{budget_specs, BudgetSpec};
use super::{check_gamma, open_store, HarnessError, ModelHost, PairSource};
use crate::report::ResultStore;
use cells::{cells_of, list_sources, read_source, record, same_file, write_prompt};

mod cells;
mod tables;

pub use tables::write_tables;

/// The default draft: the target's smaller sibling with the same tokenizer. Cells of another
/// draft carry it in their keys.
pub const DEFAULT_DRAFT: &str = "qwen2.5-coder-0.5b-instruct";

/// The options of an acceptance run (the flags of `dustin eval acceptance`, less the
/// device and the weight format, which the host applies when it loads the pair).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct AcceptanceOptions {
    /// Target model: a model name (`dustin fetch-model --list`) or a path.
    #[cfg_attr(
        feature = "clap",
        arg(long, default_value = "qwen2.5-coder-1.5b-instruct")
    )]
    pub model: String,
    /// Draft model: a model name or a path (same tokenizer as the target).
    /// `substitute[:bits=B][:group=G][:layers=L]` is the target's own SubSpec substitute.
    #[cfg_attr(feature = "clap", arg(long, default_value = DEFAULT_DRAFT))]
    pub draft: String,
    /// Prompt sources (comma-separated): text files, or folders whose files are each one
    /// source. PG-19 books lose their Gutenberg header and footer first.
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ',', required = true))]
    pub data: Vec<PathBuf>,
    /// Prompt lengths in tokens (comma-separated): each source's first `ctx` tokens.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "4096")
    )]
    pub ctx: Vec<usize>,
    /// Draft tokens per iteration (comma-separated, each 1..=15).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "4")
    )]
    pub gamma: Vec<usize>,
    /// Sampling temperatures (comma-separated; 0 is greedy).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "0")
    )]
    pub temperature: Vec<f32>,
    /// Verification modes (comma-separated): `dense`, or a selector of the registry
    /// (dustin, streaming, h2o, snapkv, quest, oracle, ...) at each `--budget`.
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "dense")
    )]
    pub selectors: Vec<String>,
    /// Budgets of the sparse modes (comma-separated): tokens (`512`) or fractions of the
    /// prompt (`1/16`, `0.125`).
    #[cfg_attr(
        feature = "clap",
        arg(long, value_delimiter = ',', default_value = "1/16")
    )]
    pub budget: Vec<String>,
    /// Tokens the draft attends to per layer and KV head (0: dense drafting).
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub draft_budget: usize,
    /// Tokens generated per cell.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 64))]
    pub new_tokens: usize,
    /// Skip the autoregressive row of each prompt (its tokens/s is the speed-up's base).
    #[cfg_attr(feature = "clap", arg(long))]
    pub no_autoregressive: bool,
    /// Draft layers whose attention makes the lookahead (`half`, `all`, `stride:S`,
    /// `last:N` or a list of indices).
    #[cfg_attr(feature = "clap", arg(long, default_value = "half"))]
    pub lookahead_layers: String,
    /// Seed of the sampled cells.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub seed: u64,
    /// Stop starting new cells after this many seconds (the run resumes from its results).
    #[cfg_attr(feature = "clap", arg(long))]
    pub time_limit: Option<f64>,
    /// Output folder: results.jsonl (resumable), acceptance.md, acceptance.json.
    #[cfg_attr(feature = "clap", arg(long, default_value = "out/acceptance"))]
    pub out: PathBuf,
}

/// One finished cell, as stored in `results.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellRecord {
    /// Source file name.
    pub source: String,
    /// Prompt tokens.
    pub ctx: usize,
    /// Mode label (`autoregressive`, `dense`, `<selector>@<budget>`).
    pub mode: String,
    /// The draft (`--draft`).
    #[serde(default)]
    pub draft: String,
    /// Selector (`dense` for dense verification, empty for autoregressive decoding).
    pub selector: String,
    /// The budget as given (`1/16`), empty for dense modes.
    pub budget: String,
    /// Budget in tokens per layer and KV head (0 for dense modes).
    pub budget_tokens: usize,
    /// Draft budget (0: dense drafting).
    pub draft_budget: usize,
    /// Gamma (0 for autoregressive decoding).
    pub gamma: usize,
    /// Temperature.
    pub temperature: f32,
    /// Generated tokens.
    pub tokens: usize,
    /// Verification iterations.
    pub iterations: usize,
    /// Mean tokens per verification (accepted drafts + 1).
    pub mean_acceptance_length: f64,
    /// Standard deviation of the tokens per verification over iterations.
    pub acceptance_sd: f64,
    /// Drafts accepted at each verification, in order (the acceptance trace; empty in
    /// records written before it was kept). `dustin-bench e2e --acceptance-trace` replays it.
    #[serde(default)]
    pub accepted: Vec<usize>,
    /// Decode tokens per second.
    pub tokens_per_sec: f64,
    /// Decode seconds; drafting and verification seconds within them.
    pub decode_secs: f64,
    /// Seconds drafting.
    pub draft_secs: f64,
    /// Seconds verifying.
    pub verify_secs: f64,
    /// KV fraction read by the verification.
    pub kv_read: f64,
    /// KV fraction read by the selector's estimation.
    pub estimation_read: f64,
    /// The generated token ids.
    pub output: Vec<u32>,
    /// Where the cell ran ([`KernelBackend::device_description`](dustin_kernels::KernelBackend::device_description));
    /// empty in records stored before it was kept.
    #[serde(default)]
    pub device: String,
}

/// Runs `dustin eval acceptance`: every cell not yet in the results store of `args.out`,
/// then the tables (also when a cell failed, from the cells that finished).
///
/// # Errors
/// [`HarnessError::Usage`] for bad arguments (named), sources shorter than a context, models
/// that are not a pair; model, engine and I/O errors. Finished cells are kept in
/// `results.jsonl` whatever happens later.
pub fn run<B: KernelOps, H: ModelHost>(
    args: &AcceptanceOptions,
    dev: &B::Device,
    host: &H,
) -> Result<(), HarnessError> {
    let t0 = Instant::now();
    for &g in &args.gamma {
        check_gamma(g)?;
    }
    if let Some(t) = args
        .temperature
        .iter()
        .find(|t| !(t.is_finite() && **t >= 0.0))
    {
        return Err(HarnessError::Usage(format!(
            "--temperature {t}: expected a finite number >= 0"
        )));
    }
    if args.new_tokens == 0 {
        return Err(HarnessError::Usage(
            "--new-tokens 0: expected at least 1".into(),
        ));
    }
    if let Some(l) = args.time_limit.filter(|l| !(l.is_finite() && *l >= 0.0)) {
        return Err(HarnessError::Usage(format!(
            "--time-limit {l}: expected a finite number of seconds >= 0"
        )));
    }
    if let Some(c) = args.ctx.iter().find(|c| **c == 0) {
        return Err(HarnessError::Usage(format!(
            "--ctx {c}: expected a prompt length of at least 1 token"
        )));
    }
    let budgets = budget_specs(&args.budget)?;
    // reports written into a --data folder would be read back as sources by the next run
    if let Some(d) = args
        .data
        .iter()
        .find(|d| d.is_dir() && same_file(d, &args.out))
    {
        return Err(HarnessError::Usage(format!(
            "--out {}: is the --data folder {}; expected another folder (its reports would be \
             read as sources by the next run)",
            args.out.display(),
            d.display()
        )));
    }
    let sources = list_sources(&args.data)?;
    for sel in &args.selectors {
        super::pair::check_selector(sel)?;
    }
    args.lookahead_layers
        .parse::<dustin_spec::LookaheadLayers>()
        .map_err(|e| {
            HarnessError::Usage(format!("--lookahead-layers {}: {e}", args.lookahead_layers))
        })?;
    super::pair::draft_selection(args.draft_budget)?;
    // every selector at every budget of every context builds before any model loads
    for sel in args.selectors.iter().filter(|s| *s != "dense") {
        for &ctx in &args.ctx {
            for (given, b) in &budgets {
                super::pair::policy::<B>(sel, b.tokens(ctx).max(1)).map_err(|e| {
                    HarnessError::Usage(format!(
                        "--selectors {sel} --budget {given} at --ctx {ctx}: {e}"
                    ))
                })?;
            }
        }
    }
    let mut store = open_store(&args.out)?;
    // stored lines of a cell's key that are no cell (a hand edit, another tool): run again
    let redo = malformed_cells(&store)?;
    let done = |store: &ResultStore, k: &str| store.is_done(k) && !redo.contains(k);
    let max_ctx = args.ctx.iter().copied().max().unwrap_or(0);
    let max_gamma = args.gamma.iter().copied().max().unwrap_or(1);
    let extra = args
        .new_tokens
        .saturating_add(2usize.saturating_mul(max_gamma.saturating_add(2)));
    let files = host.open_pair(&args.model, &args.draft)?;
    if max_ctx.saturating_add(extra) > files.max_positions() {
        return Err(HarnessError::Usage(format!(
            "--ctx {max_ctx}: with --new-tokens {} and --gamma {max_gamma} it needs {} positions, \
             more than the models take ({})",
            args.new_tokens,
            max_ctx as u128 + extra as u128,
            files.max_positions()
        )));
    }
    // every source is read, tokenized and checked against the contexts it still has cells
    // at before the models load
    let mut prompts = Vec::with_capacity(sources.len());
    for src in &sources {
        let name = src
            .file_name()
            .map_or_else(|| src.display().to_string(), |n| n.to_string_lossy().into());
        let mut ids = files.tokenizer().encode(&read_source(src)?)?;
        for &ctx in &args.ctx {
            let cells = cells_of(args, &budgets, &name, ctx);
            if ids.len() < ctx && !cells.iter().all(|(k, _, _)| done(&store, k)) {
                return Err(HarnessError::Usage(format!(
                    "--data {}: {} tokens, fewer than --ctx {ctx}",
                    src.display(),
                    ids.len()
                )));
            }
        }
        ids.truncate(max_ctx);
        prompts.push((name, ids));
    }
    let pair = files.build::<B>(max_ctx + extra, dev)?;
    eprintln!(
        "eval acceptance: {} sources x contexts {:?}; target {}, draft {}",
        sources.len(),
        args.ctx,
        args.model,
        args.draft
    );
    let res = run_cells(
        args, &budgets, &prompts, &pair, &mut store, &done, extra, t0,
    );
    // the tables hold every finished cell, also when a later one failed
    write_tables(&store, &args.out)?;
    if res? {
        eprintln!(
            "stopped after --time-limit; run the same command again to go on from {}",
            store.path().display()
        );
    }
    Ok(())
}

/// The keys of `store` whose value is no [`CellRecord`]: such a cell is computed again
/// (its new line replaces the old one, the last value of a key winning).
///
/// # Errors
/// The store file cannot be read.
fn malformed_cells(
    store: &ResultStore,
) -> Result<std::collections::BTreeSet<String>, HarnessError> {
    let (all, _) = store
        .records::<serde_json::Value>()
        .map_err(|e| HarnessError::Usage(e.to_string()))?;
    Ok(all
        .into_iter()
        .filter(|(_, v)| serde_json::from_value::<CellRecord>(v.clone()).is_err())
        .map(|(k, _)| k)
        .collect())
}

/// Runs every cell not yet in `store` (or stored malformed, `done` false) on the prompts (source name, token ids at least as
/// long as each context with cells to run); `Ok(true)` when `--time-limit` stopped it
/// early.
#[allow(clippy::too_many_arguments)]
fn run_cells<B: KernelOps>(
    args: &AcceptanceOptions,
    budgets: &[(String, BudgetSpec)],
    prompts: &[(String, Vec<u32>)],
    pair: &Pair<B>,
    store: &mut ResultStore,
    done: &dyn Fn(&ResultStore, &str) -> bool,
    extra: usize,
    t0: Instant,
) -> Result<bool, HarnessError> {
    let mut stopped = false;
    let device = B::device_description(pair.target.device());
    'outer: for (name, all) in prompts {
        let name = name.as_str();
        for &ctx in &args.ctx {
            let cells = cells_of(args, budgets, name, ctx);
            if cells.iter().all(|(k, _, _)| done(store, k)) {
                continue;
            }
            write_prompt(&args.out, name, &all[..ctx])?;
            let prefill = SharedPrefill::new(pair, all[..ctx].to_vec(), extra)?;
            if prefill.shared_tokens() == 0 {
                eprintln!("{name} at {ctx} tokens: no shared prefill (the prompt fits in one prefill chunk, which each cell runs itself)");
            } else {
                eprintln!(
                    "{name} at {ctx} tokens: shared prefill of {} tokens, target {:.1} s, draft {:.1} s",
                    prefill.shared_tokens(),
                    prefill.target_secs,
                    prefill.draft_secs
                );
            }
            for (key, mode, run) in cells {
                if done(store, &key) {
                    continue;
                }
                if args
                    .time_limit
                    .is_some_and(|l| t0.elapsed().as_secs_f64() > l)
                {
                    stopped = true;
                    break 'outer;
                }
                let out = super::pair::run_mode(pair, &prefill, &mode, &run, &mut |_, _| {})?;
                let mut rec = record(name, ctx, &mode, &run, budgets, &out);
                rec.draft = args.draft.clone();
                rec.device = device.clone();
                eprintln!(
                    "  {key}: acceptance length {:.2}, {:.2} tokens/s",
                    rec.mean_acceptance_length, rec.tokens_per_sec
                );
                store
                    .append(&key, &rec)
                    .map_err(|e| HarnessError::Usage(e.to_string()))?;
            }
        }
    }
    Ok(stopped)
}
