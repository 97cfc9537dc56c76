//! PG-19 perplexity (`dustin eval pg19`): perplexity of PG-19 continuations when the target
//! reads only its selection, a front end over the fidelity harness.
//!
//! The rows are the fidelity harness's (`compute_rows`): per book and context `N`, the
//! first `N - (W (gamma + 1) + 1)` tokens are the prompt, prefilled densely once and shown to
//! every selector as its prefill observation; then `W` teacher-forced verification windows of
//! `gamma + 1` book tokens are verified through each selector, as a verification step would
//! (the draft's lookahead included), and the negative log-likelihood of each window's true
//! next tokens is summed. Perplexity = exp(mean NLL) over all windows of all books. No
//! speculative run (no acceptance length): only the perplexity is reported, against dense.

use std::collections::BTreeMap;
use std::path::PathBuf;

use dustin_kernels::KernelOps;

use super::fidelity::{compute_rows, row_key, Agg, Computed, FidelityOptions, Row, WindowFlags};
use super::{HarnessError, ModelFlags, ModelHost};
use crate::report::{plot_lines, Cell, Table};

/// The options of a PG-19 perplexity run (the flags of `dustin eval pg19`).
#[derive(Debug, Clone)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Pg19Options {
    /// `--model` and `--draft`.
    #[cfg_attr(feature = "clap", command(flatten))]
    pub models: ModelFlags,
    /// Draft layers whose attention makes the lookahead, as `eval fidelity
    /// --lookahead-layers` (the same default, so that either command reads the other's
    /// stored rows).
    #[cfg_attr(feature = "clap", arg(long, default_value = "half"))]
    pub lookahead_layers: String,
    /// A PG-19 book (.txt) or a directory of them.
    #[cfg_attr(feature = "clap", arg(long, default_value = "../shared/data/pg19"))]
    pub data: PathBuf,
    /// `--books`, `--ctx`, `--budget`, `--knobs`, `--select`, `--windows` and `--gamma`.
    #[cfg_attr(feature = "clap", command(flatten))]
    pub rows: WindowFlags,
    /// Selectors (comma-separated registry names, `pyramid(<name>)`, or `label=<name>`).
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            default_value = "dense,streaming,h2o,snapkv,quest,oracle,dustin"
        )
    )]
    pub selectors: Vec<String>,
    /// Tokens of a speculative run per row that measures the acceptance length (0: none,
    /// the default). Rows are keyed by it, so `--spec-tokens 8 --out out/fidelity` reads the
    /// rows an `eval fidelity --spec-tokens 8` run stored there instead of recomputing them.
    #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
    pub spec_tokens: usize,
    /// Output folder (results.jsonl, pg19.md, pg19.json, `pg19_ctx<N>.svg`).
    #[cfg_attr(feature = "clap", arg(long, default_value = "out/pg19"))]
    pub out: PathBuf,
}

impl Pg19Options {
    /// The fidelity run that computes the rows (a speculative run only with `--spec-tokens`).
    pub fn fidelity_options(&self) -> FidelityOptions {
        FidelityOptions {
            models: self.models.clone(),
            lookahead_layers: self.lookahead_layers.clone(),
            data: self.data.clone(),
            rows: self.rows.clone(),
            selectors: self.selectors.clone(),
            spec_tokens: self.spec_tokens,
            out: self.out.clone(),
        }
    }
}

