//! The LongBench tables and plot, from the rows of a results store.

use std::collections::BTreeMap;

use super::runs::{clip, KeyBase, Row, RunSpec};
use super::{check_task, LongBenchOptions};
use crate::harness::selectors::BudgetSpec;
use crate::harness::HarnessError;
use crate::longbench::Sample;
use crate::metrics;
use crate::report::{devices_note, plot_lines, Cell, ResultStore, Table};

// ------------------------------------------------------------------------------- report

/// Means over the samples of one (task, run).
#[derive(Debug, Default, Clone)]
pub(super) struct Agg {
    pub(super) n: usize,
    pub(super) scores: Vec<f64>,
    pub(super) same_as_dense: usize,
    pub(super) with_dense: usize,
    pub(super) new_tokens: f64,
    pub(super) accept: f64,
    pub(super) kv: f64,
    pub(super) secs: f64,
}

impl Agg {
    fn mean(&self, x: f64) -> f64 {
        x / self.n.max(1) as f64
    }
}

/// Writes the LongBench tables and plot from the rows of `store` and prints the table.
pub(super) fn report(
    args: &LongBenchOptions,
    store: &ResultStore,
    kb: &KeyBase<'_>,
    chosen: &[(String, Vec<Sample>)],
    runs: &[RunSpec],
    budgets: &[(String, BudgetSpec)],
) -> Result<(), HarnessError> {
    let uerr = |e: crate::EvalError| HarnessError::Usage(e.to_string());
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
        "LongBench, context {}, greedy speculative decoding (gamma {}, draft {}), score = LongBench metric x 100; the store's rows ran {}",
        kb.ctx,
        args.gamma,
        args.models.draft,
        devices_note(rows.values().map(|r| r.device.as_str()))
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
    crate::harness::print_line(&table.to_markdown());
    crate::harness::print_line(&format!(
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
    ));
    Ok(())
}

fn budget_cell(r: &RunSpec) -> String {
    match r.budget {
        None => "full".into(),
        Some(b) => format!("{} ({b})", r.budget_label),
    }
}
