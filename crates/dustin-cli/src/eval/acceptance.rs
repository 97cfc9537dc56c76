//! `dustin eval acceptance`: the mean acceptance length and decoding speed of a draft/target
//! pair on real prompts, per gamma, temperature, selector and budget, beside autoregressive
//! decoding of the target alone on the same prompt.
//!
//! Each source file gives one prompt per context length: the first `ctx` tokens of its text
//! (PG-19 books without their Gutenberg header). Both models prefill a prompt once
//! ([`crate::pair::SharedPrefill`]); every cell then decodes `--new-tokens` tokens through
//! the engine ([`crate::pair::run_mode`]). Each prompt's ids are written to
//! `prompts/<source>.ctx<N>.json` for reference implementations. Cells are appended to `results.jsonl` as they
//! finish, so a run stopped (Ctrl-C, `--time-limit`) resumes where it stopped; the tables
//! (`acceptance.md`, `acceptance.json`) are written from every finished cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use dustin_core::SamplingConfig;
use dustin_eval::report::{Cell, ResultStore, Table};
use dustin_kernels::KernelOps;
use serde::{Deserialize, Serialize};

use super::BudgetSpec;
use crate::backend::DeviceKind;
use crate::pair::{Mode, RunConfig, SharedPrefill};
use crate::CliError;

/// The default draft: the target's smaller sibling with the same tokenizer.
const DEFAULT_DRAFT: &str = "qwen2.5-coder-0.5b-instruct";

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
}

