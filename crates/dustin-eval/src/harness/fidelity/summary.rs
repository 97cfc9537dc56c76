//! One table cell of the fidelity report from its rows (one per source): figures pooled over
//! the sources' verified positions, windows and iterations, each with a 95% interval, and the
//! interpolation of a selector's figures at a given total KV read.

use serde::Serialize;

use super::Row;
use crate::report::interval::{
    bootstrap_mean, bootstrap_ratio, bootstrap_ratio_of_means, wilson, Interval, IntervalError,
    BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, Z95,
};

/// A figure and its 95% interval (`None` where the rows lack the per-window figures).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Est {
    /// The point estimate.
    pub(crate) value: f64,
    /// Its 95% interval.
    pub(crate) ci: Option<Interval>,
}

impl Est {
    /// `value [lo, hi]` with `digits` decimals.
    pub(crate) fn show(&self, digits: usize) -> String {
        match self.ci {
            Some(i) => format!(
                "{:.d$} [{:.d$}, {:.d$}]",
                self.value,
                i.lo,
                i.hi,
                d = digits
            ),
            None => format!("{:.d$}", self.value, d = digits),
        }
    }

    fn map(self, f: impl Fn(f64) -> f64) -> Self {
        Self {
            value: f(self.value),
            ci: self.ci.map(|i| Interval {
                lo: f(i.lo),
                hi: f(i.hi),
            }),
        }
    }
}

/// One (context, budget, selector) cell: every figure pooled over its rows.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    /// Context length.
    pub(crate) ctx: usize,
    /// The budget as given (`1/16`).
    pub(crate) budget_label: String,
    /// The budget in tokens.
    pub(crate) budget: usize,
    /// The selector's label.
    pub(crate) selector: String,
    /// Sources (rows) pooled.
    pub(crate) sources: usize,
    /// Verified positions compared with dense.
    pub(crate) positions: usize,
    /// Windows.
    pub(crate) windows: usize,
    /// Top-1 agreement with dense; Wilson interval over the positions.
    pub(crate) top1: Est,
    /// Mean KL(dense || sparse) per position, nats; bootstrap over windows.
    pub(crate) kl: Est,
    /// Perplexity of the true next tokens (exp of the mean NLL); bootstrap over windows.
    pub(crate) ppl: Est,
    /// The same under dense verification.
    pub(crate) dense_ppl: f64,
    /// KV fraction read by the selection.
    pub(crate) kv_selected: f64,
    /// The estimator's own reads, same unit.
    pub(crate) kv_estimation: f64,
    /// Selected + estimation.
    pub(crate) kv_total: f64,
    /// Mean acceptance length (accepted drafts + 1 per iteration); bootstrap over iterations.
    pub(crate) accept_len: Option<Est>,
    /// Iterations of the speculative runs.
    pub(crate) iterations: usize,
    /// Per-iteration acceptance lengths, for ratios against another cell.
    #[serde(skip)]
    pub(crate) accept_samples: Vec<f64>,
    /// Milliseconds in the selector's hooks per verification (the selection work).
    pub(crate) select_ms: f64,
}

fn ierr(e: IntervalError) -> String {
    e.to_string()
}

/// The cell of `rows` (one per source, all of one context, budget and selector; not empty).
///
/// # Errors
/// A message when an interval cannot be computed (rows without positions).
pub(crate) fn summarize(rows: &[&Row]) -> Result<Summary, String> {
    let first = rows.first().ok_or("no rows")?;
    let positions: usize = rows.iter().map(|r| r.positions).sum();
    let windows: usize = rows.iter().map(|r| r.windows).sum();
    let g1 = (first.gamma + 1) as f64;
    let per_window = rows.iter().all(|r| r.win_kl.len() == r.windows);
    let mean = |f: fn(&Row) -> f64| {
        rows.iter().map(|r| f(r) * r.positions as f64).sum::<f64>() / positions.max(1) as f64
    };
    let top1_v = mean(|r| r.top1);
    let kl_v = mean(|r| r.kl);
    let nll_v = mean(|r| r.nll);
    let (top1, kl, nll) = if per_window {
        let agree: usize = rows.iter().flat_map(|r| r.win_agree.iter()).sum();
        let kls: Vec<(f64, f64)> = rows
            .iter()
            .flat_map(|r| r.win_kl.iter().map(|&k| (k, g1)))
            .collect();
        let nlls: Vec<(f64, f64)> = rows
            .iter()
            .flat_map(|r| r.win_nll.iter().map(|&k| (k, g1)))
            .collect();
        let boot = |g: &[(f64, f64)]| {
            bootstrap_ratio(g, BOOTSTRAP_RESAMPLES, 0.95, BOOTSTRAP_SEED).map_err(ierr)
        };
        (
            Est {
                value: agree as f64 / positions as f64,
                ci: Some(wilson(agree, positions, Z95).map_err(ierr)?),
            },
            Est {
                value: kl_v,
                ci: Some(boot(&kls)?),
            },
            Est {
                value: nll_v,
                ci: Some(boot(&nlls)?),
            },
        )
    } else {
        let plain = |value| Est { value, ci: None };
        (plain(top1_v), plain(kl_v), plain(nll_v))
    };
    let accept_samples: Vec<f64> = rows
        .iter()
        .flat_map(|r| r.spec_accepted.iter().map(|&a| (a + 1) as f64))
        .collect();
    let spec_rows: Vec<&&Row> = rows.iter().filter(|r| r.accept_len.is_some()).collect();
    let iterations: usize = spec_rows.iter().filter_map(|r| r.spec_iterations).sum();
    let accept_len = if !accept_samples.is_empty() {
        Some(Est {
            value: accept_samples.iter().sum::<f64>() / accept_samples.len() as f64,
            ci: Some(
                bootstrap_mean(&accept_samples, BOOTSTRAP_RESAMPLES, 0.95, BOOTSTRAP_SEED)
                    .map_err(ierr)?,
            ),
        })
    } else if !spec_rows.is_empty() {
        let v = spec_rows.iter().filter_map(|r| r.accept_len).sum::<f64>() / spec_rows.len() as f64;
        Some(Est { value: v, ci: None })
    } else {
        None
    };
    let kv_selected = mean(|r| r.kv_selected);
    let kv_estimation = mean(|r| r.kv_estimation);
    Ok(Summary {
        ctx: first.ctx,
        budget_label: first.budget_label.clone(),
        budget: first.budget,
        selector: first.selector.clone(),
        sources: rows.len(),
        positions,
        windows,
        top1,
        kl,
        ppl: nll.map(f64::exp),
        dense_ppl: mean(|r| r.dense_nll).exp(),
        kv_selected,
        kv_estimation,
        kv_total: kv_selected + kv_estimation,
        accept_len,
        iterations,
        accept_samples,
        select_ms: 1e3 * rows.iter().map(|r| r.secs_select).sum::<f64>() / windows.max(1) as f64,
    })
}

