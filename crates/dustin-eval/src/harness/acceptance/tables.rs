//! The acceptance tables, from the cells of a results store.

use std::collections::BTreeMap;
use std::path::Path;

use super::{CellRecord, DEFAULT_DRAFT};
use crate::harness::HarnessError;
use crate::report::{devices_note, Cell, ResultStore, Table};

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
    let ar: BTreeMap<(String, usize, String), &CellRecord> = recs
        .iter()
        .filter(|r| r.mode == "autoregressive")
        .map(|r| ((r.source.clone(), r.ctx, r.device.clone()), r))
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
    .with_title(format!(
        "Acceptance and decoding speed {} (speed-up: against the autoregressive row of the same prompt on the same device)",
        devices_note(recs.iter().map(|r| r.device.as_str()))
    ))
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
        // the autoregressive row of the same prompt on the same device: speeds of two
        // devices are not compared
        let base = ar.get(&(r.source.clone(), r.ctx, r.device.clone()));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Table;

    fn cell(mode: &str, selector: &str, gamma: usize, tps: f64, device: &str) -> CellRecord {
        CellRecord {
            source: "a.rs".into(),
            ctx: 4096,
            mode: mode.into(),
            draft: String::new(),
            selector: selector.into(),
            budget: String::new(),
            budget_tokens: 0,
            draft_budget: 0,
            gamma,
            temperature: 0.0,
            tokens: 8,
            iterations: 4,
            mean_acceptance_length: if gamma == 0 { 1.0 } else { 2.0 },
            acceptance_sd: 0.0,
            accepted: vec![],
            tokens_per_sec: tps,
            decode_secs: 1.0,
            draft_secs: 0.0,
            verify_secs: 0.0,
            kv_read: 1.0,
            estimation_read: 0.0,
            output: vec![1, 2, 3],
            device: device.into(),
        }
    }

    /// The speed-up of each row is over the autoregressive row of its own device, and blank
    /// where its device has none; the title names both devices.
    #[test]
    fn speed_up_is_over_the_autoregressive_row_of_the_same_device() {
        let dir = std::env::temp_dir().join(format!("dustin-acc-devices-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut store = ResultStore::open(dir.join("results.jsonl")).unwrap();
        let (cpu, gpu) = ("cpu: X, 2 threads", "cuda:0 H100");
        let cells = [
            ("ar-cpu", cell("autoregressive", "", 0, 10.0, cpu)),
            ("dense-cpu", cell("dense", "dense", 4, 15.0, cpu)),
            ("ar-gpu", cell("autoregressive", "", 0, 100.0, gpu)),
            ("dense-gpu", cell("dense", "dense", 4, 250.0, gpu)),
            (
                "dustin-h200",
                cell("dustin@1/16", "dustin", 4, 300.0, "cuda:0 H200"),
            ),
        ];
        for (k, c) in &cells {
            store.append(k, c).unwrap();
        }
        write_tables(&store, &dir).unwrap();
        let t = Table::from_json(&std::fs::read_to_string(dir.join("acceptance.json")).unwrap())
            .unwrap();
        let col = |name: &str| t.columns.iter().position(|c| c == name).unwrap();
        let (speed, tps) = (col("speed-up"), col("tokens/s"));
        let speed_of = |tokens_per_sec: f64| -> Option<f64> {
            let row = t
                .rows
                .iter()
                .find(|r| matches!(r[tps], Cell::Num(v) if v == tokens_per_sec))
                .unwrap();
            match row[speed] {
                Cell::Num(v) => Some(v),
                _ => None,
            }
        };
        assert_eq!(speed_of(15.0), Some(1.5));
        assert_eq!(speed_of(250.0), Some(2.5));
        // no autoregressive row on the H200: not compared with another card's
        assert_eq!(speed_of(300.0), None);
        let title = t.title.unwrap();
        assert!(
            title.contains("cpu: X, 2 threads (2 rows), cuda:0 H100 (2 rows), cuda:0 H200 (1 row)"),
            "{title}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