/// `dustin eval acceptance`.
///
/// # Errors
/// [`CliError::Usage`] for bad arguments (named), sources shorter than a context, models
/// that are not a pair; model, engine and I/O errors. Finished cells are kept in
/// `results.jsonl` whatever happens later.
pub fn acceptance<B: KernelOps>(args: &AcceptanceArgs, dev: &B::Device) -> Result<(), CliError> {
    let t0 = Instant::now();
    for &g in &args.gamma {
        crate::check_gamma(g)?;
    }
    if let Some(t) = args
        .temperature
        .iter()
        .find(|t| !(t.is_finite() && **t >= 0.0))
    {
        return Err(CliError::Usage(format!(
            "--temperature {t}: expected a finite number >= 0"
        )));
    }
    if args.new_tokens == 0 {
        return Err(CliError::Usage(
            "--new-tokens 0: expected at least 1".into(),
        ));
    }
    if let Some(l) = args.time_limit.filter(|l| !(l.is_finite() && *l >= 0.0)) {
        return Err(CliError::Usage(format!(
            "--time-limit {l}: expected a finite number of seconds >= 0"
        )));
    }
    if let Some(c) = args.ctx.iter().find(|c| **c == 0) {
        return Err(CliError::Usage(format!(
            "--ctx {c}: expected a prompt length of at least 1 token"
        )));
    }
    let budgets: Vec<(String, BudgetSpec)> = args
        .budget
        .iter()
        .map(|b| BudgetSpec::parse(b).map(|s| (b.trim().to_string(), s)))
        .collect::<Result<_, _>>()?;
    let sources = list_sources(&args.data)?;
    for sel in &args.selectors {
        crate::pair::check_selector(sel)?;
    }
    args.lookahead_layers
        .parse::<dustin_spec::LookaheadLayers>()
        .map_err(|e| {
            CliError::Usage(format!("--lookahead-layers {}: {e}", args.lookahead_layers))
        })?;
    crate::generate::draft_selection(args.draft_budget)?;
    // every selector at every budget of every context builds before any model loads
    for sel in args.selectors.iter().filter(|s| *s != "dense") {
        for &ctx in &args.ctx {
            for (given, b) in &budgets {
                crate::pair::policy::<B>(sel, b.tokens(ctx).max(1)).map_err(|e| {
                    CliError::Usage(format!(
                        "--selectors {sel} --budget {given} at --ctx {ctx}: {e}"
                    ))
                })?;
            }
        }
    }
    crate::create_out_dir(&args.out)?;
    let mut store = ResultStore::open(args.out.join("results.jsonl"))
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let max_ctx = args.ctx.iter().copied().max().unwrap_or(0);
    let max_gamma = args.gamma.iter().copied().max().unwrap_or(1);
    let extra = args.new_tokens + 2 * (max_gamma + 2);
    let files = crate::pair::PairFiles::open(&args.model, &args.draft)?;
    if max_ctx + extra > files.max_positions() {
        return Err(CliError::Usage(format!(
            "--ctx {max_ctx}: with --new-tokens {} and --gamma {max_gamma} it needs {} positions, \
             more than the models take ({})",
            args.new_tokens,
            max_ctx + extra,
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
            if ids.len() < ctx && !cells.iter().all(|(k, _, _)| store.is_done(k)) {
                return Err(CliError::Usage(format!(
                    "--data {}: {} tokens, fewer than --ctx {ctx}",
                    src.display(),
                    ids.len()
                )));
            }
        }
        ids.truncate(max_ctx);
        prompts.push((name, ids));
    }
    let pair = files.build::<B>(max_ctx + extra, dev, args.weights)?;
    eprintln!(
        "eval acceptance: {} sources x contexts {:?}; target {}, draft {}",
        sources.len(),
        args.ctx,
        args.model,
        args.draft
    );
    let res = run_cells(args, &budgets, &prompts, &pair, &mut store, extra, t0);
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

/// Runs every cell not yet in `store` on the prompts (source name, token ids at least as
/// long as each context with cells to run); `Ok(true)` when `--time-limit` stopped it
/// early.
#[allow(clippy::too_many_arguments)]
fn run_cells<B: KernelOps>(
    args: &AcceptanceArgs,
    budgets: &[(String, BudgetSpec)],
    prompts: &[(String, Vec<u32>)],
    pair: &crate::pair::Pair<B>,
    store: &mut ResultStore,
    extra: usize,
    t0: Instant,
) -> Result<bool, CliError> {
    let mut stopped = false;
    'outer: for (name, all) in prompts {
        let name = name.as_str();
        for &ctx in &args.ctx {
            let cells = cells_of(args, budgets, name, ctx);
            if cells.iter().all(|(k, _, _)| store.is_done(k)) {
                continue;
            }
            write_prompt(&args.out, name, &all[..ctx])?;
            let prefill = SharedPrefill::new(pair, all[..ctx].to_vec(), extra)?;
            eprintln!(
                "{name} at {ctx} tokens: shared prefill of {} tokens, target {:.1} s, draft {:.1} s",
                prefill.shared_tokens(),
                prefill.target_secs,
                prefill.draft_secs
            );
            for (key, mode, run) in cells {
                if store.is_done(&key) {
                    continue;
                }
                if args
                    .time_limit
                    .is_some_and(|l| t0.elapsed().as_secs_f64() > l)
                {
                    stopped = true;
                    break 'outer;
                }
                let out = crate::pair::run_mode(pair, &prefill, &mode, &run, &mut |_, _| {})?;
                let mut rec = record(name, ctx, &mode, &run, budgets, &out);
                rec.draft = args.draft.clone();
                eprintln!(
                    "  {key}: acceptance length {:.2}, {:.2} tokens/s",
                    rec.mean_acceptance_length, rec.tokens_per_sec
                );
                store
                    .append(&key, &rec)
                    .map_err(|e| CliError::Usage(e.to_string()))?;
            }
        }
    }
    Ok(stopped)
}

/// Writes a prompt's token ids to `out/prompts/<source>.ctx<N>.json` (a JSON array), so
/// that a reference implementation (`scripts/hf_acceptance.py`) runs the same prompt.
fn write_prompt(out: &Path, source: &str, ids: &[u32]) -> Result<(), CliError> {
    let dir = out.join("prompts");
    let path = dir.join(format!("{source}.ctx{}.json", ids.len()));
    let io = |source| CliError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let json = serde_json::to_string(ids).map_err(|e| CliError::Usage(e.to_string()))?;
    std::fs::write(&path, json).map_err(io)
}

/// Every file of `data` (folders: their files in name order).
fn list_sources(data: &[PathBuf]) -> Result<Vec<PathBuf>, CliError> {
    let mut out = Vec::new();
    for d in data {
        let io = |source| CliError::Io {
            path: d.display().to_string(),
            source,
        };
        if d.is_dir() {
            let mut files: Vec<PathBuf> = std::fs::read_dir(d)
                .map_err(io)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            files.sort();
            out.extend(files);
        } else if d.is_file() {
            out.push(d.clone());
        } else {
            return Err(CliError::Usage(format!(
                "--data {}: no such file or folder",
                d.display()
            )));
        }
    }
    if out.is_empty() {
        return Err(CliError::Usage("--data: no files".into()));
    }
    // cells are stored by file name: one file given twice runs once, two files of one
    // name are refused
    let mut seen: BTreeMap<std::ffi::OsString, PathBuf> = BTreeMap::new();
    let mut unique = Vec::with_capacity(out.len());
    for p in out {
        let name = p.file_name().unwrap_or(p.as_os_str()).to_os_string();
        match seen.get(&name) {
            Some(q) if same_file(q, &p) => {}
            Some(q) => {
                return Err(CliError::Usage(format!(
                    "--data: {} and {} have the same file name, which keys their cells in \
                     results.jsonl; expected sources of distinct file names",
                    q.display(),
                    p.display()
                )))
            }
            None => {
                seen.insert(name, p.clone());
                unique.push(p);
            }
        }
    }
    Ok(unique)
}

/// Whether `a` and `b` name the same file (compared canonically, else as given).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// A source's text: UTF-8, without a Gutenberg header and footer where it has them.
fn read_source(path: &Path) -> Result<String, CliError> {
    let raw = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::InvalidData {
            CliError::Usage(format!(
                "--data {}: not UTF-8 text (expected a text file)",
                path.display()
            ))
        } else {
            CliError::Io {
                path: path.display().to_string(),
                source,
            }
        }
    })?;
    Ok(dustin_eval::pg19::strip_gutenberg(&raw).text)
}

