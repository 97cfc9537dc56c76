//! The fidelity tables and plots, from the rows of a results store.

use std::collections::BTreeMap;

use super::{row_key, FidelityOptions, Row};
use crate::harness::selectors::{BudgetSpec, SelectorSpec};
use crate::harness::HarnessError;
use crate::report::{plot_lines, Cell, ResultStore, Table};

/// Means of a group of rows (one per book).
#[derive(Debug, Default)]
pub(crate) struct Agg {
    pub(crate) n: usize,
    pub(crate) top1: f64,
    pub(crate) kl: f64,
    pub(crate) nll: f64,
    pub(crate) dense_nll: f64,
    pub(crate) kv_sel: f64,
    pub(crate) kv_est: f64,
    pub(crate) acc: f64,
    pub(crate) acc_n: usize,
}

impl Agg {
    /// Adds one row.
    pub(crate) fn add(&mut self, r: &Row) {
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
    /// `x` (a sum over the rows) over the rows.
    pub(crate) fn mean(&self, x: f64) -> f64 {
        x / self.n.max(1) as f64
    }
}

/// Writes the fidelity tables and plots of `args` from the rows of `store`, and prints the
/// table.
pub(crate) fn report(
    args: &FidelityOptions,
    store: &ResultStore,
    books: &[crate::pg19::Book],
    budgets: &[(String, BudgetSpec)],
    sels: &[SelectorSpec],
) -> Result<(), HarnessError> {
    let uerr = |e: crate::EvalError| HarnessError::Usage(e.to_string());
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