/// `s`'s mean acceptance length over `dense`'s, with a bootstrap interval resampling the
/// iterations of each on their own (the two speculative runs are independent): `None` when
/// either lacks per-iteration lengths.
pub(crate) fn accept_ratio(s: &Summary, dense: &Summary) -> Option<Est> {
    if s.accept_samples.is_empty() || dense.accept_samples.is_empty() {
        return None;
    }
    let m = |x: &[f64]| x.iter().sum::<f64>() / x.len() as f64;
    let ci = bootstrap_ratio_of_means(
        &s.accept_samples,
        &dense.accept_samples,
        BOOTSTRAP_RESAMPLES,
        0.95,
        BOOTSTRAP_SEED,
    )
    .ok();
    Some(Est {
        value: m(&s.accept_samples) / m(&dense.accept_samples),
        ci,
    })
}

/// A selector's figures at total KV read `target`: those of a cell within 1% of it, else
/// interpolated linearly in the total read between the two budgets run that bracket it (the
/// interval ends interpolated the same way).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AtReads {
    /// The selector.
    pub(crate) selector: String,
    /// The budgets (labels) that bracket the target, lower total first.
    pub(crate) between: (String, String),
    /// Top-1 agreement at the target.
    pub(crate) top1: Est,
    /// KL at the target.
    pub(crate) kl: Est,
}

/// Linear interpolation of `a` (at `xa`) and `b` (at `xb`) at `x`.
fn lerp(xa: f64, a: f64, xb: f64, b: f64, x: f64) -> f64 {
    if (xb - xa).abs() < 1e-12 {
        return a;
    }
    a + (b - a) * (x - xa) / (xb - xa)
}

fn lerp_est(xa: f64, a: &Est, xb: f64, b: &Est, x: f64) -> Est {
    Est {
        value: lerp(xa, a.value, xb, b.value, x),
        ci: match (a.ci, b.ci) {
            (Some(i), Some(j)) => Some(Interval {
                lo: lerp(xa, i.lo, xb, j.lo, x),
                hi: lerp(xa, i.hi, xb, j.hi, x),
            }),
            _ => None,
        },
    }
}