/// The cells of one prompt, in run order: the autoregressive row, then per temperature and
/// gamma the dense row and each selector at each budget. Each with its store key.
fn cells_of(
    args: &AcceptanceArgs,
    budgets: &[(String, BudgetSpec)],
    source: &str,
    ctx: usize,
) -> Vec<(String, Mode, RunConfig)> {
    let base = |gamma: usize, temperature: f32| RunConfig {
        gamma,
        max_new_tokens: args.new_tokens,
        sampling: if temperature == 0.0 {
            SamplingConfig::greedy()
        } else {
            SamplingConfig {
                temperature,
                ..SamplingConfig::greedy()
            }
        },
        seed: args.seed,
        lookahead_layers: args.lookahead_layers.clone(),
    };
    let mut out = Vec::new();
    if !args.no_autoregressive {
        out.push((
            format!("{source}|ctx={ctx}|autoregressive|n={}", args.new_tokens),
            Mode::Autoregressive,
            base(1, 0.0),
        ));
    }
    for &t in &args.temperature {
        for &g in &args.gamma {
            for sel in &args.selectors {
                let modes: Vec<Mode> = if sel == "dense" {
                    vec![Mode::Speculative {
                        selector: "dense".into(),
                        budget: ctx,
                        draft_budget: args.draft_budget,
                    }]
                } else {
                    budgets
                        .iter()
                        .map(|(_, b)| Mode::Speculative {
                            selector: sel.clone(),
                            budget: b.tokens(ctx).max(1),
                            draft_budget: args.draft_budget,
                        })
                        .collect()
                };
                for m in modes {
                    let mut key = format!(
                        "{source}|ctx={ctx}|{}|g={g}|t={t}|n={}",
                        m.label(),
                        args.new_tokens
                    );
                    if t > 0.0 {
                        key += &format!("|seed={}", args.seed);
                    }
                    if args.lookahead_layers != "half" {
                        key += &format!("|la={}", args.lookahead_layers);
                    }
                    if args.draft != DEFAULT_DRAFT {
                        key += &format!("|draft={}", args.draft);
                    }
                    out.push((key, m, base(g, t)));
                }
            }
        }
    }
    out
}

