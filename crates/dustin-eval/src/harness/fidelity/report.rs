//! The fidelity tables and plots, from the rows of a results store.

use std::collections::BTreeMap;

use super::summary::{accept_ratio, at_reads, summarize, Est, Summary};
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

/// The selector whose total read at the smallest budget sets the level of the equal-reads
/// table.
const EQUAL_READS_REFERENCE: &str = "dustin";

/// Every cell of `args` found in `rows`, by context, budget (in `budgets` order) and
/// selector (in `sels` order).
fn cells(
    args: &FidelityOptions,
    rows: &BTreeMap<String, Row>,
    books: &[crate::pg19::Book],
    budgets: &[(String, BudgetSpec)],
    sels: &[SelectorSpec],
) -> Result<Vec<Summary>, HarnessError> {
    let mut ctxs = args.rows.ctx.clone();
    ctxs.sort_unstable();
    ctxs.dedup();
    let mut out = Vec::new();
    for &n in &ctxs {
        for (_, bs) in budgets {
            let budget = bs.tokens(n);
            for s in sels {
                let mut got = Vec::new();
                for b in books {
                    if let Some(r) = rows.get(&row_key(&b.id, n, budget, s, args)?) {
                        got.push(r);
                    }
                }
                if got.is_empty() {
                    continue;
                }
                out.push(summarize(&got).map_err(|e| {
                    HarnessError::Usage(format!("ctx {n} budget {budget} {}: {e}", s.label))
                })?);
            }
        }
    }
    Ok(out)
}

/// The dense cell of `s`'s context with the most speculative iterations (the reference of the
/// acceptance ratio).
fn dense_of<'a>(all: &'a [Summary], s: &Summary) -> Option<&'a Summary> {
    all.iter()
        .filter(|d| d.ctx == s.ctx && d.selector == "dense")
        .max_by_key(|d| d.iterations)
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
    let all = cells(args, &rows, books, budgets, sels)?;
    let mut table = Table::new([
        "ctx",
        "budget",
        "selector",
        "sources",
        "positions",
        "top-1 agree [95% CI]",
        "KL(dense||sparse) [95% CI]",
        "ppl [95% CI]",
        "dense ppl",
        "KV read: selected",
        "KV read: estimation",
        "KV read: total",
        "accept len [95% CI]",
        "iterations",
        "accept / dense [95% CI]",
        "select ms / verification",
    ])
    .with_title(format!(
        "Fidelity of sparse verification vs dense ({} teacher-forced windows of gamma + 1 = {} tokens per source; acceptance: greedy run of {} tokens per source; top-1: Wilson interval over positions; KL, ppl: bootstrap over windows; acceptance: bootstrap over iterations; the store's rows ran {})",
        args.rows.windows,
        args.rows.gamma + 1,
        args.spec_tokens,
        crate::report::devices_note(rows.values().map(|r| r.device.as_str()))
    ))
    .with_precision(4);
    let show = |e: Option<Est>, d: usize| Cell::from(e.map(|e| e.show(d)).unwrap_or_default());
    for c in &all {
        let ratio = dense_of(&all, c).and_then(|d| accept_ratio(c, d));
        table
            .push_row([
                Cell::from(c.ctx.to_string()),
                Cell::from(format!("{} ({})", c.budget_label, c.budget)),
                Cell::from(c.selector.clone()),
                Cell::from(c.sources.to_string()),
                Cell::from(c.positions.to_string()),
                show(Some(c.top1), 4),
                show(Some(c.kl), 4),
                show(Some(c.ppl), 3),
                Cell::from(c.dense_ppl),
                Cell::from(c.kv_selected),
                Cell::from(c.kv_estimation),
                Cell::from(c.kv_total),
                show(c.accept_len, 3),
                Cell::from(c.iterations.to_string()),
                show(ratio, 3),
                Cell::from(format!("{:.1}", c.select_ms)),
            ])
            .map_err(uerr)?;
    }
    let equal = equal_reads_table(&all).map_err(uerr)?;
    for &n in args
        .rows
        .ctx
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
    {
        let of_ctx: Vec<&Summary> = all.iter().filter(|c| c.ctx == n).collect();
        let series = |y: fn(&Summary) -> f64, x: fn(&Summary) -> f64| {
            sels.iter()
                .map(|s| {
                    let mut pts: Vec<(f64, f64)> = of_ctx
                        .iter()
                        .filter(|c| c.selector == s.label)
                        .map(|c| (x(c), y(c)))
                        .collect();
                    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                    (s.label.clone(), pts)
                })
                .collect::<Vec<_>>()
        };
        plot_lines(
            args.out.join(format!("fidelity_ctx{n}.svg")),
            &format!("Top-1 agreement with dense verification, context {n}"),
            "budget / context",
            "top-1 agreement",
            &series(|c| c.top1.value, |c| c.budget as f64 / c.ctx as f64),
        )
        .map_err(uerr)?;
        plot_lines(
            args.out.join(format!("fidelity_reads_ctx{n}.svg")),
            &format!("KL(dense || sparse) against total KV read, context {n}"),
            "KV read: selected + estimation (fraction of dense)",
            "KL (nats)",
            &series(|c| c.kl.value, |c| c.kv_total),
        )
        .map_err(uerr)?;
    }
    let mut md = table.to_markdown();
    if let Some(eq) = &equal {
        md.push_str("\n\n");
        md.push_str(&eq.to_markdown());
    }
    let io = |source| HarnessError::Io {
        path: args.out.join("fidelity.md").display().to_string(),
        source,
    };
    std::fs::write(args.out.join("fidelity.md"), &md).map_err(io)?;
    let json = serde_json::to_string_pretty(&all)
        .map_err(|e| HarnessError::Usage(format!("fidelity.json: {e}")))?;
    std::fs::write(args.out.join("fidelity.json"), json).map_err(|source| HarnessError::Io {
        path: args.out.join("fidelity.json").display().to_string(),
        source,
    })?;
    per_source(args, &rows, sels)?;
    crate::harness::print_line(&md);
    crate::harness::print_line(&format!(
        "wrote {}",
        [
            "fidelity.md",
            "fidelity.json",
            "per_book.md",
            "results.jsonl"
        ]
        .iter()
        .map(|f| args.out.join(f).display().to_string())
        .chain(args.rows.ctx.iter().flat_map(|n| {
            [
                format!("fidelity_ctx{n}.svg"),
                format!("fidelity_reads_ctx{n}.svg"),
            ]
            .map(|f| args.out.join(f).display().to_string())
        }))
        .collect::<Vec<_>>()
        .join(", ")
    ));
    Ok(())
}

