//! The sources, prompts and cells of an acceptance run, and the record of a finished cell.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dustin_core::SamplingConfig;

use super::{AcceptanceOptions, CellRecord, DEFAULT_DRAFT};
use crate::harness::pair::{Mode, RunConfig};
use crate::harness::selectors::BudgetSpec;
use crate::harness::HarnessError;

/// Writes a prompt's token ids to `out/prompts/<source>.ctx<N>.json` (a JSON array), so
/// that a reference implementation (`scripts/hf_acceptance.py`) runs the same prompt.
pub(super) fn write_prompt(out: &Path, source: &str, ids: &[u32]) -> Result<(), HarnessError> {
    let dir = out.join("prompts");
    let path = dir.join(format!("{source}.ctx{}.json", ids.len()));
    let io = |source| HarnessError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(&dir).map_err(io)?;
    let json = serde_json::to_string(ids).map_err(|e| HarnessError::Usage(e.to_string()))?;
    std::fs::write(&path, json).map_err(io)
}

/// Every file of `data` (folders: their files in name order).
pub(super) fn list_sources(data: &[PathBuf]) -> Result<Vec<PathBuf>, HarnessError> {
    let mut out = Vec::new();
    for d in data {
        let io = |source| HarnessError::Io {
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
            return Err(HarnessError::Usage(format!(
                "--data {}: no such file or folder",
                d.display()
            )));
        }
    }
    if out.is_empty() {
        return Err(HarnessError::Usage("--data: no files".into()));
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
                return Err(HarnessError::Usage(format!(
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

/// Whether `a` and `b` name the same file or folder (compared canonically, else as given).
pub(super) fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// A source's text: UTF-8, without a Gutenberg header and footer where it has them.
pub(super) fn read_source(path: &Path) -> Result<String, HarnessError> {
    let raw = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::InvalidData {
            HarnessError::Usage(format!(
                "--data {}: not UTF-8 text (expected a text file)",
                path.display()
            ))
        } else {
            HarnessError::Io {
                path: path.display().to_string(),
                source,
            }
        }
    })?;
    Ok(crate::pg19::strip_gutenberg(&raw).text)
}

/// The cells of one prompt, in run order: the autoregressive row, then per temperature and
/// gamma the dense row and each selector at each budget. Each with its store key.
pub(super) fn cells_of(
    args: &AcceptanceOptions,
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
pub(super) fn record(
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
        device: String::new(),
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