/// Runs `dustin eval pg19`: the fidelity rows of [`Pg19Options::fidelity_options`] that the
/// results store of `args.out` lacks, then `pg19.md`, `pg19.json` and one `pg19_ctx<N>.svg`
/// per context (perplexity over dense perplexity against the budget fraction); prints the
/// table.
///
/// # Errors
/// [`HarnessError::Usage`] for a context of 0, missing data and the fidelity harness's bad
/// options; the host's, model, engine and I/O errors.
pub fn run<B: KernelOps, H: ModelHost>(
    args: &Pg19Options,
    dev: &B::Device,
    host: &H,
) -> Result<(), HarnessError> {
    if args.rows.ctx.contains(&0) {
        return Err(HarnessError::Usage(
            "--ctx 0: expected a positive context".into(),
        ));
    }
    if !args.data.exists() {
        return Err(HarnessError::Usage(format!(
            "--data {}: no such file or directory (a PG-19 book .txt or a folder of them)",
            args.data.display()
        )));
    }
    let fa = args.fidelity_options();
    let c = compute_rows::<B, H>(&fa, dev, host, "pg19")?;
    let table = ppl_table(&fa, &c)?;
    let uerr = |e: crate::EvalError| HarnessError::Usage(e.to_string());
    table
        .write_markdown(args.out.join("pg19.md"))
        .map_err(uerr)?;
    table.write_json(args.out.join("pg19.json")).map_err(uerr)?;
    let mut ctxs = args.rows.ctx.clone();
    ctxs.sort_unstable();
    ctxs.dedup();
    let mut written = vec![
        args.out.join("pg19.md"),
        args.out.join("pg19.json"),
        args.out.join("results.jsonl"),
    ];
    for &n in &ctxs {
        let path = args.out.join(format!("pg19_ctx{n}.svg"));
        plot_lines(
            &path,
            &format!("Perplexity / dense perplexity, context {n}"),
            "budget / context",
            "ppl / dense ppl",
            &ratio_series(&table, n),
        )
        .map_err(uerr)?;
        written.push(path);
    }
    crate::harness::print_line(&table.to_markdown());
    crate::harness::print_line(&format!(
        "wrote {}",
        written
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    Ok(())
}

/// The perplexity table: one row per (context, budget, selector) over the books.
fn ppl_table(fa: &FidelityOptions, c: &Computed) -> Result<Table, HarnessError> {
    let uerr = |e: crate::EvalError| HarnessError::Usage(e.to_string());
    let (records, _warnings) = c.store.records::<Row>().map_err(uerr)?;
    let rows: BTreeMap<String, Row> = records.into_iter().collect();
    let mut table = Table::new([
        "ctx",
        "budget",
        "selector",
        "budget / ctx",
        "books",
        "tokens scored",
        "ppl",
        "dense ppl",
        "ppl / dense",
        "KV read",
    ])
    .with_title(format!(
        "PG-19 perplexity when the target reads only its selection ({} teacher-forced windows of gamma + 1 = {} tokens per book; the store's rows ran {})",
        fa.rows.windows,
        fa.rows.gamma + 1,
        crate::report::devices_note(rows.values().map(|r| r.device.as_str()))
    ))
    .with_precision(4);
    let mut ctxs = fa.rows.ctx.clone();
    ctxs.sort_unstable();
    ctxs.dedup();
    for &n in &ctxs {
        for (bl, bs) in &c.budgets {
            let budget = bs.tokens(n);
            for s in &c.sels {
                let mut agg = Agg::default();
                let mut positions = 0usize;
                for b in &c.books {
                    if let Some(r) = rows.get(&row_key(&b.id, n, budget, s, fa)?) {
                        agg.add(r);
                        positions += r.positions;
                    }
                }
                if agg.n == 0 {
                    continue;
                }
                let ppl = agg.mean(agg.nll).exp();
                let dense = agg.mean(agg.dense_nll).exp();
                table
                    .push_row([
                        Cell::from(n.to_string()),
                        Cell::from(format!("{bl} ({budget})")),
                        Cell::from(s.label.clone()),
                        Cell::from(budget as f64 / n as f64),
                        Cell::from(agg.n.to_string()),
                        Cell::from(positions.to_string()),
                        Cell::from(ppl),
                        Cell::from(dense),
                        Cell::from(ppl / dense),
                        Cell::from(agg.mean(agg.kv_sel + agg.kv_est)),
                    ])
                    .map_err(uerr)?;
            }
        }
    }
    Ok(table)
}

/// The ratio column of `table` at context `n`, one series per selector, against the budget
/// fraction.
fn ratio_series(table: &Table, n: usize) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let num = |c: &Cell| match c {
        Cell::Num(x) => Some(*x),
        _ => None,
    };
    let col = |name: &str| table.column(name).map(|c| c.cloned().collect::<Vec<_>>());
    let (Some(ctx), Some(sel), Some(frac), Some(ratio)) = (
        col("ctx"),
        col("selector"),
        col("budget / ctx"),
        col("ppl / dense"),
    ) else {
        return series;
    };
    for i in 0..ctx.len() {
        if ctx[i] != Cell::Text(n.to_string()) {
            continue;
        }
        let (Cell::Text(label), Some(x), Some(y)) = (&sel[i], num(&frac[i]), num(&ratio[i])) else {
            continue;
        };
        match series.iter_mut().find(|s| &s.0 == label) {
            Some(s) => s.1.push((x, y)),
            None => series.push((label.clone(), vec![(x, y)])),
        }
    }
    for (_, pts) in series.iter_mut() {
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    series
}