/// The equal-reads table: per context, the total KV read of [`EQUAL_READS_REFERENCE`] at the
/// smallest budget run, and every selector's top-1 agreement and KL interpolated at that
/// total between the two budgets that bracket it (docs/decisions.md, "Evaluation"). `None`
/// when the reference selector was not run.
fn equal_reads_table(all: &[Summary]) -> Result<Option<Table>, crate::EvalError> {
    let mut t = Table::new([
        "ctx",
        "total KV read",
        "selector",
        "between budgets",
        "top-1 agree [95% CI]",
        "KL(dense||sparse) [95% CI]",
    ])
    .with_title(format!(
        "At equal total reads: every selector at the total KV read (selected + estimation) of `{EQUAL_READS_REFERENCE}` at its smallest budget, a cell within 1% of it taken as it is, else interpolated linearly in the total read between the two budgets run that bracket it (interval ends interpolated alike); n/a: the level is outside the totals run"
    ));
    let mut any = false;
    let mut ctxs: Vec<usize> = all.iter().map(|c| c.ctx).collect();
    ctxs.dedup();
    for n in ctxs {
        let of_ctx: Vec<&Summary> = all.iter().filter(|c| c.ctx == n).collect();
        let Some(reference) = of_ctx
            .iter()
            .filter(|c| c.selector == EQUAL_READS_REFERENCE)
            .min_by_key(|c| c.budget)
        else {
            continue;
        };
        any = true;
        let target = reference.kv_total;
        let mut labels: Vec<&str> = Vec::new();
        for c in &of_ctx {
            if !labels.contains(&c.selector.as_str()) {
                labels.push(&c.selector);
            }
        }
        for label in labels {
            let mine: Vec<&Summary> = of_ctx
                .iter()
                .copied()
                .filter(|c| c.selector == label)
                .collect();
            let (between, top1, kl) = match at_reads(&mine, target) {
                Some(a) => (
                    if a.between.0 == a.between.1 {
                        a.between.0
                    } else {
                        format!("{} .. {}", a.between.0, a.between.1)
                    },
                    a.top1.show(4),
                    a.kl.show(4),
                ),
                None => {
                    let lo = mine
                        .iter()
                        .map(|c| c.kv_total)
                        .fold(f64::INFINITY, f64::min);
                    let hi = mine.iter().map(|c| c.kv_total).fold(0.0, f64::max);
                    (
                        format!("n/a (its totals run: {lo:.3} .. {hi:.3})"),
                        String::new(),
                        String::new(),
                    )
                }
            };
            t.push_row([
                Cell::from(n.to_string()),
                Cell::from(format!("{target:.4}")),
                Cell::from(label.to_string()),
                Cell::from(between),
                Cell::from(top1),
                Cell::from(kl),
            ])?;
        }
    }
    Ok(any.then_some(t))
}

/// `per_book.md`: one line per stored row of the selectors of `sels`.
fn per_source(
    args: &FidelityOptions,
    rows: &BTreeMap<String, Row>,
    sels: &[SelectorSpec],
) -> Result<(), HarnessError> {
    let uerr = |e: crate::EvalError| HarnessError::Usage(e.to_string());
    let mut per = Table::new([
        "source",
        "ctx",
        "budget",
        "selector",
        "positions",
        "top-1",
        "KL",
        "ppl",
        "KV total",
        "accept len",
        "iterations",
        "select ms / verification",
    ])
    .with_title("Per source")
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
            Cell::from(r.positions.to_string()),
            Cell::from(r.top1),
            Cell::from(r.kl),
            Cell::from(r.nll.exp()),
            Cell::from(r.kv_selected + r.kv_estimation),
            Cell::from(r.accept_len),
            Cell::from(r.spec_iterations.map(|i| i.to_string()).unwrap_or_default()),
            Cell::from(format!(
                "{:.1}",
                1e3 * r.secs_select / r.windows.max(1) as f64
            )),
        ])
        .map_err(uerr)?;
    }
    per.write_markdown(args.out.join("per_book.md"))
        .map_err(uerr)
}
