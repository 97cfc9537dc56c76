//! The acceptance tables, from the cells of a results store.

use std::collections::BTreeMap;
use std::path::Path;

use super::{CellRecord, DEFAULT_DRAFT};
use crate::harness::HarnessError;
use crate::report::{Cell, ResultStore, Table};

/// Writes acceptance.md and acceptance.json from every finished cell of the store: one row
/// per cell, with the autoregressive speed of the same prompt, the speed-up over it, the
/// acceptance length relative to the dense row of the same prompt, gamma and temperature,
/// and (greedy) the tokens equal to the autoregressive output before the first difference.
///
/// # Errors
/// I/O errors writing the tables.
pub fn write_tables(store: &ResultStore, out: &Path) -> Result<(), HarnessError> {
    let (records, _) = store
        .records::<CellRecord>()
        .map_err(|e| HarnessError::Usage(e.to_string()))?;
    // lines that are no JSON were named when the store opened; records of another shape
    // are named here
    let (all, _) = store
        .records::<serde_json::Value>()
        .map_err(|e| HarnessError::Usage(e.to_string()))?;
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
            .map_err(|e| HarnessError::Usage(e.to_string()))?;
    }
    let md = out.join("acceptance.md");
    table
        .write_markdown(&md)
        .and_then(|_| table.write_json(out.join("acceptance.json")))
        .map_err(|e| HarnessError::Usage(format!("{}: {e}", md.display())))?;
    eprintln!("wrote {} ({} cells)", md.display(), recs.len());
    Ok(())
}