/// The stored record of one finished cell.
fn record(
    source: &str,
    ctx: usize,
    mode: &Mode,
    run: &RunConfig,
    budgets: &[(String, BudgetSpec)],
    out: &dustin_spec::SpecOutput,
) -> CellRecord {
    let s = &out.summary;
    let lens: Vec<f64> = out
        .iterations
        .iter()
        .flat_map(|it| it.accepted.iter().map(|&a| a as f64 + 1.0))
        .collect();
    let n = lens.len().max(1) as f64;
    let mean = lens.iter().sum::<f64>() / n;
    let sd = (lens.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0)).sqrt();
    let (selector, budget, budget_tokens, draft_budget, gamma) = match mode {
        Mode::Autoregressive => (String::new(), String::new(), 0, 0, 0),
        Mode::Speculative {
            selector,
            budget,
            draft_budget,
        } => {
            let given = budgets
                .iter()
                .find(|(_, b)| b.tokens(ctx).max(1) == *budget && selector != "dense")
                .map_or_else(String::new, |(g, _)| g.clone());
            let tokens = if selector == "dense" { 0 } else { *budget };
            (selector.clone(), given, tokens, *draft_budget, run.gamma)
        }
    };
    CellRecord {
        source: source.to_string(),
        ctx,
        mode: mode.label(),
        draft: String::new(),
        selector,
        budget,
        budget_tokens,
        draft_budget,
        gamma,
        temperature: run.sampling.temperature,
        tokens: s.generated_tokens,
        iterations: s.iterations,
        mean_acceptance_length: s.mean_acceptance_length,
        acceptance_sd: sd,
        accepted: out
            .iterations
            .iter()
            .filter_map(|it| it.accepted.first().copied())
            .collect(),
        tokens_per_sec: s.tokens_per_sec,
        decode_secs: s.decode_secs,
        draft_secs: s.draft_secs,
        verify_secs: s.verify_secs,
        kv_read: s.mean_kv_read_fraction,
        estimation_read: s.mean_estimation_read_fraction,
        output: out.tokens.first().cloned().unwrap_or_default(),
    }
}