/// `cells` (one selector's cells of one context, any order) at total read `target`: `None`
/// when `target` is outside the range of totals run (no extrapolation).
pub(crate) fn at_reads(cells: &[&Summary], target: f64) -> Option<AtReads> {
    let mut c: Vec<&&Summary> = cells.iter().collect();
    c.sort_by(|a, b| a.kv_total.total_cmp(&b.kv_total));
    // a cell within 1% of the level is at it (totals of one budget differ by a few selected
    // positions between selectors)
    let tol = 0.01 * target.abs();
    let i = c
        .iter()
        .filter(|s| (s.kv_total - target).abs() <= tol)
        .min_by(|a, b| {
            (a.kv_total - target)
                .abs()
                .total_cmp(&(b.kv_total - target).abs())
        })
        .map(|s| (*s, *s))
        .or_else(|| {
            c.windows(2)
                .position(|w| w[0].kv_total <= target && target <= w[1].kv_total)
                .map(|i| (c[i], c[i + 1]))
        })?;
    let (a, b) = i;
    let (xa, xb) = (a.kv_total, b.kv_total);
    Some(AtReads {
        selector: a.selector.clone(),
        between: (a.budget_label.clone(), b.budget_label.clone()),
        top1: lerp_est(xa, &a.top1, xb, &b.top1, target),
        kl: lerp_est(xa, &a.kl, xb, &b.kl, target),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(book: &str, budget: usize, win_agree: Vec<usize>, kv_est: f64, spec: Vec<usize>) -> Row {
        let windows = win_agree.len();
        let positions = windows * 5;
        let agree: usize = win_agree.iter().sum();
        Row {
            book: book.into(),
            ctx: 4096,
            prompt_tokens: 4000,
            budget,
            budget_label: format!("{budget}"),
            selector: "s".into(),
            spec: "s".into(),
            windows,
            gamma: 4,
            positions,
            top1: agree as f64 / positions as f64,
            kl: 0.1,
            nll: 2.0,
            dense_nll: 1.9,
            kv_selected: budget as f64 / 4096.0,
            kv_estimation: kv_est,
            accept_len: (!spec.is_empty())
                .then(|| spec.iter().map(|&a| (a + 1) as f64).sum::<f64>() / spec.len() as f64),
            spec_iterations: Some(spec.len()),
            secs_windows: 1.0,
            secs_spec: 1.0,
            secs_spec_draft: 0.5,
            secs_spec_verify: 0.5,
            secs_select: 0.01 * windows as f64,
            win_agree,
            win_kl: vec![0.5; windows],
            win_nll: vec![10.0; windows],
            spec_accepted: spec,
            device: String::new(),
        }
    }

    /// Two sources of 48 windows (480 positions, 450 agreeing): the pooled top-1 and its
    /// Wilson interval (Python float64, see `report::interval`'s tests: 0.91218 .. 0.95587),
    /// constant per-window KL and NLL give point intervals, the acceptance length pools the
    /// iterations ((2 + 4 + 1 + 3) / 4 = 2.5), the selection work is 10 ms per window.
    #[test]
    fn a_cell_pools_its_sources() {
        let a: Vec<usize> = (0..48).map(|i| if i < 18 { 4 } else { 5 }).collect();
        let b: Vec<usize> = (0..48).map(|i| if i < 12 { 4 } else { 5 }).collect();
        let (r1, r2) = (
            row("x", 256, a, 0.2, vec![1, 3]),
            row("y", 256, b, 0.2, vec![0, 2]),
        );
        let s = summarize(&[&r1, &r2]).unwrap();
        assert_eq!(
            (s.positions, s.windows, s.sources, s.iterations),
            (480, 96, 2, 4)
        );
        assert!((s.top1.value - 450.0 / 480.0).abs() < 1e-15);
        let ci = s.top1.ci.unwrap();
        assert!((ci.lo - 0.912_179_949_032_467_8).abs() < 1e-12);
        assert!((ci.hi - 0.955_872_989_266_163_9).abs() < 1e-12);
        let kl = s.kl.ci.unwrap();
        assert!((s.kl.value - 0.1).abs() < 1e-12 && (kl.lo - 0.1).abs() < 1e-12);
        assert!((s.ppl.value - 2f64.exp()).abs() < 1e-9);
        let acc = s.accept_len.unwrap();
        assert_eq!(acc.value, 2.5);
        assert!((s.select_ms - 10.0).abs() < 1e-9);
        assert!((s.kv_total - (256.0 / 4096.0 + 0.2)).abs() < 1e-12);
    }

    /// Interpolation at a total read: budgets 256 (total 0.0625 + e) and 512 (0.125 + e),
    /// top-1 0.8 and 0.9 (all windows 4 of 5 agreeing vs 9 of 10 half and half): halfway in
    /// total read gives 0.85; a total outside the range run is n/a.
    #[test]
    fn equal_reads_interpolate_between_the_bracketing_budgets() {
        let lo = summarize(&[&row("x", 256, vec![4; 10], 0.0, vec![])]).unwrap();
        let hi = summarize(&[&row("x", 512, [4, 5].repeat(5), 0.0, vec![])]).unwrap();
        assert!((lo.top1.value - 0.8).abs() < 1e-12 && (hi.top1.value - 0.9).abs() < 1e-12);
        let mid = (0.0625 + 0.125) / 2.0;
        let a = at_reads(&[&hi, &lo], mid).unwrap();
        assert!((a.top1.value - 0.85).abs() < 1e-12, "{}", a.top1.value);
        assert_eq!(a.between, ("256".to_string(), "512".to_string()));
        let (i, j, k) = (lo.top1.ci.unwrap(), hi.top1.ci.unwrap(), a.top1.ci.unwrap());
        assert!((k.lo - (i.lo + j.lo) / 2.0).abs() < 1e-12);
        assert!(at_reads(&[&hi, &lo], 0.2).is_none());
        assert!(at_reads(&[&hi, &lo], 0.03).is_none());
        let at = at_reads(&[&hi, &lo], 0.0625 * 1.005).unwrap();
        assert_eq!(at.between, ("256".to_string(), "256".to_string()));
        assert_eq!(at.top1.value, lo.top1.value);
    }
}