/// Writes acceptance.md and acceptance.json from every finished cell of the store: one row
/// per cell, with the autoregressive speed of the same prompt, the speed-up over it, the
/// acceptance length relative to the dense row of the same prompt, gamma and temperature,
/// and (greedy) the tokens equal to the autoregressive output before the first difference.
///
/// # Errors
/// I/O errors writing the tables.
pub fn write_tables(store: &ResultStore, out: &Path) -> Result<(), CliError> {
    let (records, _) = store
        .records::<CellRecord>()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    // lines that are no JSON were named when the store opened; records of another shape
    // are named here
    let (all, _) = store
        .records::<serde_json::Value>()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    if all.len() > records.len() {
        let bad: Vec<&str> = all
            .iter()
            .filter(|(_, v)| serde_json::from_value::<CellRecord>(v.clone()).is_err())
            .map(|(k, _)| k.as_str())
            .collect();
        eprintln!(
            "warning: {}: {} stored cells are not acceptance cells and are left out of the tables: {}",
            store.path().display(),
            bad.len(),
            bad.join(", ")
        );
    }
    let recs: Vec<CellRecord> = records.into_iter().map(|(_, r)| r).collect();
    let ar: BTreeMap<(String, usize), &CellRecord> = recs
        .iter()
        .filter(|r| r.mode == "autoregressive")
        .map(|r| ((r.source.clone(), r.ctx), r))
        .collect();
    let dense: BTreeMap<(String, usize, usize, String, usize), &CellRecord> = recs
        .iter()
        .filter(|r| r.selector == "dense" && (r.draft.is_empty() || r.draft == DEFAULT_DRAFT))
        .map(|r| {
            (
                (
                    r.source.clone(),
                    r.ctx,
                    r.gamma,
                    r.temperature.to_string(),
                    r.draft_budget,
                ),
                r,
            )
        })
        .collect();
    let mut table = Table::new([
        "source",
        "ctx",
        "mode",
        "gamma",
        "temperature",
        "tokens",
        "mean acceptance length",
        "95% CI ±",
        "vs dense",
        "tokens/s",
        "autoregressive tokens/s",
        "speed-up",
        "KV read",
        "+ estimation",
        "same as autoregressive (tokens)",
    ])
    .with_precision(3);
    let mut rows: Vec<&CellRecord> = recs.iter().collect();
    rows.sort_by(|a, b| {
        (&a.source, a.ctx, a.temperature.to_bits(), a.gamma, &a.mode).cmp(&(
            &b.source,
            b.ctx,
            b.temperature.to_bits(),
            b.gamma,
            &b.mode,
        ))
    });
    for r in rows {
        let base = ar.get(&(r.source.clone(), r.ctx));
        let d = dense.get(&(
            r.source.clone(),
            r.ctx,
            r.gamma,
            r.temperature.to_string(),
            r.draft_budget,
        ));
        let ci = 1.96 * r.acceptance_sd / (r.iterations.max(1) as f64).sqrt();
        let same = match base {
            Some(a) if r.temperature == 0.0 => Cell::Text(
                r.output
                    .iter()
                    .zip(&a.output)
                    .take_while(|(x, y)| x == y)
                    .count()
                    .to_string(),
            ),
            _ => Cell::Empty,
        };
        let num = |v: Option<f64>| v.map_or(Cell::Empty, Cell::Num);
        table
            .push_row([
                Cell::Text(r.source.clone()),
                Cell::Text(r.ctx.to_string()),
                Cell::Text(
                    if r.draft.is_empty() || r.draft == DEFAULT_DRAFT || r.gamma == 0 {
                        r.mode.clone()
                    } else {
                        format!("{}, draft {}", r.mode, r.draft)
                    },
                ),
                Cell::Text(if r.gamma == 0 {
                    String::new()
                } else {
                    r.gamma.to_string()
                }),
                Cell::Num(r.temperature as f64),
                Cell::Text(r.tokens.to_string()),
                Cell::Num(r.mean_acceptance_length),
                if r.gamma == 0 {
                    Cell::Empty
                } else {
                    Cell::Num(ci)
                },
                num(d.map(|d| r.mean_acceptance_length / d.mean_acceptance_length.max(1e-9))),
                Cell::Num(r.tokens_per_sec),
                num(base.map(|a| a.tokens_per_sec)),
                num(base.map(|a| r.tokens_per_sec / a.tokens_per_sec.max(1e-9))),
                Cell::Num(r.kv_read),
                Cell::Num(r.estimation_read),
                same,
            ])
            .map_err(|e| CliError::Usage(e.to_string()))?;
    }
    let md = out.join("acceptance.md");
    table
        .write_markdown(&md)
        .and_then(|_| table.write_json(out.join("acceptance.json")))
        .map_err(|e| CliError::Usage(format!("{}: {e}", md.display())))?;
    eprintln!("wrote {} ({} cells)", md.display(), recs.len());
    Ok(())
}
